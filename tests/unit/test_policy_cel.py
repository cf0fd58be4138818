"""The CEL parser and field check that guard rules before evaluation."""

from __future__ import annotations

import cel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.policy.cel_check import Checker, FieldError
from dstack_plan.policy.cel_parse import CelSyntaxError, parse, tokenize
from dstack_plan.policy.schema import FUNCTIONS, VARIABLES

VALID = [
    "true",
    "1 + 2 * 3 - -4 % 5 / 6",
    "0x1F == 31 && 7u > 3u && 1.5e3 > .5 && 2e-3 < 1.0",
    "'a\\'b' + " + '"c\\"d"' + " + r'raw\\n' + '''tri'ple''' + \"\"\"x\"y\"\"\" == ''",
    "b'bytes' == b\"bytes\"",
    "[1, 2, 3,].exists(x, x > 2) ? {'a': 1, 'b': [2],} : {}",
    "!(cost.after > 1.0) || !!true",
    "runs.all(r, r.labels.all(k, k != '') && r.labels.exists(k, r.labels[k] == 'x'))",
    "runs.map(r, r.gpus).filter(g, g > 1.0).size() == 0",
    "runs.map(r, r.gpus > 1.0, r.name).exists_one(n, n == 'a')",
    "'docker.io' in runs.map(r, r.registry) && 'team' in runs[0].labels",
    "has(runs[0].labels.team) || has(plan.resource_changes[0].change.after.image)",
    "plan.resource_changes.all(c, c.change.after == null || c.change.after.image != '')",
    "type(cost.after) == double && int(cost.after) >= 0 && string(1) == '1'",
    "size(deleted('volume')) + size(replaced('*')) == 0 // a comment",
    "changes.all(c,\n  c.action != 'delete')",
    "runs.exists(r, r.namespace == 'default')",
    "plan['cost']['after'] >= 0.0 && plan.cost.after >= 0.0",
    "[1, 2][1] == 2 && {'k': 'v'}.k == 'v'",
    "a.b.c == 1 || true".replace("a.b.c", "plan.prior_state.serial"),
]


@pytest.mark.parametrize("expression", VALID)
def test_parses_and_checks_what_the_library_accepts(expression: str) -> None:
    cel.compile(expression)  # the library accepts it: so must we
    Checker(VARIABLES, FUNCTIONS).check(parse(expression))


@pytest.mark.parametrize(
    ("expression", "message", "at"),
    [
        ("runs.all(r, r.gpu <= 8)", "r (a run) has no field 'gpu'", 14),
        ("cost.aftr > 1.0", "cost (cost) has no field 'aftr'", 5),
        ("true || gpus.totl > 1.0", "gpus (gpus) has no field 'totl'", 13),
        ("has(cost.nope)", "no field 'nope'", 9),
        ("runs[0]['gpu'] > 1", "runs[...] (a run) has no field 'gpu'", 8),
        ("changes.map(c, c.action).all(a, a.kind == '')", "a is a string: it has no field", 34),
        ("runs.size.x", "no field", 5),
        ("deletions.all(d, d.type == 'volume')", "d (a resource) has no field 'type'", 19),
        ("plan.resource_changes.all(c, c.change.acts == [])", "has no field 'acts'", 38),
        ("nope == 1", "unknown variable 'nope'", 0),
        ("runs.all(r, x > 1)", "unknown variable 'x'", 12),
        ("deleted('a', 'b') == []", "takes 1 argument", 0),
    ],
)
def test_reports_unknown_fields_and_names_where_they_are(
    expression: str, message: str, at: int
) -> None:
    with pytest.raises(FieldError) as caught:
        Checker(VARIABLES, FUNCTIONS).check(parse(expression))
    assert message in str(caught.value)
    assert caught.value.offset == at


def test_user_keyed_values_are_left_to_run_time() -> None:
    checker = Checker(VARIABLES, FUNCTIONS)
    for expression in ("runs.all(r, r.labels.anything == 'x')", "changes.all(c, c.after.x.y)"):
        checker.check(parse(expression))


@pytest.mark.parametrize("expression", ["1 +", "(1", "[1, 2", "a.", "'open", "1 2", "{1: }"])
def test_syntax_errors(expression: str) -> None:
    with pytest.raises(CelSyntaxError):
        parse(expression)


def test_tokens_keep_offsets() -> None:
    assert [t[2] for t in tokenize("a  && 'b c'")] == [0, 3, 6, 11]


def _expressions() -> st.SearchStrategy[str]:
    leaves = st.sampled_from(
        ["1", "2.5", "0x10", "3u", "'s'", '"t"', "true", "null", "cost.after", "runs", "[]"]
    )

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        ops = st.sampled_from(["+", "-", "*", "/", "%", "==", "!=", "<", "<=", "&&", "||", "in"])
        return st.one_of(
            st.tuples(inner, ops, inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            st.tuples(st.sampled_from(["!", "-"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
            st.lists(inner, max_size=3).map(lambda xs: f"[{', '.join(xs)}]"),
            st.tuples(inner, inner).map(lambda t: f"{{{t[0]}: {t[1]}}}"),
            st.tuples(inner, st.sampled_from(["all", "exists", "map", "filter"]), inner).map(
                lambda t: f"({t[0]}).{t[1]}(x, {t[2]})"
            ),
            st.tuples(inner, inner).map(lambda t: f"({t[0]})[{t[1]}]"),
            inner.map(lambda x: f"size({x})"),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_whatever_the_library_compiles_parses(expression: str) -> None:
    try:
        cel.compile(expression)
    except ValueError:
        return
    parse(expression)
