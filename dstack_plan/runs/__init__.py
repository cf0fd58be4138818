"""Runs (tasks, services, dev environments): placed on a fleet's machines, submitted to
their agents as jobs, recorded in state.

- `handler`: `RunHandler`, the run kind's create/update/refresh/delete; `dev_ssh` adds the
  dev environment's SSH entry (`ssh_config`)
- `records`: `RunRecord`, `JobRecord`: the typed view of a run's state entry (what `ps`,
  `logs`, `watch` and the UI read)
- placement: `plan_placement` (at plan time), `placing` (the scheduler's inputs), `bursting`
  (to a cloud fleet), `queueing` (pending and scheduled runs), `schedule` (cron)
- jobs: `jobs` (a run's spec as agent jobs), `submission`, `ownership` (which jobs are ours),
  `health`, `gang` (multi-node tasks live and end together)
- services: `scaling`, `rollout`, `rollout_jobs`, `rollout_record`
- quotas: `usage`, `quota_gate`, `user`
- code: `code_sources`, `code_archive`, `code_upload` (`files:` and `repos:`)
- volumes in runs: `volume_mounts`, `volume_attach`
"""
