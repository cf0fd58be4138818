"""Looking at and acting on what exists: runs, logs, stops, state entries, the graph.

The logic behind `dstack ps | logs | stop | state | graph | init` and `apply --attach`,
callable from Python. One module per concern; import from the module:

- `runs`: `list_runs(project)` -> `RunView`s refreshed from agents; `find_run(state, ref)`
- `logs`: `write_logs(project, ref, out, ...)`, `parse_since`, `select_job`
- `stop`: `stop_run(project, ref, abort=...)` -> `StopResult`
- `stream`: `stream_runs(project, runs, out, stop)` -> `AttachResult`, `LinePrefixer`
- `state_ops`: `show_resource`, `forget`, `pull`
- `graph`: `project_dot(project)`, `state_edges(state)`
- `workspace`: `init_workspace(directory)`
"""
