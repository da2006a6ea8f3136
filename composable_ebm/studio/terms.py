"""The page's terms: a list of models, values, weights and joins, and the one expression they write (and read back)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from composable_ebm.errors import InvalidInputError
from composable_ebm.expression import GuidedNode, ModelNode, Node, Or, Sum, Temperature, Weighted, parse_tree, tokenize


OPERATORS = ("and", "and not", "or")
"""How a term joins the terms before it: ``+``, ``-`` (a weighted negation) or ``|`` (a new alternative)."""


FORMS = ("auto", "guided", "plain")
"""How the page samples its expression, as `cebm compose`'s ``--form`` does (`page_form`): ``auto`` (the default, as
in Python and the command line: a sum of conditioned models with a null condition in its guided form, anything
else as written), ``guided`` (the text says ``guided(a + b)``) or ``plain`` (as written). The note under the
expression names the command."""


MAX_TERMS = 8
"""Most terms the controls show; a longer expression is still sampled, as typed."""


@dataclass
class Term:
    """One row of the page: a model, the values it is conditioned on, a weight, how it joins the terms
    before it and an optional temperature."""

    model: str
    bindings: dict[str, str] = field(default_factory=dict)
    weight: float = 1.0
    op: str = "and"
    temperature: float | None = None

    def check(self) -> None:
        if not self.model.strip():
            raise InvalidInputError("a term has no model; pick one or remove the term")
        if self.op not in OPERATORS:
            raise InvalidInputError(f"unknown operator {self.op!r}; valid choices: {list(OPERATORS)}")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0):
            raise InvalidInputError(f"the weight of {self.model} must be a number > 0, got {self.weight!r};"
                                    " to subtract a term, use the operator 'and not'")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidInputError(f"the temperature of {self.model} must be a number > 0, got {self.temperature!r}")


def _number(x: float) -> str:
    """A number as the expression grammar reads it: 2, 0.5, 1e-05."""
    return format(float(x), "g")


def term_text(term: Term) -> str:
    """One term as an expression: ``2*shapes-color[color=red] / 0.5``."""
    text = term.model.strip()
    if term.bindings:
        text += "[" + ", ".join(f"{a}={v}" for a, v in term.bindings.items()) + "]"
    if term.weight != 1:
        text = f"{_number(term.weight)}*{text}"
    if term.temperature is not None and term.temperature != 1:
        text += f" / {_number(term.temperature)}"
    return text


def alternatives(terms: Sequence[Term]) -> list[list[Term]]:
    """The terms split at each ``or``: the sums whose disjunction the expression is."""
    groups: list[list[Term]] = []
    for term in terms:
        if not groups or term.op == "or":
            groups.append([])
        groups[-1].append(term)
    return groups


def terms_to_expression(terms: Sequence[Term], form: str = "auto") -> str:
    """The expression ``cebm compose`` takes for ``terms``: ``and`` is ``+``, ``and not`` is ``-``, ``or``
    starts a new alternative (``|``); in the guided form each alternative is wrapped in ``guided(...)``."""
    if form not in FORMS:
        raise InvalidInputError(f"unknown form {form!r}; valid choices: {list(FORMS)}")
    if not terms:
        raise InvalidInputError("no terms: add a term to compose")
    parts = []
    for group in alternatives(terms):
        text = ""
        for i, term in enumerate(group):
            term.check()
            negative = term.op == "and not"
            if i == 0:
                text = ("-" if negative else "") + term_text(term)
            else:
                text += (" - " if negative else " + ") + term_text(term)
        parts.append(f"guided({text})" if form == "guided" else text)
    return " | ".join(parts)


class _Unshowable(Exception):
    """The expression is valid grammar but the controls cannot show it."""


def _tree_terms(tree: Node) -> tuple[list[Term], str]:
    """The terms and form of an expression's tree (`composable_ebm.expression.parse_tree`): a disjunction of
    (guided) sums of weighted, tempered models; anything else is `_Unshowable`."""
    terms: list[Term] = []
    forms = set()
    if isinstance(tree, Or) and tree.weights is not None:  # the controls have no weight per part
        raise _Unshowable
    for alternative in tree.alternatives if isinstance(tree, Or) else (tree,):
        guided = isinstance(alternative, GuidedNode)
        body = alternative.node if guided else alternative
        forms.add("guided" if guided else "auto")
        group = [_tree_term(node, "and not" if sign < 0 else "and")
                 for sign, node in (body.terms if isinstance(body, Sum) else ((1, body),))]
        if terms:
            group[0].op = "or"
        terms += group
    if len(forms) != 1 or len(terms) > MAX_TERMS:
        raise _Unshowable
    return terms, forms.pop()


def _tree_term(node: Node, op: str) -> Term:
    weight, temperature = 1.0, None
    while not isinstance(node, ModelNode):
        if isinstance(node, Weighted):
            weight *= node.weight
        elif isinstance(node, Temperature) and temperature is None:
            temperature = node.temperature
        else:  # a sum, a disjunction or a guided form inside a term, or a second temperature
            raise _Unshowable
        node = node.node
    if weight <= 0 or (temperature is not None and temperature <= 0):
        raise _Unshowable
    return Term(node.name, dict(node.bindings), weight, op, temperature)


def expression_to_terms(text: str) -> tuple[list[Term], str] | None:
    """The terms and form (``guided`` for text in ``guided(...)``, else ``auto``) the controls show for ``text``, read from the one grammar's tree
    (`composable_ebm.expression.parse_tree`), or ``None`` when they cannot show it (nested parentheses, a weight on
    a parenthesised group, more than `MAX_TERMS` terms ...) or the text is not yet a whole expression. Such an
    expression is still sampled as typed. Raises `InvalidInputError` only for text the grammar cannot tokenize."""
    if not text.strip():
        return None
    tokenize(text)  # a character the grammar has no place for: one line naming it
    try:
        return _tree_terms(parse_tree(text))
    except (_Unshowable, InvalidInputError):
        return None
