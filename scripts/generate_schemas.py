"""Write the published JSON Schemas (`schemas/`) from the configuration models.

Run after changing a model: `make schemas`. A test fails when the checked-in files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dstack_plan.config.schema import KINDS, kind_schema, union_schema
from dstack_plan.policy.model import policy_file_schema

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"


def rendered() -> dict[str, str]:
    """File name -> exact file content, for every published schema."""
    files = {f"{kind}.schema.json": kind_schema(kind) for kind in KINDS}
    files["dstack.schema.json"] = union_schema()
    files["policy.schema.json"] = policy_file_schema()
    return {
        name: json.dumps(schema, indent=2, sort_keys=True) + "\n" for name, schema in files.items()
    }


def main() -> int:
    SCHEMAS_DIR.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (SCHEMAS_DIR / name).write_text(text)
        print(f"wrote schemas/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
