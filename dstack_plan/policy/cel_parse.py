"""A parser for CEL's grammar (cel-spec langdef), building the small tree `cel_check` walks.

The CEL library compiles and evaluates rules but exposes no syntax tree; the field check
needs one (which names a rule selects from which values), so this module parses the same
grammar. It runs only on expressions the library has already accepted, so its errors are a
second opinion, reported the same way; where the two differ, the library decides (words
CEL reserves, such as `namespace`, are accepted as field names because it accepts them).
"""

from __future__ import annotations

import re
from typing import NamedTuple


class CelSyntaxError(ValueError):
    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class Node(NamedTuple):
    """`kind`: ident, select, call, index, list, map, struct, literal, op.

    ident: name; select: name, args=(operand,); call: name, target (or None), args;
    index: args=(operand, key); list / struct / op: args; map: args=(k1, v1, k2, v2, ...);
    literal: name is the token's text."""

    kind: str
    offset: int
    name: str = ""
    args: tuple[Node, ...] = ()
    target: Node | None = None


_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>[rRbB]{0,2}(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''
        |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)
_RELATIONS = ("<", "<=", ">", ">=", "==", "!=", "in")


def tokenize(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, offset) per token, ending with ("end", "", len(text))."""
    tokens: list[tuple[str, str, int]] = []
    at = 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise CelSyntaxError(f"unexpected character {text[at]!r}", at)
        kind = m.lastgroup or ""
        if kind != "space":
            tokens.append((kind, m.group(), at))
        at = m.end()
    tokens.append(("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.at = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at]

    def take(self, text: str | None = None) -> tuple[str, str, int]:
        token = self.tokens[self.at]
        if text is not None and token[1] != text:
            found = repr(token[1]) if token[0] != "end" else "the end"
            raise CelSyntaxError(f"expected {text!r}, found {found}", token[2])
        self.at += 1
        return token

    def accept(self, text: str) -> bool:
        if self.tokens[self.at][1] == text and self.tokens[self.at][0] != "string":
            self.at += 1
            return True
        return False

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.peek()[1] == "?":
            offset = self.take()[2]
            yes = self.binary(0)
            self.take(":")
            no = self.expr()
            return Node("op", offset, "?:", (cond, yes, no))
        return cond

    _LEVELS: tuple[tuple[str, ...], ...] = (("||",), ("&&",), _RELATIONS, ("+", "-"))
    _LEVELS += (("*", "/", "%"),)

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[1] in self._LEVELS[level] and self.peek()[0] in ("op", "ident"):
            _, op, offset = self.take()
            left = Node("op", offset, op, (left, self.binary(level + 1)))
        return left

    def unary(self) -> Node:
        kind, text, offset = self.peek()
        if kind == "op" and text in ("!", "-"):
            self.take()
            return Node("op", offset, text, (self.unary(),))
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            kind, text, offset = self.peek()
            if text in (".", ".?") and kind == "op":
                self.take()
                name = self.ident()
                if self.accept("("):
                    node = Node("call", offset, name, self.items(")"), node)
                else:
                    node = Node("select", offset, name, (node,))
            elif text in ("[", "[?") and kind == "op":
                self.take()
                key = self.expr()
                self.take("]")
                node = Node("index", offset, "", (node, key))
            elif text == "{" and kind == "op" and node.kind in ("ident", "select"):
                self.take()
                node = Node("struct", offset, _dotted(node), self.fields())
            else:
                return node

    def ident(self) -> str:
        kind, text, offset = self.take()
        if kind != "ident":
            raise CelSyntaxError(f"expected a name, found {text!r}", offset)
        return text

    def primary(self) -> Node:
        kind, text, offset = self.peek()
        if kind in ("string", "number"):
            self.take()
            return Node("literal", offset, text)
        if kind == "ident":
            self.take()
            if text in ("true", "false", "null"):
                return Node("literal", offset, text)
            if self.accept("("):
                return Node("call", offset, text, self.items(")"))
            return Node("ident", offset, text)
        if text == "." and kind == "op":  # a leading dot: a name in the root scope
            self.take()
            return self.primary()
        if text == "(":
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        if text == "[":
            self.take()
            return Node("list", offset, "", self.items("]"))
        if text == "{":
            self.take()
            return Node("map", offset, "", self.entries())
        found = "the end" if kind == "end" else repr(text)
        raise CelSyntaxError(f"unexpected {found}", offset)

    def items(self, close: str) -> tuple[Node, ...]:
        items: list[Node] = []
        while not self.accept(close):
            items.append(self.expr())
            if not self.accept(","):
                self.take(close)
                break
        return tuple(items)

    def entries(self) -> tuple[Node, ...]:
        entries: list[Node] = []
        while not self.accept("}"):
            self.accept("?")  # an optional entry, `{?key: value}`
            entries.append(self.expr())
            self.take(":")
            entries.append(self.expr())
            if not self.accept(","):
                self.take("}")
                break
        return tuple(entries)

    def fields(self) -> tuple[Node, ...]:
        fields: list[Node] = []
        while not self.accept("}"):
            self.accept("?")
            self.ident()
            self.take(":")
            fields.append(self.expr())
            if not self.accept(","):
                self.take("}")
                break
        return tuple(fields)


def _dotted(node: Node) -> str:
    if node.kind == "ident":
        return node.name
    return f"{_dotted(node.args[0])}.{node.name}"


def parse(text: str) -> Node:
    """The tree of CEL expression `text`; CelSyntaxError (with the offset) when it is none."""
    parser = _Parser(text)
    node = parser.expr()
    kind, rest, offset = parser.peek()
    if kind != "end":
        raise CelSyntaxError(f"unexpected {rest!r} after the expression", offset)
    return node
