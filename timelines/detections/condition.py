"""Falco's condition language, parsed once and compiled into Python closures.

Grammar (what the k8saudit rules and Falco's tests use)::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | primary
    primary := "(" expr ")" | MACRO | FIELD "exists" | FIELD OP VALUE | FIELD LISTOP LIST
    OP      := = == != < <= > >= startswith endswith contains icontains glob
    LISTOP  := in intersects pmatch
    LIST    := "(" item ("," item)* ")"   (an item naming a list is replaced by its items)

Evaluation is three-valued: an event view may answer ``UNKNOWN`` for a field it does not hold
yet (the engine first looks at the indexed columns only, without the bodies), and ``and``,
``or`` and ``not`` follow Kleene's logic, so a rule that is false whatever the body says is
decided without reading it. A field the event does not hold (``None``) makes every comparison
false (and ``not`` of it true), as in Falco.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from . import fields

UNKNOWN = object()  # a field the view cannot tell yet


class PositiveTime:
    """A value known only to be a positive count of nanoseconds (``jevt.rawtime`` of a stored
    request before its body is read): ``=0`` is false and ``exists`` true, the rest unknown."""


POSITIVE_TIME = PositiveTime()


Test = Callable[["View"], "bool | None"]  # True, False, or None for unknown


class ConditionError(ValueError):
    """A condition that cannot be compiled; ``offset`` is where in its text."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(message)
        self.offset = offset


class View:
    """One event as rules see it: field text → value, extracted once."""

    __slots__ = ("event", "cache")

    def __init__(self, event: dict):
        self.event = event
        self.cache: dict[str, object] = {}

    def get(self, text: str, extract: fields.Extractor):
        try:
            return self.cache[text]
        except KeyError:
            value = self.cache[text] = extract(self.event)
            return value


COMPARE_OPS = ("==", "=", "!=", "<=", ">=", "<", ">")
WORD_OPS = ("startswith", "endswith", "contains", "icontains", "bcontains", "bstartswith",
            "glob", "iglob")
