"""Projects sharing fleets: the owner's exports (`exports.py`), the importer's list of other
projects (`projects_file.py`, `.dstack/projects.yml`), and resolving `owner/fleet` against the
owner's state, read-only (`imports.py`). See docs/sharing.md."""
