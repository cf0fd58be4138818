"""The names of the providers a fleet's machines come from, and how they group.

Kept apart from the providers themselves (and without imports) so the plan, watch and the read
commands can tell fleets apart without loading any provider.
"""

from __future__ import annotations

SSH = "ssh"
"""On-prem hosts listed in `ssh_config`."""
CLOUDS = frozenset({"aws", "gcp", "azure"})
"""The backend types of `.dstack/backends.yml` that create machines: the clouds."""
ANY_CLOUD = "cloud"
"""The provider of a fleet with `nodes` and no single `backends` entry: any configured cloud."""
SLURM = "slurm"
"""A Slurm cluster reached through its login node (`providers/slurm/`)."""
KUBERNETES = "kubernetes"
"""A Kubernetes cluster reached through a kubeconfig context; runs are pods
(`providers/kubernetes/`)."""
ENGINES = frozenset({SLURM, KUBERNETES})
"""Backends whose own scheduler runs the jobs (Slurm's, Kubernetes'): a fleet of one is
capacity on a cluster, with no machines of ours and no agent."""
HOST_FLEET_PROVIDERS = frozenset({SSH, ANY_CLOUD, *CLOUDS})
"""Fleets whose machines are hosts reached over SSH, each running the agent: SSH fleets, and
cloud fleets once their machines have booted."""