LIST_OPS = ("in", "intersects", "pmatch")
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<paren>[()])
  | (?P<comma>,)
  | (?P<op>==|!=|<=|>=|=|<|>)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<word>[^\s(),=<>!"']+(?:\[[^\]]*\])?[^\s(),=<>!"']*)
""", re.VERBOSE)


@dataclass
class Token:
    kind: str
    text: str
    offset: int


def tokenize(text: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if match is None:
            raise ConditionError(f"unexpected character {text[pos]!r}", pos)
        if match.lastgroup != "space":
            tokens.append(Token(match.lastgroup, match.group(), pos))
        pos = match.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] in "\"'" and text[-1] == text[0]:
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


@dataclass
class Context:
    """What a condition may name: macros (name → condition text), lists (name → items), and
    which fields it read (for the engine to know which columns or bodies a rule needs)."""

    macros: dict[str, str]
    lists: dict[str, list[str]]
    compiled_macros: dict[str, Test] = field(default_factory=dict)
    macro_fields: dict[str, set[str]] = field(default_factory=dict)
    expanding: list[str] = field(default_factory=list)
    used_lists: set[str] = field(default_factory=set)
    used_macros: set[str] = field(default_factory=set)

    def expand_list(self, items: list[str], seen: tuple[str, ...] = ()) -> list[str]:
        out = []
        for item in items:
            if item in self.lists and item not in seen:
                self.used_lists.add(item)
                out += self.expand_list(self.lists[item], seen + (item,))
            else:
                out.append(item)
        return out


class Parser:
    def __init__(self, text: str, context: Context):
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.context = context
        self.fields: set[str] = set()

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def is_word(self, word: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.text == word

    def parse(self) -> Test:
        if self.peek().kind == "end":
            raise ConditionError("empty condition", 0)
        test = self.expr()
        token = self.peek()
        if token.kind != "end":
            raise ConditionError(f"unexpected {token.text!r}", token.offset)
        return test

    def expr(self) -> Test:
        parts = [self.conj()]
        while self.is_word("or"):
            self.take()
            parts.append(self.conj())
        return parts[0] if len(parts) == 1 else any_of(parts)

    def conj(self) -> Test:
        parts = [self.negation()]
        while self.is_word("and"):
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else all_of(parts)

    def negation(self) -> Test:
        if self.is_word("not"):
            self.take()
            return negate(self.negation())
        return self.primary()

    def primary(self) -> Test:
        token = self.take()
        if token.kind == "paren" and token.text == "(":
            test = self.expr()
            closing = self.take()
            if closing.text != ")":
                raise ConditionError("missing ')'", closing.offset)
            return test
        if token.kind != "word" or token.text in ("and", "or", "not") + LIST_OPS:
            raise ConditionError(f"unexpected {token.text or 'end of condition'!r}",
                                 token.offset)
        if fields.FIELD_NAME.fullmatch(token.text):
            return self.comparison(token)
        return self.macro(token)

    def macro(self, token: Token) -> Test:
        name = token.text
        context = self.context
        if name not in context.macros:
            raise ConditionError(f"undefined macro '{name}'", token.offset)
        context.used_macros.add(name)
        if name in context.expanding:
            raise ConditionError(f"macro '{name}' refers to itself", token.offset)
        if name not in context.compiled_macros:
            context.expanding.append(name)
            try:
                inner = Parser(context.macros[name], context)
                try:
                    context.compiled_macros[name] = inner.parse()
                except ConditionError as exc:
                    raise ConditionError(f"in macro '{name}': {exc}", token.offset) from None
                context.macro_fields[name] = inner.fields
            finally:
                context.expanding.pop()
        self.fields |= context.macro_fields[name]
        return context.compiled_macros[name]

    def comparison(self, token: Token) -> Test:
        text = token.text
        extract = fields.extractor(text)
        if extract is None:
            name, arg = fields.split_field(text)
            if name in fields.ARG_FIELDS and arg is None:
                raise ConditionError(f"field '{name}' needs an argument in brackets",
                                     token.offset)
            raise ConditionError(f"unknown field '{text}'", token.offset)
        self.fields.add(text)
        is_list = fields.is_list_field(text)
        op = self.take()
        if op.kind == "word" and op.text == "exists":
            return exists(text, extract)
        if op.kind == "op" or (op.kind == "word" and op.text in WORD_OPS):
            value = self.take()
            if value.kind not in ("word", "string"):
                raise ConditionError(f"'{op.text}' needs a value", value.offset)
            operand = unquote(value.text)
            if op.text in ("<", "<=", ">", ">=") and number(operand) is None:
                raise ConditionError(
                    f"'{op.text}' compares numbers, not {operand!r}", value.offset)
            return compare(text, extract, op.text, operand, is_list)
        if op.kind == "word" and op.text in LIST_OPS:
            items = self.items()
            return member(text, extract, op.text, items, is_list)
        raise ConditionError(f"expected an operator after '{text}', got "
                             f"{op.text or 'end of condition'!r}", op.offset)

    def items(self) -> list[str]:
        opening = self.take()
        if opening.text != "(":
            if opening.kind == "word" and opening.text in self.context.lists:
                return self.context.expand_list([opening.text])
            raise ConditionError("expected a list in parentheses", opening.offset)
        raw: list[str] = []
        while True:
            token = self.take()
            if token.text == ")" and not raw:
                break
            if token.kind not in ("word", "string"):
                raise ConditionError(f"unexpected {token.text or 'end of condition'!r} in a "
                                     "list", token.offset)
            raw.append(token.text if token.kind == "word" else "\0" + unquote(token.text))
            after = self.take()
            if after.text == ")":
                break
            if after.kind != "comma":
                raise ConditionError("expected ',' or ')' in a list", after.offset)
        # quoted items are literals; a bare item naming a list is replaced by its items
        out = []
        for item in raw:
            if item.startswith("\0"):
                out.append(item[1:])
            else:
                out += self.context.expand_list([item])
        return out


def number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def all_of(parts: list[Test]) -> Test:
    def test(view):
        result = True
        for part in parts:
            value = part(view)
            if value is False:
                return False
            if value is None:
                result = None
        return result
    return test


def any_of(parts: list[Test]) -> Test:
    def test(view):
        result = False
        for part in parts:
            value = part(view)
            if value is True:
                return True
            if value is None:
                result = None
        return result
    return test


def negate(part: Test) -> Test:
    def test(view):
        value = part(view)
        return None if value is None else not value
    return test


def exists(text: str, extract) -> Test:
    def test(view):
        value = view.get(text, extract)
        if value is UNKNOWN:
            return None
        return value is not None and value != []
    return test


def _scalar_test(op: str, operand: str) -> Callable[[str], bool]:
    if op in ("=", "=="):
        return lambda v: v == operand
    if op == "!=":
        return lambda v: v != operand
    if op in ("<", "<=", ">", ">="):
        rhs = number(operand)

        def numeric(v):
            lhs = number(v)
            if lhs is None:
                return False
            return {"<": lhs < rhs, "<=": lhs <= rhs, ">": lhs > rhs, ">=": lhs >= rhs}[op]
        return numeric
    if op in ("startswith", "bstartswith"):
        return lambda v: v.startswith(operand)
    if op == "endswith":
        return lambda v: v.endswith(operand)
    if op in ("contains", "bcontains"):
        return lambda v: operand in v
    if op == "icontains":
        folded = operand.casefold()
        return lambda v: folded in v.casefold()
    if op == "glob":
        return lambda v: fnmatchcase(v, operand)
    if op == "iglob":
        folded = operand.casefold()
        return lambda v: fnmatchcase(v.casefold(), folded)
    raise ConditionError(f"unknown operator {op!r}")


def compare(text: str, extract, op: str, operand: str, is_list: bool) -> Test:
    check = _scalar_test(op, operand)
    negative = op == "!="

    rhs = number(operand)
    at_most_zero = rhs is not None and rhs <= 0
    on_positive = {"=": False, "==": False, "!=": True, ">": True, ">=": True, "<": False,
                   "<=": False}.get(op) if at_most_zero else None

    def test(view):
        value = view.get(text, extract)
        if value is UNKNOWN:
            return None
        if value is None:
            return False
        if value is POSITIVE_TIME:
            return on_positive
        if isinstance(value, list):
            if not value:
                return False
            return all(check(v) for v in value) if negative else any(check(v) for v in value)
        return check(value)
    return test


def pmatch(value: str, prefixes: list[str]) -> bool:
    for prefix in prefixes:
        base = prefix.rstrip("/")
        if value == prefix or value == base or value.startswith(base + "/"):
            return True
    return False


def member(text: str, extract, op: str, items: list[str], is_list: bool) -> Test:
    wanted = frozenset(items)

    def test(view):
        value = view.get(text, extract)
        if value is UNKNOWN or value is POSITIVE_TIME:
            return None
        if value is None:
            return False
        values = value if isinstance(value, list) else [value]
        if not values:
            return False
        if op == "in":
            return all(v in wanted for v in values)
        if op == "intersects":
            return any(v in wanted for v in values)
        return any(pmatch(v, items) for v in values)
    return test


def compile_condition(text: str, context: Context) -> tuple[Test, set[str]]:
    """(the test, the fields it reads, macros included)."""
    parser = Parser(text, context)
    return parser.parse(), parser.fields
