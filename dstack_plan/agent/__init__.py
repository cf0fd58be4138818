"""The host agent: a daemon on every machine that runs jobs, and the controller's client for it.

Daemon-side modules (everything here except `client`, `api_models` and `build`) use only the
standard library and, lazily, the docker SDK, so the daemon runs alone on a host with python3.
This package file imports nothing, so importing the client does not load the daemon and
vice versa.
"""
