"""The field check: every name a rule uses must exist in the values it is evaluated on.

CEL evaluates lazily: `runs.all(r, r.gpu <= 8)` is true on a plan without runs, and
`a || r.typo` never looks at `r.typo` when `a` holds. A policy that passes because it never
read a misspelt field is worse than none, so before evaluating, each rule is checked
against the types of the variables (`schema.py`), as Kubernetes checks its admission
policies against the object's schema: a select of a field a record does not have is an
error. Values whose keys are the user's (specs, labels) are `DYN` and are checked at run
time only (a missing key there is an evaluation error, never a pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dstack_plan.policy.cel_parse import CelSyntaxError, Node


class Type:
    """A value's type as far as the check needs it."""

    def describe(self) -> str:
        return "a value"


@dataclass(frozen=True, eq=False)
class Scalar(Type):
    name: str

    def describe(self) -> str:
        return f"a {self.name}"


@dataclass(frozen=True, eq=False)
class Record(Type):
    """A mapping with a fixed set of fields (ours, documented in docs/policies.md)."""

    name: str
    fields: Mapping[str, Type] = field(default_factory=dict)

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class ListOf(Type):
    item: Type

    def describe(self) -> str:
        return f"a list of {self.item.describe()}"


@dataclass(frozen=True, eq=False)
class MapOf(Type):
    """A mapping with any string keys, all of one value type (labels: strings)."""

    value: Type

    def describe(self) -> str:
        return "a map"


@dataclass(frozen=True, eq=False)
class Function:
    arity: int
    result: Type


DYN = Type()
STRING, DOUBLE, INT, BOOL = Scalar("string"), Scalar("double"), Scalar("int"), Scalar("bool")
_TYPE_NAMES = frozenset(
    "int uint double bool string bytes list map null_type type dyn google".split()
)
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


class FieldError(CelSyntaxError):
    """A rule selects a field the value does not have, or names an unknown variable."""


class Checker:
    """Check trees against the variables' and functions' types."""

    def __init__(self, variables: Mapping[str, Type], functions: Mapping[str, Function]):
        self.variables = variables
        self.functions = functions

    def check(self, node: Node) -> Type:
        """The type of `node`'s value; FieldError at the first unknown field or name."""
        return self._type(node, {})

    def _type(self, node: Node, scope: Mapping[str, Type]) -> Type:
        kind = node.kind
        if kind == "ident":
            return self._ident(node, scope)
        if kind == "select":
            return self._select(self._type(node.args[0], scope), node, node.args[0])
        if kind == "call":
            return self._call(node, scope)
        if kind == "index":
            operand = self._type(node.args[0], scope)
            key = node.args[1]
            self._type(key, scope)
            if isinstance(operand, ListOf):
                return operand.item
            if isinstance(operand, MapOf):
                return operand.value
            if isinstance(operand, Record) and key.kind == "literal" and key.name[:1] in "'\"":
                return self._field(operand, key.name[1:-1], node, node.args[0])
            return DYN
        if kind == "literal":
            return _literal_type(node.name)
        for arg in node.args:
            self._type(arg, scope)
        if kind == "list":
            return ListOf(DYN)
        if kind == "op" and node.name in ("||", "&&", "!", "<", "<=", ">", ">=", "==", "!="):
            return BOOL
        if kind == "op" and node.name == "in":
            return BOOL
        return DYN

    def _ident(self, node: Node, scope: Mapping[str, Type]) -> Type:
        if node.name in scope:
            return scope[node.name]
        if node.name in self.variables:
            return self.variables[node.name]
        if node.name in _TYPE_NAMES:
            return DYN
        known = ", ".join(sorted(self.variables))
        raise FieldError(f"unknown variable {node.name!r} (variables: {known})", node.offset)

    def _select(self, operand: Type, node: Node, base: Node) -> Type:
        if isinstance(operand, Record):
            return self._field(operand, node.name, node, base)
        if isinstance(operand, MapOf):
            return operand.value
        if isinstance(operand, (Scalar, ListOf)):
            raise FieldError(
                f"{_text(base)} is {operand.describe()}: it has no field {node.name!r}",
                node.offset + 1,
            )
        return DYN

    def _field(self, record: Record, name: str, node: Node, base: Node) -> Type:
        if name in record.fields:
            return record.fields[name]
        known = ", ".join(record.fields)
        raise FieldError(
            f"{_text(base)} ({record.describe()}) has no field {name!r}; its fields: {known}",
            node.offset + 1,
        )

    def _call(self, node: Node, scope: Mapping[str, Type]) -> Type:
        target, args = node.target, node.args
        if node.name == "has" and target is None and len(args) == 1:
            inner = args[0]
            if inner.kind == "select":
                self._select(self._type(inner.args[0], scope), inner, inner.args[0])
            return BOOL
        if target is not None and node.name in _MACROS and args and args[0].kind == "ident":
            return self._macro(node, self._type(target, scope), scope)
        if target is not None:
            self._type(target, scope)
        for arg in args:
            self._type(arg, scope)
        if target is None and node.name in self.functions:
            function = self.functions[node.name]
            if len(args) != function.arity:
                raise FieldError(
                    f"{node.name}() takes {function.arity} argument(s), got {len(args)}",
                    node.offset,
                )
            return function.result
        if node.name == "size":
            return INT
        return DYN

    def _macro(self, node: Node, over: Type, scope: Mapping[str, Type]) -> Type:
        variable = node.args[0].name
        if isinstance(over, ListOf):
            item = over.item
        elif isinstance(over, (MapOf, Record)):
            item = STRING  # a comprehension over a map binds its keys
        else:
            item = DYN
        inner = {**scope, variable: item}
        results = [self._type(arg, inner) for arg in node.args[1:]]
        if node.name == "map":
            return ListOf(results[-1] if results else DYN)
        if node.name == "filter":
            return over if isinstance(over, ListOf) else ListOf(DYN)
        return BOOL


def _literal_type(text: str) -> Type:
    if text in ("true", "false"):
        return BOOL
    if text == "null":
        return DYN
    if text[:1].isdigit() or text[:1] == ".":
        is_float = any(c in text for c in ".eE") and not text.lower().startswith("0x")
        return DOUBLE if is_float else INT
    return STRING


def _text(node: Node) -> str:
    """A short rendering of a (select chain) node for messages: `r.labels`."""
    if node.kind == "ident":
        return node.name
    if node.kind == "select":
        return f"{_text(node.args[0])}.{node.name}"
    if node.kind == "index":
        return f"{_text(node.args[0])}[...]"
    if node.kind == "call":
        base = f"{_text(node.target)}." if node.target is not None else ""
        return f"{base}{node.name}(...)"
    return "the value"
