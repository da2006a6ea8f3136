"""Parse composition expressions such as ``"color[color=red] + 2*shape[shape=circle] - 0.5*shape[shape=square]"``.

Grammar (lowest precedence first)::

    expr    := alt ('|' alt)*                      disjunction
    alt     := [NUMBER ':'] sum                    a part, with its weight (its share of the samples)
    sum     := ['-'] product (('+' | '-') product)*
    product := NUMBER '*' product | factor ('*' NUMBER | '/' NUMBER)*
    factor  := MODEL ['[' attr=value (',' attr=value)* ']'] | '(' expr ')' | 'guided(' sum ')'

``MODEL`` is anything `composable_ebm.models.load_model` accepts (a folder, a bundled
name, ``org/name`` or ``org/name@revision``). A ``-`` or ``/`` inside a name belongs to the name (paths, Hub ids), so
write the minus and division operators with spaces around them. Each model is loaded once, however often it appears.
``3 : a | b`` draws ``a`` three times as often as ``b`` (`composable_ebm.energy.either`). ``guided(a + b - 0.5 * c)``
is the guided form of a sum of conditioned models (`composable_ebm.energy.guided`), each term at its model's own
guidance scale (`composable_ebm.pipeline.guidance_scale`).

`parse_tree` reads the text into a tree of `Node` records (the one grammar: the studio shows this tree in its
controls); `build` turns a tree into an `Energy`; `parse_expression` does both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from composable_ebm.energy import MAX_WEIGHT, Disjunction, Energy, guided
from composable_ebm.errors import InvalidInputError, a_type, quote
from composable_ebm.pipeline import guidance_interval, guidance_scale

MAX_DEPTH = 32
"""Deepest nesting of parentheses, ``NUMBER *`` prefixes and ``* NUMBER`` / ``/ NUMBER`` factors an expression may
use."""
MAX_LENGTH = 10_000
"""Longest expression parsed, in characters."""
OPERATORS = "+ - * / | N : ( ) [attr=value, ...] guided(...)"

_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)(?![A-Za-z_/~-])"
    r"|(?P<name>(?:[A-Za-z0-9_.~]|/(?=[A-Za-z0-9_.~]))[A-Za-z0-9_./~@-]*)|(?P<op>[-+*/|()\[\],=:]))"
)


def tokenize(text: str) -> list[tuple[str, str]]:
    """``(kind, text)`` pairs, kind ``number``, ``name`` or ``op``; one line naming the position on a bad character."""
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise InvalidInputError(f"cannot parse {text!r} at position {pos}: {text[pos:pos + 10]!r};"
                                    f" valid operators: {OPERATORS}")
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


@dataclass(frozen=True)
class ModelNode:
    """``MODEL[attr=value, ...]``: a model, with the values it is bound to (in the order written)."""

    name: str
    bindings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Weighted:
    """``w * node`` or ``node * w``."""

    weight: float
    node: Node


@dataclass(frozen=True)
class Temperature:
    """``node / T``."""

    temperature: float
    node: Node


@dataclass(frozen=True)
class Sum:
    """``[-] a + b - c``: each term with its sign (+1 or -1)."""

    terms: tuple[tuple[int, Node], ...]


@dataclass(frozen=True)
class Or:
    """``a | b | c``, or ``3 : a | b`` with each part's weight (None: 1 each)."""

    alternatives: tuple[Node, ...]
    weights: tuple[float, ...] | None = None


@dataclass(frozen=True)
class GuidedNode:
    """``guided(sum)``."""

    node: Node


