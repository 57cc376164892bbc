"""The selector language (core/selector.py describes it) compiled: its text read into
tokens and parsed by precedence climbing, the types checked as each node is built, into a
tree of closures over a message's headers that evaluate it with JMS's three-valued logic.
Whatever a selector may be refused for is refused here, once, with its position and token
(`SelectorError`); what is built never raises, whatever the header values.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, NoReturn

from pairmq.core.errors import CoreError
from pairmq.core.message import DEFAULT_PRIORITY

#: The JMS header names a selector may use, and the STOMP header each one reads.
JMS_HEADERS: Final[dict[str, str]] = {
    "JMSMessageID": "message-id",
    "JMSCorrelationID": "correlation-id",
    "JMSType": "type",
    "JMSPriority": "priority",  # a number; DEFAULT_PRIORITY (4, as JMS) when absent
    "JMSTimestamp": "timestamp",
    "JMSExpiration": "expires",
    "JMSDeliveryMode": "persistent",  # 'PERSISTENT' when persistent:true, else 'NON_PERSISTENT'
    "JMSDestination": "destination",
    "JMSReplyTo": "reply-to",
}
MAX_LENGTH: Final = 4096
MAX_DEPTH: Final = 100

Value = bool | int | float | str | None  # None: NULL, or UNKNOWN for a condition
Fn = Callable[[Mapping[str, str]], Value]
Op = Callable[[Any, Any], Any]
Cmp = Callable[[Any, Any], bool]
NUM, STR, BOOL, HDR = "number", "string", "boolean", "header"  # a node's static type


class SelectorError(CoreError):
    """A selector that cannot be compiled; the message names the 0-based position and the
    token, so that the ERROR frame alone is enough to fix it."""


def compile_text(text: str) -> tuple[Fn, bool]:
    """`text` as one closure over headers, and whether it reads JMSMessageID or
    JMSDestination (a message's id and destination are not among its stored headers);
    raises SelectorError."""
    if len(text) > MAX_LENGTH:
        raise SelectorError(f"selector: too long ({len(text):,} characters, at most "
                            f"{MAX_LENGTH:,})")
    if not text.strip(" \t\f\r\n"):
        raise SelectorError("selector: empty (leave the header out to receive everything)")
    parser = _Parser(text)
    fn = parser.parse()
    return fn, any(t.kind == "id" and t.text in ("JMSMessageID", "JMSDestination")
                   for t in parser.toks)


# ------------------------------------------------------------------------- evaluation

_NUMERIC: Final = re.compile(r"[+-]?(?:[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+))([eE][+-]?[0-9]+)?")
_BOOLEANS: Final = {"true": True, "false": False}
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _to_number(text: str, decimal: bool) -> int | float:
    """An exact number beyond Java's long is approximate (a float): no int grows without
    bound, so `a * a * a ...` on a header of 5,000 digits stays cheap."""
    return _exact(int(text)) if not decimal and len(text) <= 20 else float(text)


def _exact(n: int) -> int | float:
    return n if _LONG_MIN <= n <= _LONG_MAX else float(n)


def _number(text: str) -> int | float | None:
    """A header's text as a number, or None when it does not read as one."""
    if text.isdigit() and text.isascii() and len(text) <= 18:  # the common case, 4x faster
        return int(text)
    m = _NUMERIC.fullmatch(text)
    return None if m is None else _to_number(text, m.lastindex is not None)


def _boolean(text: str) -> bool | None:
    return _BOOLEANS.get(text.lower()) if len(text) <= 5 else None


def _divide(a: int | float, b: int | float) -> int | float:
    """Java's division: exact by exact truncates toward zero."""
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    return a / b


_COMPARE: Final[dict[str, Cmp]] = {"=": operator.eq, "<>": operator.ne, "<": operator.lt,
                                  ">": operator.gt, "<=": operator.le, ">=": operator.ge}
_MIRROR: Final = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
_ARITH: Final[dict[str, Op]] = {"+": operator.add, "-": operator.sub, "*": operator.mul,
                                "/": _divide}


def _const(value: Value) -> Fn:
    return lambda h: value


def _header(key: str) -> Fn:
    return lambda h: h.get(key)


def _priority(h: Mapping[str, str]) -> Value:
    v = h.get("priority")
    return DEFAULT_PRIORITY if v is None else _number(v)


def _delivery_mode(h: Mapping[str, str]) -> Value:
    return "PERSISTENT" if h.get("persistent") == "true" else "NON_PERSISTENT"


def _converted(f: Fn, convert: Callable[[Any], Value]) -> Fn:
    """A header's text read as a number or a boolean (None when it does not read as one)."""
    def converted(h: Mapping[str, str]) -> Value:
        v = f(h)
        return None if v is None else convert(v)
    return converted


def _logical(fns: tuple[Fn, ...], wins: bool) -> Fn:
    """AND (FALSE wins) or OR (TRUE wins): the winner beats UNKNOWN, and stops evaluation."""
    if len(fns) == 2:  # the common case, unrolled
        f, g = fns

        def logical2(h: Mapping[str, str]) -> Value:
            a = f(h)
            if a is wins:
                return wins
            b = g(h)
            if b is wins:
                return wins
            return None if a is None or b is None else not wins
        return logical2

    def logical(h: Mapping[str, str]) -> Value:
        result: Value = not wins
        for f in fns:
            r = f(h)
            if r is wins:
                return wins
            if r is None:
                result = None
        return result
    return logical


def _not(f: Fn) -> Fn:
    def not_(h: Mapping[str, str]) -> Value:
        r = f(h)
        return None if r is None else not r
    return not_


def _arith(first: Fn, rest: tuple[tuple[Op, Fn], ...]) -> Fn:
    """A left-associative chain of one precedence (`a + b - c`), as a loop: no recursion."""
    def arith(h: Mapping[str, str]) -> Value:
        acc = first(h)
        if acc is None:
            return None
        for op, g in rest:
            b = g(h)
            if b is None:
                return None
            try:
                acc = op(acc, b)
            except ArithmeticError:  # division by zero
                return None
            if type(acc) is int and not _LONG_MIN <= acc <= _LONG_MAX:
                acc = float(acc)
        return None if acc != acc else acc  # NaN (inf - inf) is UNKNOWN
    return arith


def _compare(f: Fn, g: Fn, cmp: Cmp) -> Fn:
    def compare(h: Mapping[str, str]) -> Value:
        a = f(h)
        if a is None:
            return None
        b = g(h)
        return None if b is None else cmp(a, b)
    return compare


def _header_against(key: str, convert: Callable[[str], Value] | None, cmp: Cmp,
                    b: Value) -> Fn:
    """`color = 'red'`, `weight > 10` in one closure each: the hot path."""
    if b is None:
        return _const(None)
    if convert is None:
        def text(h: Mapping[str, str]) -> Value:
            v = h.get(key)
            return None if v is None else cmp(v, b)
        return text

    def converted(h: Mapping[str, str]) -> Value:
        v = h.get(key)
        if v is None:
            return None
        x = convert(v)
        return None if x is None else cmp(x, b)
    return converted


def _headers_compared(f: Fn, g: Fn, op: str) -> Fn:
    """Two headers: as numbers when both read as numbers, else as text (= and <> only)."""
    cmp, equality = _COMPARE[op], op in ("=", "<>")

    def compare(h: Mapping[str, str]) -> Value:
        a, b = f(h), g(h)
        if not isinstance(a, str) or not isinstance(b, str):
            return None
        x, y = _number(a), _number(b)
        if x is not None and y is not None:
            return cmp(x, y)
        return cmp(a, b) if equality else None
    return compare


class _Like:
    """A LIKE pattern as the fixed-length pieces between its `%`s, each matched at its
    leftmost place in turn: O(len(text) * len(pattern)), where one `.*` regex backtracks."""

    __slots__ = ("first", "last", "middle", "minimum", "skip", "tail", "whole")

    def __init__(self, pieces: list[tuple[str, int]]) -> None:
        rx = [re.compile(source, re.DOTALL) for source, _ in pieces]
        self.whole = rx[0] if len(rx) == 1 else None
        self.first, self.skip, self.last, self.tail = rx[0], pieces[0][1], rx[-1], pieces[-1][1]
        self.middle = [r for r, (_, n) in zip(rx[1:-1], pieces[1:-1], strict=True) if n]
        self.minimum = sum(n for _, n in pieces)

    def __call__(self, text: str) -> bool:
        if self.whole is not None:
            return self.whole.fullmatch(text) is not None
        if len(text) < self.minimum or self.first.match(text) is None:
            return False
        pos, end = self.skip, len(text) - self.tail
        for rx in self.middle:
            m = rx.search(text, pos, end)
            if m is None:
                return False
            pos = m.end()
        return self.last.match(text, end) is not None


def _like_pieces(pattern: str, escape: str | None) -> list[tuple[str, int]] | None:
    """The pieces between `%`s: a regex (`_` is `.`) and its length each. None: the
    pattern ends with its ESCAPE character."""
    pieces: list[tuple[str, int]] = []
    piece: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c == escape:
            c = next(chars, "")
            if not c:
                return None
            piece.append(re.escape(c))
        elif c == "%":
            pieces.append(("".join(piece), len(piece)))
            piece = []
        else:
            piece.append("." if c == "_" else re.escape(c))
    pieces.append(("".join(piece), len(piece)))
    return pieces


# ------------------------------------------------------------------------- parsing

class _Token(NamedTuple):
    kind: str  # num str id kw op end
    text: str  # as written; "" at the end
    pos: int  # 0-based
    value: Any  # the number, the string's content, the upper-cased keyword, the operator


class _Node(NamedTuple):
    kind: str  # NUM STR BOOL HDR
    fn: Fn
    tok: _Token  # its first token, for error messages
    key: str | None = None  # the header a plain identifier reads: the fast paths
    const: bool = False  # a literal, or arithmetic on literals (folded)


_KEYWORDS: Final = frozenset(
    ["NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE"])
_LEX: Final = re.compile(r"""
      (?P<ws>[ \t\f\r\n]+)
    | (?P<num>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<str>'(?:[^']|'')*')
    | (?P<id>(?:[^\W\d]|\$)[\w$]*)
    | (?P<op><>|<=|>=|[=<>+\-*/(),])""", re.VERBOSE)
_NUMBER_TAIL: Final = re.compile(r"[\w$.]+")
_HINTS: Final = {"!": ": use <> for not equal", '"': ": strings take single quotes"}
_CMP: Final = 4  # the comparisons' precedence; NOT's operand is parsed at it
_PREC: Final = {"OR": 1, "AND": 2, "=": _CMP, "<>": _CMP, "<": _CMP, ">": _CMP, "<=": _CMP,
                ">=": _CMP, "NOT": _CMP, "BETWEEN": _CMP, "IN": _CMP, "LIKE": _CMP,
                "IS": _CMP, "+": 5, "-": 5, "*": 6, "/": 6}


def _describe(tok: _Token) -> str:
    return "end of selector" if tok.kind == "end" else f"token {tok.text!r}"


def _folded(node: _Node) -> _Node:
    """Arithmetic on literals only (`-5`, `2 * 1024`) becomes a literal: fast paths see it."""
    return node._replace(fn=_const(node.fn({}))) if node.const else node


class _Parser:
    """Recursive descent, precedence climbing; types are checked as the nodes are built."""

    def __init__(self, text: str) -> None:
        self.text, self.i, self.depth = text, 0, 0
        self.toks = self.tokens()

    def fail(self, what: str, pos: int, hint: str = "") -> NoReturn:
        t = self.text
        shown = f"in {t!r}" if len(t) <= 120 else f"near {t[max(0, pos - 40):pos + 40]!r}"
        raise SelectorError(f"selector: {what} at position {pos} (0-based) {shown}{hint}")

    def unexpected(self, tok: _Token, hint: str = "") -> NoReturn:
        self.fail(f"unexpected {_describe(tok)}", tok.pos, hint)

    def tokens(self) -> list[_Token]:
        text, pos, out = self.text, 0, []
        while pos < len(text):
            m = _LEX.match(text, pos)
            if m is None:
                c = text[pos]
                if c == "'":
                    self.fail(f"unterminated string {text[pos:pos + 30]!r}", pos)
                self.fail(f"unexpected character {c!r}", pos, _HINTS.get(c, ""))
            kind, raw = m.lastgroup, m.group()
            value: Any = raw
            if kind == "num":
                tail = _NUMBER_TAIL.match(text, m.end())
                if tail is not None:
                    self.fail(f"malformed number {text[pos:tail.end()]!r}", pos)
                value = _to_number(raw, not raw.isdigit())
            elif kind == "str":
                value = raw[1:-1].replace("''", "'")
            elif kind == "id" and raw.isascii() and raw.upper() in _KEYWORDS:
                kind, value = "kw", raw.upper()  # (a non-ASCII name can upper() to one)
            if kind != "ws":
                out.append(_Token(kind or "", raw, pos, value))
            pos = m.end()
        return [*out, _Token("end", "", len(text), None)]

    def peek(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return tok

    def at(self, kind: str, *values: str) -> bool:
        tok = self.toks[self.i]
        return tok.kind == kind and tok.value in values

    def expect(self, kind: str, value: str) -> None:
        tok = self.take()
        if tok.kind != kind or tok.value != value:
            self.unexpected(tok, f": expected {value if kind == 'kw' else repr(value)}")

    def parse(self) -> Fn:
        node = self.expr(1)
        if self.peek().kind != "end":
            self.unexpected(self.peek())
        return self.condition(node).fn

    def expr(self, min_prec: int) -> _Node:
        """The operators of precedence min_prec and tighter, left to right."""
        left = self.prefix()
        while True:
            tok = self.peek()
            prec = _PREC.get(tok.value, 0) if tok.kind in ("op", "kw") else 0
            if prec < min_prec:
                return left
            if prec == _CMP:
                left = self.comparison(left)
                nxt = self.peek()
                if nxt.kind in ("op", "kw") and _PREC.get(nxt.value) == _CMP:
                    self.unexpected(nxt, ": comparisons do not chain, use parentheses")
            elif prec <= 2:  # AND, OR: one n-ary node per chain, not a deep tree
                parts = [self.condition(left).fn]
                while self.at("kw", tok.value):
                    self.take()
                    parts.append(self.condition(self.expr(prec + 1)).fn)
                left = _Node(BOOL, _logical(tuple(parts), wins=prec == 1), left.tok)
            else:
                first, const = self.number(left, tok), left.const
                rest: list[tuple[Op, Fn]] = []
                while (op := self.peek()).kind == "op" and _PREC.get(op.value) == prec:
                    self.take()
                    right = self.expr(prec + 1)
                    rest.append((_ARITH[op.value], self.number(right, op)))
                    const = const and right.const
                left = _folded(_Node(NUM, _arith(first, tuple(rest)), left.tok, const=const))

    def prefix(self) -> _Node:
        tok = self.take()
        if tok.kind == "num":
            return _Node(NUM, _const(tok.value), tok, const=True)
        if tok.kind == "str":
            return _Node(STR, _const(tok.value), tok, const=True)
        if tok.kind == "kw" and tok.value in ("TRUE", "FALSE"):
            return _Node(BOOL, _const(tok.value == "TRUE"), tok, const=True)
        if tok.kind == "id":
            if tok.text == "JMSPriority":
                return _Node(NUM, _priority, tok)
            if tok.text == "JMSDeliveryMode":
                return _Node(HDR, _delivery_mode, tok)
            key = JMS_HEADERS.get(tok.text, tok.text)
            return _Node(HDR, _header(key), tok, key=key)
        if tok.kind not in ("op", "kw") or tok.value not in ("(", "+", "-", "NOT"):
            self.unexpected(tok, ": use IS NULL" if tok.value == "NULL" else "")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"nesting deeper than {MAX_DEPTH} levels, {_describe(tok)}", tok.pos)
        if tok.value == "NOT":
            node = _Node(BOOL, _not(self.condition(self.expr(_CMP)).fn), tok)
        elif tok.value == "(":
            node = self.expr(1)
            self.expect("op", ")")
        else:  # a sign binds tighter than anything: its operand is a prefix
            node = self.prefix()
            f = self.number(node, tok)
            if tok.value == "-" or node.kind != NUM:
                node = _folded(_Node(NUM, _arith(_const(0), ((_ARITH[tok.value], f),)), tok,
                                     const=node.const))
        self.depth -= 1
        return node

    def condition(self, node: _Node) -> _Node:
        """A node used as TRUE/FALSE/UNKNOWN; a header alone reads `true` / `false`."""
        if node.kind == BOOL:
            return node
        if node.kind != HDR:
            self.fail(f"expected a condition, found the {node.kind} {_describe(node.tok)}",
                      node.tok.pos)
        return _Node(BOOL, _converted(node.fn, _boolean), node.tok)

    def number(self, node: _Node, op: _Token) -> Fn:
        if node.kind == NUM:
            return node.fn
        if node.kind != HDR:
            self.fail(f"{op.text!r} takes numbers, not the {node.kind} {_describe(node.tok)}",
                      node.tok.pos)
        return _converted(node.fn, _number)

    def comparison(self, left: _Node) -> _Node:
        tok = self.take()
        negate = tok.value == "NOT"
        if negate:
            tok = self.take()
            if tok.kind != "kw" or tok.value not in ("BETWEEN", "IN", "LIKE"):
                self.unexpected(tok, ": expected BETWEEN, IN or LIKE after NOT")
        if tok.kind == "op":
            fn = self.compare(tok.value, left, self.expr(_CMP + 1), tok)
        elif tok.value == "BETWEEN":
            low = self.expr(_CMP + 1)
            self.expect("kw", "AND")
            high = self.expr(_CMP + 1)
            fn = _logical((self.compare(">=", left, low, tok),
                           self.compare("<=", left, high, tok)), wins=False)
        elif tok.value == "IN":
            fn = self.in_list(left)
        elif tok.value == "LIKE":
            fn = self.like(left)
        else:  # IS [NOT] NULL
            is_not = self.at("kw", "NOT")
            if is_not:
                self.take()
            self.expect("kw", "NULL")
            f = left.fn
            fn = (lambda h: f(h) is not None) if is_not else (lambda h: f(h) is None)
        return _Node(BOOL, _not(fn) if negate else fn, left.tok)

    def compare(self, op: str, left: _Node, right: _Node, tok: _Token) -> Fn:
        kinds = {left.kind, right.kind}
        if op not in ("=", "<>") and kinds & {STR, BOOL}:
            what = "strings" if STR in kinds else "booleans"
            self.fail(f"{what} compare with = and <> only (JMS), not {_describe(tok)}", tok.pos)
        if kinds == {HDR}:
            return _headers_compared(left.fn, right.fn, op)
        domain = NUM if NUM in kinds else BOOL if BOOL in kinds else STR
        if not kinds <= {domain, HDR}:
            return _const(None)  # a string against a number, a boolean against a number
        convert = _number if domain == NUM else _boolean if domain == BOOL else None
        if right.const and left.key is not None:
            return _header_against(left.key, convert, _COMPARE[op], right.fn({}))
        if left.const and right.key is not None:
            return _header_against(right.key, convert, _COMPARE[_MIRROR[op]], left.fn({}))
        f, g = left.fn, right.fn
        if convert is not None:
            f = _converted(f, convert) if left.kind == HDR else f
            g = _converted(g, convert) if right.kind == HDR else g
        return _compare(f, g, _COMPARE[op])

    def in_list(self, left: _Node) -> Fn:
        if left.kind == BOOL:
            self.fail(f"IN takes a string or a number, not {_describe(left.tok)}", left.tok.pos)
        self.expect("op", "(")
        texts: set[str] = set()
        numbers: set[int | float] = set()
        while True:
            item = self.prefix()  # a literal, or a signed number
            if not item.const or item.kind not in (STR, NUM):
                self.unexpected(item.tok, ": IN lists strings and numbers")
            value = item.fn({})
            if isinstance(value, str):
                texts.add(value)
            elif isinstance(value, int | float):
                numbers.add(value)
            end = self.take()
            if end.kind == "op" and end.value == ")":
                break
            if end.kind != "op" or end.value != ",":
                self.unexpected(end, ": expected ',' or ')'")
        f, coerce = left.fn, left.kind == HDR and bool(numbers)

        def in_(h: Mapping[str, str]) -> Value:
            v = f(h)
            if v is None:
                return None
            if v in texts or v in numbers:
                return True
            n = _number(v) if coerce and isinstance(v, str) else None
            return n is not None and n in numbers
        return in_

    def like(self, left: _Node) -> Fn:
        pattern = self.take()
        if pattern.kind != "str":
            self.unexpected(pattern, ": LIKE takes a string literal")
        escape = None
        if self.at("kw", "ESCAPE"):
            self.take()
            e = self.take()
            if e.kind != "str" or len(e.value) != 1:
                self.unexpected(e, ": ESCAPE takes one character in quotes")
            escape = e.value
        if left.kind not in (HDR, STR):
            self.fail(f"LIKE takes a string, not the {left.kind} {_describe(left.tok)}",
                      left.tok.pos)
        pieces = _like_pieces(pattern.value, escape)
        if pieces is None:
            self.fail(f"the ESCAPE character ends the pattern {_describe(pattern)}",
                      pattern.pos)
        match, f = _Like(pieces), left.fn

        def like(h: Mapping[str, str]) -> Value:
            v = f(h)
            return None if v is None else match(v) if isinstance(v, str) else None
        return like
