"""Pack the agent daemon into one self-contained zipapp to copy to a host.

`python -m dstack_plan.agent.build OUT.pyz [--wheels DIR] [--no-docker]`

The archive holds the daemon-side modules (never the client or its pydantic models), a stub
`dstack_plan` package, and the pure-Python docker SDK with its dependencies (requests, urllib3,
idna, certifi, charset_normalizer without its compiled speed-ups). Vendored packages come from
this interpreter's environment, or from wheels in `--wheels DIR` (to target older pythons:
`pip download --only-binary=:all: --python-version 3.9 docker -d DIR`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import zipapp
import zipfile
from pathlib import Path

from dstack_plan.agent.protocol import AGENT_VERSION

AGENT_DIR = Path(__file__).resolve().parent
CONTROLLER_ONLY = frozenset({"client.py", "http.py", "api_models.py", "build.py"})
VENDORED = ("docker", "requests", "urllib3", "idna", "certifi", "charset_normalizer")
_SKIP_SUFFIXES = (".so", ".pyd", ".pyc", ".pyi")

_MAIN = """\
import sys

if sys.version_info < (3, 9):
    sys.exit("the dstack-plan agent needs python >= 3.9, this is " + sys.version.split()[0])

from dstack_plan.agent.main import main

sys.exit(main())
"""


class BuildError(Exception):
    """The bundle could not be built (a vendored package is missing...)."""


def daemon_files() -> list[Path]:
    """The agent's daemon-side source files, relative to the agent package."""
    return sorted(
        path.relative_to(AGENT_DIR)
        for path in AGENT_DIR.rglob("*.py")
        if "__pycache__" not in path.parts and path.name not in CONTROLLER_ONLY
    )


def _copy_tree(source: Path, target: Path) -> None:
    for path in source.rglob("*"):
        parts = path.relative_to(source).parts
        if path.is_dir() or "__pycache__" in parts or "tests" in parts:
            continue
        if path.name.endswith(_SKIP_SUFFIXES):
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)


def _vendor_installed(name: str, staging: Path) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"package {name} is not installed; install it or pass --wheels")
    _copy_tree(Path(next(iter(spec.submodule_search_locations))), staging / name)
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version(name)
    except Exception:
        return "unknown"


def _vendor_wheel(name: str, wheels: Path, staging: Path) -> str:
    candidates = sorted(wheels.glob(f"{name}-*.whl")) or sorted(
        wheels.glob(f"{name.replace('_', '-')}-*.whl")
    )
    if not candidates:
        raise BuildError(f"no wheel for {name} in {wheels}")
    wheel = candidates[-1]
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if (
                member.startswith(f"{name}/")
                and not member.endswith(("/", *_SKIP_SUFFIXES))
                and "/tests/" not in member
            ):
                dest = staging / member
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(archive.read(member))
    return wheel.name.split("-")[1]


def build_zipapp(
    out: Path | str,
    *,
    include_docker: bool = True,
    wheels: Path | str | None = None,
    interpreter: str = "/usr/bin/env python3",
) -> Path:
    """Write the agent zipapp to `out` and return its path; it runs as `python3 OUT serve ...`."""
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="dstack-agent-build-") as tmp:
        staging = Path(tmp)
        package = staging / "dstack_plan"
        (package / "agent").mkdir(parents=True)
        (package / "__init__.py").write_text(
            f'"""dstack-plan agent bundle."""\n\n__version__ = "{AGENT_VERSION}"\n'
        )
        for relative in daemon_files():
            dest = package / "agent" / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(AGENT_DIR / relative, dest)
        (staging / "__main__.py").write_text(_MAIN)
        versions = {}
        if include_docker:
            for name in VENDORED:
                if wheels is not None:
                    versions[name] = _vendor_wheel(name, Path(wheels), staging)
                else:
                    versions[name] = _vendor_installed(name, staging)
        (staging / "BUNDLE.json").write_text(
            json.dumps({"agent_version": AGENT_VERSION, "vendored": versions}, indent=2) + "\n"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        zipapp.create_archive(staging, out, interpreter=interpreter, compressed=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: build the zipapp."""
    parser = argparse.ArgumentParser(prog="python -m dstack_plan.agent.build")
    parser.add_argument("out", type=Path, help="where to write the .pyz")
    parser.add_argument("--wheels", type=Path, help="vendor from wheels in this dir")
    parser.add_argument(
        "--no-docker", action="store_true", help="leave out the docker SDK (process runtime only)"
    )
    args = parser.parse_args(argv)
    try:
        path = build_zipapp(args.out, include_docker=not args.no_docker, wheels=args.wheels)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
