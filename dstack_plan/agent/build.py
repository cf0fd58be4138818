"""Pack the agent daemon into one self-contained zipapp to copy to a host.

`python -m dstack_plan.agent.build OUT.pyz [--wheels DIR] [--no-docker]`

The archive holds the daemon-side modules (never the client or its pydantic models), a stub
`dstack_plan` package, and the pure-Python docker SDK with its dependencies (requests, urllib3,
idna, certifi, charset_normalizer without its compiled speed-ups). Vendored packages come from
this interpreter's environment, or from wheels in `--wheels DIR` (to target older pythons:
`pip download --only-binary=:all: --python-version 3.9 docker -d DIR`).

Builds are reproducible: the same sources give the same bytes (entries sorted, no file times),
so a host that has a build is recognised by its sha256. Each module also goes in compiled for
this interpreter (an unchecked hash-based `.pyc` beside the `.py`): a zipapp cannot cache
bytecode, and compiling the agent and the docker SDK on every start costs a host more CPU than
the rest of the start. A host whose python3 is another version ignores the `.pyc` files (their
magic number differs) and compiles the sources, as without them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dstack_plan.agent.protocol import AGENT_VERSION

AGENT_DIR = Path(__file__).resolve().parent
CONTROLLER_ONLY = frozenset({"client.py", "http.py", "api_models.py", "build.py"})
VENDORED = ("docker", "requests", "urllib3", "idna", "certifi", "charset_normalizer")
_SKIP_SUFFIXES = (".so", ".pyd", ".pyc", ".pyi")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # zip's epoch: no build time gets into the archive

_MAIN = """\
import sys

if sys.version_info < (3, 9):
    sys.exit("the dstack-plan agent needs python >= 3.9, this is " + sys.version.split()[0])

from dstack_plan.agent.main import main

sys.exit(main())
"""

# Run in a fresh interpreter: marshal's output depends on the reference counts of the objects
# it writes, so compiling inside a busy process (the CLI, pytest) gives other bytes each time.
_COMPILE = """\
import py_compile, sys
for name in sys.stdin.read().splitlines():
    py_compile.compile(name, cfile=name + "c", dfile=name, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""

Inputs = dict[str, tuple[bytes, int]]
"""Archive name -> (content, file mode): everything a build packs."""


class BuildError(Exception):
    """The bundle could not be built (a vendored package is missing...)."""


def daemon_files(root: Path = AGENT_DIR) -> list[Path]:
    """The agent's daemon-side source files, relative to the agent package (at `root`)."""
    return sorted(
        path.relative_to(root)
        for path in root.rglob("*.py")
        if "__pycache__" not in path.parts and path.name not in CONTROLLER_ONLY
    )


def _read(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mode & 0o777


def _installed(name: str, inputs: Inputs) -> str:
    """Add package `name` of this environment to `inputs`; its version."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"package {name} is not installed; install it or pass --wheels")
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if "__pycache__" in parts or "tests" in parts or path.name.endswith(_SKIP_SUFFIXES):
            continue
        if path.is_file():
            inputs["/".join((name, *parts))] = _read(path)
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version(name)
    except Exception:
        return "unknown"


def _wheel(name: str, wheels: Path, inputs: Inputs) -> str:
    """Add package `name` from its wheel in `wheels` to `inputs`; its version."""
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
                inputs[member] = (archive.read(member), 0o644)
    return wheel.name.split("-")[1]


def gather(
    *,
    include_docker: bool = True,
    wheels: Path | str | None = None,
    agent_dir: Path = AGENT_DIR,
) -> Inputs:
    """Everything a build with these options packs (reads the sources, compiles nothing);
    `agent_dir` is where the agent package's sources are (another copy, in tests)."""
    inputs: Inputs = {
        "dstack_plan/__init__.py": (
            f'"""dstack-plan agent bundle."""\n\n__version__ = "{AGENT_VERSION}"\n'.encode(),
            0o644,
        ),
        "__main__.py": (_MAIN.encode(), 0o644),
    }
    for relative in daemon_files(agent_dir):
        inputs[f"dstack_plan/agent/{relative.as_posix()}"] = _read(agent_dir / relative)
    versions = {}
    if include_docker:
        for name in VENDORED:
            if wheels is not None:
                versions[name] = _wheel(name, Path(wheels), inputs)
            else:
                versions[name] = _installed(name, inputs)
    bundle_json = {"agent_version": AGENT_VERSION, "vendored": versions}
    inputs["BUNDLE.json"] = ((json.dumps(bundle_json, indent=2) + "\n").encode(), 0o644)
    return inputs


def inputs_key(inputs: Inputs, interpreter: str = "/usr/bin/env python3") -> str:
    """A hash of what a build of `inputs` depends on: the inputs, the interpreter line, this
    builder and the python that compiles the `.pyc` files. The same key, the same bytes."""
    digest = hashlib.sha256()
    for part in (
        Path(__file__).read_bytes(),
        sys.version.encode(),
        importlib.util.MAGIC_NUMBER,
        interpreter.encode(),
    ):
        digest.update(hashlib.sha256(part).digest())
    for name in sorted(inputs):
        content, mode = inputs[name]
        digest.update(f"{name}\0{mode:o}\0".encode() + hashlib.sha256(content).digest())
    return digest.hexdigest()


def _compiled(inputs: Inputs) -> dict[str, bytes]:
    """The `.pyc` of every module in `inputs` (archive name -> bytes), compiled by a fresh
    interpreter so that the bytes depend on the sources only."""
    sources = sorted(n for n in inputs if n.endswith(".py") and n != "__main__.py")
    with tempfile.TemporaryDirectory(prefix="dstack-agent-build-") as tmp:
        for name in sources:
            path = Path(tmp, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(inputs[name][0])
        done = subprocess.run(
            [sys.executable, "-S", "-s", "-c", _COMPILE],
            input="\n".join(sources),
            cwd=tmp,
            env={"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "")},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BuildError(f"compiling the agent failed: {done.stderr.strip()[-2000:]}")
        return {f"{name}c": Path(tmp, f"{name}c").read_bytes() for name in sources}


def write_zipapp(
    inputs: Inputs, out: Path | str, *, interpreter: str = "/usr/bin/env python3"
) -> Path:
    """Write `inputs` (and their `.pyc` files) to `out` as a zipapp, reproducibly."""
    out = Path(out)
    entries = {name: content for name, (content, _) in inputs.items()}
    entries.update(_compiled(inputs))
    modes = {name: mode for name, (_, mode) in inputs.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as target:
        target.write(f"#!{interpreter}\n".encode())
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(entries):
                member = zipfile.ZipInfo(name, _FIXED_TIME)
                # a `.pyc` gets the mode of its `.py`
                mode = modes.get(name, modes.get(name[:-1], 0o644))
                member.external_attr = (0o100000 | mode) << 16
                member.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(member, entries[name])
    out.chmod(0o755)
    return out


def build_zipapp(
    out: Path | str,
    *,
    include_docker: bool = True,
    wheels: Path | str | None = None,
    interpreter: str = "/usr/bin/env python3",
) -> Path:
    """Write the agent zipapp to `out` and return its path; it runs as `python3 OUT serve ...`."""
    inputs = gather(include_docker=include_docker, wheels=wheels)
    return write_zipapp(inputs, out, interpreter=interpreter)


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
