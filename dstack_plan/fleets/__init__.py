"""Fleets: the machines runs go to. SSH fleets list their hosts; cloud fleets create
machines from offers and then join them as SSH hosts.

- `handler`: `FleetKinds`, the fleet kind's handler, handing each fleet to `ssh` or `cloud`
- `records`, `cloud_records`: the typed view of a fleet's state entry (hosts, instances)
- `machines`: `FleetMachines`, every fleet's machines and their agents
- `load`, `host_load`: what the machines hold now (the scheduler's candidates)
- `host_status`: a host's status (`idle`, `busy`, `unreachable`, ...) from its jobs
- `claims`: who owns an SSH host; `probe`, `apply_probe`: links between hosts
- `offers`, `plan_offers`: which cloud offers a fleet's new machines come from
- `idle`: how long a cloud machine may stay idle
"""
