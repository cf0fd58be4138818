"""Record dstack's own verdict on every case of the conformance corpus (tests/conformance).

For each `tests/conformance/<area>.yml` (a list of cases; the format is described in
tests/unit/test_dstack_conformance.py) this asks dstack's parser,
`parse_apply_configuration(yaml.safe_load(text))`, in a Python that has dstack installed,
and writes `tests/conformance/<area>.verdicts.json`:
`{case name: {"dstack": "accept" | "reject", "error": first line of dstack's message}}`.

The tests read the recorded verdicts; they never need dstack. Regenerate after adding cases:

    python3 -m venv /tmp/dstack-ref && /tmp/dstack-ref/bin/pip install dstack==0.22.5
    python scripts/dstack_verdicts.py --dstack-python /tmp/dstack-ref/bin/python [AREA ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "conformance"
DSTACK_VERSION = "0.22.5"

# Runs inside the dstack interpreter: reads {name: text} on stdin, prints {name: verdict}.
_ASK_DSTACK = r"""
import json, sys
import yaml
from importlib.metadata import version
from dstack._internal.core.models.configurations import parse_apply_configuration

want = sys.argv[1]
if version("dstack") != want:
    sys.exit(f"dstack {version('dstack')} is installed there, not {want}")
verdicts = {}
for name, text in json.load(sys.stdin).items():
    try:
        parse_apply_configuration(yaml.safe_load(text))
        verdicts[name] = {"dstack": "accept"}
    except Exception as e:  # any refusal: a pydantic error, a ConfigurationError, ...
        lines = [l.strip() for l in str(e).splitlines() if l.strip()]
        detail = " | ".join(lines[1:3]) if len(lines) > 1 else (lines[0] if lines else "")
        verdicts[name] = {"dstack": "reject", "error": f"{type(e).__name__}: {detail}"[:300]}
json.dump(verdicts, sys.stdout, indent=1, sort_keys=True)
"""


def cases(area_file: Path) -> dict[str, str]:
    """{case name: config text} of one area file."""
    loaded = yaml.safe_load(area_file.read_text(encoding="utf-8")) or []
    return {case["name"]: case["config"] for case in loaded}


def record(area_file: Path, dstack_python: str) -> int:
    texts = cases(area_file)
    done = subprocess.run(
        [dstack_python, "-c", _ASK_DSTACK, DSTACK_VERSION],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{area_file.name}: dstack's parser failed:\n{done.stderr}")
    verdicts = json.loads(done.stdout)
    target = area_file.with_name(area_file.stem + ".verdicts.json")
    target.write_text(json.dumps(verdicts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return len(verdicts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dstack-python", required=True, help="a python with dstack installed")
    parser.add_argument("areas", nargs="*", help="area names (default: every area)")
    args = parser.parse_args()
    files = [CORPUS / f"{a}.yml" for a in args.areas] or sorted(CORPUS.glob("*.yml"))
    for area_file in files:
        count = record(area_file, args.dstack_python)
        print(f"{area_file.name}: {count} verdicts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
