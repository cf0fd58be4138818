"""The fast YAML loader: libyaml's C parser with YAML 1.1 scalars minus base-60 numbers.

YAML 1.1 reads `8000:80` as the integer 480080 and `2:4` as 124; in a port or GPU spec that
is never what a user meant, so colon-separated digits stay strings (as in YAML 1.2).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class FastLoader(_Base):  # type: ignore[misc, valid-type]
    """Safe loader without sexagesimal (base 60) integers and floats."""


FastLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in _Base.yaml_implicit_resolvers.items()
}
FastLoader.add_implicit_resolver(
    _INT,
    re.compile(
        r"""^(?:[-+]?0b[0-1_]+
        |[-+]?0[0-7_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    list("-+0123456789"),
)
FastLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_all(text: str) -> list[Any]:
    """Every document of `text`; raises yaml.YAMLError with a mark on bad syntax."""
    return list(yaml.load_all(text, Loader=FastLoader))
