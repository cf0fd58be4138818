"""Policy checks on plans: rules in CEL over the JSON plan (docs/policies.md).

Nothing here is imported by a command unless the project has a policy file or `--policy`
is given, so the CEL library costs nothing to projects without policies.
"""
