"""Volumes: network disks a provider creates; runs mount them (`runs/volume_mounts.py`).

- `handler`: `VolumeHandler`; `records`: the provider's view of a volume in state
"""
