"""The `ssh` provider: on-prem hosts reached with asyncssh, with pinned host keys and pre-flight.

asyncssh is imported only inside this package, so `dstack plan` on a local project never pays
for it (tests/e2e/test_cli_imports.py guards that).
"""
