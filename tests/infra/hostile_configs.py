"""Hostile configurations: the inputs whose cost must stay bounded. The unit tests check what
each one is answered with (tests/unit/test_config_hostile.py); the benchmark times them
(benchmarks/hostile_inputs.py), so no test depends on how busy the machine is."""

from __future__ import annotations


def billion_laughs(indent: str = "") -> str:
    """10 aliases x 9 levels: a billion strings in a few hundred bytes."""
    lines = [f'{indent}a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 9):
        name, below = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{indent}{name}: &{name} [" + ", ".join([f"*{below}"] * 10) + "]")
    return "\n".join(lines) + "\n"


BOMBS = {
    "plain": "type: task\ncommands: [echo]\nx:\n" + billion_laughs("  "),
    "with a backslash": 'type: task\ncommands: ["echo \\\\"]\nx:\n' + billion_laughs("  "),
    "with an interpolation": "type: task\ncommands: ['${{ env.A }}']\nx:\n" + billion_laughs("  "),
    "as env": "type: task\ncommands: [echo]\nx:\n" + billion_laughs("  ") + "env: *i\n",
    "in a merge key": "type: task\ncommands: [echo]\nm0: &m0 {k: 1}\n"
    + "".join(
        f"m{k}: &m{k} {{<<: [" + ", ".join([f"*m{k - 1}"] * 10) + "]}\n" for k in range(1, 10)
    ),
}
"""Alias bombs, each refused with one issue."""

LONG_INTERPOLATION = "type: task\ncommands: ['" + "${{ " * 25_000 + "']\n"
ERROR_AMONG_100000_ENTRIES = (
    "type: task\ncommands: [echo]\nenv:\n"
    + "".join(f"  K{i}: v\n" for i in range(100_000))
    + "bogus: 1\n"
)
ERRORS_IN_5000_DOCUMENTS = "".join(
    f"---\ntype: task\nname: t{i}\ncommands: [echo]\nbogus: 1\n" for i in range(5000)
)
WRONG_ITEMS = "type: task\ncommands:\n" + "".join(f"  - [x{i}]\n" for i in range(70_000))
DUPLICATES = "type: task\ncommands: [echo]\nenv:\n" + "  A: 1\n" * 100_000
REFERENCE_ERRORS = "".join(
    f"---\ntype: task\nname: t{i}\ncommands: [echo]\nfleets: [nope]\n" for i in range(5000)
)
"""Loaded, then checked for references (`validate`): 5,000 located reference errors."""

LOAD_CASES = {
    **{f"alias bomb, {name}": text for name, text in BOMBS.items()},
    "unterminated interpolation x25,000": LONG_INTERPOLATION,
    "an error among 100,000 entries": ERROR_AMONG_100000_ENTRIES,
    "errors in 5,000 documents": ERRORS_IN_5000_DOCUMENTS,
    "70,000 wrong list items": WRONG_ITEMS,
    "100,000 duplicate keys": DUPLICATES,
}
"""What loading one file must answer within the target, by name."""
