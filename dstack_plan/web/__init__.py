"""The read-only HTTP API (and the web UI) that `dstack watch --ui` and `dstack ui` serve.

- `models.py`: the API's own models (the others are those `--json` prints);
- `history.py`: the bounded in-memory ring of watch's metrics samples;
- `source.py`: what the routes read (state, agents, the event log, the ring), nothing written;
- `logs.py`: a job's log as lines, and followed as server-sent events;
- `app.py`: the routes; `openapi.py`: their OpenAPI document; `auth.py`: the token rule;
- `routing.py`: what handlers and pages share (the source, query parameters, `Route`);
- `server.py`: listening and stopping;
- `pages.py`: the UI's pages (Jinja2 `templates/`, `static/` with vendored htmx and uPlot,
  see `static/VENDORED.md`), over the same source; `wording.py`: runs and jobs in words, the
  same on the pages and in `dstack ps`.

Nothing here imports at `dstack --help` time: the CLI imports it inside its commands.
"""