Node = ModelNode | Weighted | Temperature | Sum | Or | GuidedNode
"""A node of an expression's tree; parentheses leave no node of their own."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.depth = 0

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InvalidInputError(f"expression nests deeper than {MAX_DEPTH} levels (parentheses, weights and"
                                    " temperatures each wrap once); write the weights as one number")

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            want = value or kind
            got = "the end" if tok is None else repr(tok[1])
            raise InvalidInputError(f"expected {want}, found {got} (token {self.i + 1}) in {quote(self.text)}")
        self.i += 1
        return tok[1]

    def at(self, value: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "op" and tok[1] == value

    def parse(self) -> Node:
        result = self.expr()
        if self.peek() is not None:
            raise InvalidInputError(f"unexpected {self.peek()[1]!r} (token {self.i + 1}) in {quote(self.text)}")
        return result

    def expr(self) -> Node:
        first, weight = self.alternative()
        alternatives, weights = [first], [weight]
        while self.at("|"):
            self.take("|")
            node, weight = self.alternative()
            alternatives.append(node)
            weights.append(weight)
        if len(alternatives) == 1:
            if weights[0] != 1.0:
                raise InvalidInputError(f"in {quote(self.text)}: a part's weight (N : ...) belongs to a disjunction;"
                                        " valid choices: 3 : a | b, or a weight of the energy, 3 * a")
            return first
        return Or(tuple(alternatives), None if all(w == 1.0 for w in weights) else tuple(weights))

    def alternative(self) -> tuple[Node, float]:
        weight = self.part_weight()
        return self.sum(), 1.0 if weight is None else weight

    def part_weight(self) -> float | None:
        """A part's ``NUMBER :`` when the tokens start with one, checked (taken); ``None`` when they do not. A sign or a
        word before the colon (``-1 :``, ``nan :``) is one line naming what was typed and the valid range."""
        ahead = self.tokens[self.i:self.i + 3]
        if len(ahead) >= 2 and ahead[1] == ("op", ":") and ahead[0][0] != "op":
            typed = ahead[0][1]
        elif len(ahead) == 3 and ahead[0] == ("op", "-") and ahead[1][0] == "number" and ahead[2] == ("op", ":"):
            typed = "-" + ahead[1][1]
        else:
            return None
        weight = float(typed) if ahead[0][0] == "number" else math.nan
        if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
            raise InvalidInputError(f"in {quote(self.text)}: a part's weight (N : ...) is its share of the samples, a"
                                    f" number in (0, {MAX_WEIGHT:g}]; got {typed!r}")
        self.i += 2
        return weight

    def number_after(self, op: str) -> float:
        """The number after ``*`` (a weight) or ``/`` (a temperature); a sign, a word or 0 there is one line naming what
        was typed and what is valid."""
        tok = self.peek()
        typed = "nothing" if tok is None else repr(tok[1])
        if tok is not None and tok == ("op", "-") and self.i + 1 < len(self.tokens):
            typed = repr("-" + self.tokens[self.i + 1][1])
        number = float(tok[1]) if tok is not None and tok[0] == "number" else math.nan
        if op == "/" and not (math.isfinite(number) and number > 0):
            raise InvalidInputError(f"in {quote(self.text)}: a temperature (/ T) must be a number > 0, got {typed}")
        if op == "*" and not math.isfinite(number):
            raise InvalidInputError(f"in {quote(self.text)}: a weight after * must be a number (a negative weight: a"
                                    f" minus before the term, x - 2 * a), got {typed}")
        if number == 0:
            raise InvalidInputError(f"in {quote(self.text)}: * 0 removes its term; leave the term out instead")
        self.i += 1
        return number

    def sum(self) -> Node:
        sign = -1 if self.at("-") else 1
        if sign < 0:
            self.take("-")
        terms = [(sign, self.product())]
        while self.at("+") or self.at("-"):
            op = self.take()
            terms.append((1 if op == "+" else -1, self.product()))
        return terms[0][1] if terms == [(1, terms[0][1])] else Sum(tuple(terms))

    def product(self) -> Node:
        tok = self.peek()
        if tok is not None and tok[0] == "number":
            weight = float(self.take())
            if weight == 0:
                raise InvalidInputError(f"in {quote(self.text)}: a weight of 0 removes its term; leave the term out instead")
            self.take("*")
            self.enter()
            result: Node = Weighted(weight, self.product())
            self.depth -= 1
            return result
        result = self.factor()
        depth = self.depth
        while self.at("*") or self.at("/"):
            op = self.take()
            number = self.number_after(op)
            self.enter()  # each factor wraps the node once more
            result = Weighted(number, result) if op == "*" else Temperature(number, result)
        self.depth = depth
        return result

    def factor(self) -> Node:
        if self.at("("):
            self.take("(")
            self.enter()
            inner = self.expr()
            self.take(")")
            self.depth -= 1
            return inner
        name = self.take(kind="name")
        if name == "guided" and self.at("("):
            self.take("(")
            self.enter()
            inner = self.sum()
            self.take(")")
            self.depth -= 1
            return GuidedNode(inner)
        bindings: list[tuple[str, str]] = []
        if self.at("["):
            self.take("[")
            while True:
                attr = self.take(kind="name")
                if attr in dict(bindings):
                    raise InvalidInputError(f"in {quote(self.text)}: {attr} is bound twice in [{attr}={dict(bindings)[attr]},"
                                            f" {attr}=...]; an attribute takes one value (for either, use |)")
                self.take("=")
                tok = self.peek()
                bindings.append((attr, self.take(kind="number" if tok is not None and tok[0] == "number" else "name")))
                if self.at(","):
                    self.take(",")
                    continue
                break
            self.take("]")
        return ModelNode(name, tuple(bindings))


def parse_tree(text: str) -> Node:
    """The tree of an expression; one line naming the position or the token on a grammar error."""
    if not text.strip():
        raise InvalidInputError("empty composition expression")
    if len(text) > MAX_LENGTH:
        raise InvalidInputError(f"expression of {len(text)} characters; at most {MAX_LENGTH}")
    return _Parser(text).parse()


def build(node: Node, load: Callable[[str], Energy], text: str = "") -> Energy:
    """The energy a tree describes, loading each named model once with ``load`` (``text``: for messages)."""
    return _Builder(load, text).visit(node)


class _Builder:
    """Builds an energy from a tree (`build`). A class rather than nested functions: a recursive closure refers to
    itself, a reference cycle that would keep every model it loaded alive until the cyclic garbage collector runs
    (the studio's model cache would then not bound its memory)."""

    def __init__(self, load: Callable[[str], Energy], text: str) -> None:
        self.load, self.text = load, text
        self.cache: dict[str, Energy] = {}

    def model(self, name: str) -> Energy:
        if name not in self.cache:
            loaded = self.load(name)
            if not isinstance(loaded, Energy):
                raise InvalidInputError(f"in {quote(self.text)}: {name} is {a_type(loaded)}, not an energy;"
                                        " only energy models compose")
            self.cache[name] = loaded
        return self.cache[name]

    def visit(self, n: Node) -> Energy:
        if isinstance(n, ModelNode):
            energy = self.model(n.name)
            return energy.condition(**dict(n.bindings)) if n.bindings else energy
        if isinstance(n, Weighted):
            return self.visit(n.node) * n.weight
        if isinstance(n, Temperature):
            return self.visit(n.node) / n.temperature
        if isinstance(n, Sum):
            (sign, first), *rest = n.terms
            result = self.visit(first)
            if sign < 0:
                result = -result
            for sign, term in rest:
                result = result + self.visit(term) if sign > 0 else result - self.visit(term)
            return result
        if isinstance(n, Or):
            return Disjunction([self.visit(alternative) for alternative in n.alternatives], n.weights)
        inner = self.visit(n.node)
        try:
            return guided(inner, guidance_scale, guidance_interval)
        except ValueError as err:
            raise InvalidInputError(f"in {quote(self.text)}: {err}") from err


def parse_expression(text: str, load: Callable[[str], Energy]) -> Energy:
    """Build the composite energy an expression describes, loading models with ``load``."""
    return build(parse_tree(text), load, text)
