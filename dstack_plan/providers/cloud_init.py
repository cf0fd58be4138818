"""What a cloud machine runs at first boot, the same on every provider.

The agent is installed over SSH afterwards, exactly as on an SSH fleet's host
(`providers/ssh/install.py`), so first boot only makes sure Docker runs.
"""

STARTUP_SCRIPT = """#!/bin/bash
# The dstack-plan agent is installed over SSH afterwards; only docker is needed here.
if ! command -v docker >/dev/null; then curl -fsSL https://get.docker.com | sh; fi
systemctl enable --now docker
"""
"""A shell script for EC2 user data, a GCP `startup-script` and Azure custom data."""
