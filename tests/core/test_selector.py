"""JMS message selectors (core/selector.py): the JMS specification's own examples, the
three-valued logic, how header text meets numbers, strings and booleans, errors that name
the position and the token, and properties: evaluation never raises, NOT is the
three-valued complement, LIKE agrees with a plain regular expression."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.core.errors import CoreError
from pairmq.core.selector import compile_selector
from pairmq.core.selector_compiler import MAX_DEPTH, SelectorError

T, F, U = True, False, None  # U: UNKNOWN
CAR = {"type": "car", "color": "blue", "weight": "3000"}

# (selector, headers, expected three-valued result); matches() is True only for T.
CASES: list[tuple[str, dict[str, str], bool | None]] = [
    # the JMS specification's examples (JMS 1.1, 3.8.1.1)
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", CAR, T),
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", {**CAR, "weight": "2000"}, F),
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", {**CAR, "type": "van"}, F),
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", {"type": "car"}, U),
    ("phone LIKE '12%3'", {"phone": "123"}, T),
    ("phone LIKE '12%3'", {"phone": "12993"}, T),
    ("phone LIKE '12%3'", {"phone": "1234"}, F),
    ("word LIKE 'l_se'", {"word": "lose"}, T),
    ("word LIKE 'l_se'", {"word": "loose"}, F),
    ("underscored LIKE '\\_%' ESCAPE '\\'", {"underscored": "_foo"}, T),
    ("underscored LIKE '\\_%' ESCAPE '\\'", {"underscored": "bar"}, F),
    ("phone NOT LIKE '12%3'", {"phone": "123"}, F),
    ("phone NOT LIKE '12%3'", {"phone": "12993"}, F),
    ("phone NOT LIKE '12%3'", {"phone": "1234"}, T),
    ("phone NOT LIKE '12%3'", {}, U),
    ("age BETWEEN 15 AND 19", {"age": "15"}, T),
    ("age BETWEEN 15 AND 19", {"age": "19"}, T),
    ("age BETWEEN 15 AND 19", {"age": "20"}, F),
    ("age BETWEEN 15 AND 19", {"age": "14.9"}, F),
    ("age BETWEEN 15 AND 19", {}, U),
    ("age BETWEEN 15 AND 19", {"age": "old"}, U),
    ("age NOT BETWEEN 15 AND 19", {"age": "17"}, F),
    ("age NOT BETWEEN 15 AND 19", {"age": "20"}, T),
    ("age NOT BETWEEN 15 AND 19", {"age": "14"}, T),
    ("age NOT BETWEEN 15 AND 19", {}, U),
    ("Country IN ('UK', 'US', 'France')", {"Country": "UK"}, T),
    ("Country IN ('UK', 'US', 'France')", {"Country": "Peru"}, F),
    ("Country IN ('UK', 'US', 'France')", {}, U),
    ("Country NOT IN ('UK', 'US', 'France')", {"Country": "UK"}, F),
    ("Country NOT IN ('UK', 'US', 'France')", {"Country": "Peru"}, T),
    ("Country NOT IN ('UK', 'US', 'France')", {}, U),
    ("prop_name IS NULL", {}, T),
    ("prop_name IS NULL", {"prop_name": ""}, F),
    ("prop_name IS NOT NULL", {"prop_name": "x"}, T),
    ("prop_name IS NOT NULL", {}, F),
    # three-valued logic (the JMS truth tables)
    ("TRUE AND missing = 1", {}, U),
    ("FALSE AND missing = 1", {}, F),
    ("missing = 1 AND FALSE", {}, F),
    ("TRUE OR missing = 1", {}, T),
    ("missing = 1 OR TRUE", {}, T),
    ("FALSE OR missing = 1", {}, U),
    ("NOT (missing = 1)", {}, U),
    ("NOT TRUE", {}, F),
    ("NOT NOT TRUE", {}, T),
    ("missing <> 1", {}, U),
    ("a = 1 OR b = 1 OR c = 1", {"c": "1"}, T),
    ("a = 1 AND b = 1 AND c = 1", {"a": "1", "b": "1"}, U),
    # precedence: AND before OR, NOT before AND, * before +
    ("a = 1 OR b = 1 AND c = 1", {"a": "1", "b": "0", "c": "0"}, T),
    ("(a = 1 OR b = 1) AND c = 1", {"a": "1", "b": "0", "c": "0"}, F),
    ("NOT a = 1 AND b = 1", {"a": "2", "b": "1"}, T),
    # arithmetic
    ("a + b * 2 = 7", {"a": "1", "b": "3"}, T),
    ("(a + b) * 2 = 8", {"a": "1", "b": "3"}, T),
    ("10 - 2 - 3 = 5", {}, T),
    ("8 / 2 / 2 = 2", {}, T),
    ("a / 2 = 3", {"a": "7"}, T),  # exact / exact truncates, as Java's long
    ("-7 / 2 = -3", {}, T),  # toward zero
    ("a / 2.0 = 3.5", {"a": "7"}, T),
    ("a * 1.5 = 3", {"a": "2"}, T),
    ("-a = -5", {"a": "5"}, T),
    ("a - -1 = 6", {"a": "5"}, T),
    ("-2 * -3 = +6", {}, T),
    ("a / 0 = 1", {"a": "1"}, U),
    ("NOT (a / 0.0 = 1)", {"a": "1"}, U),
    ("a + 1 > 0", {}, U),
    ("a + 1 > 0", {"a": "one"}, U),
    ("a + 1 IS NULL", {"a": "one"}, T),
    # header text meeting numbers, strings and booleans
    ("weight = '3000'", {"weight": "3000"}, T),
    ("weight = 3000.0", {"weight": "3000"}, T),
    ("weight = '3000.0'", {"weight": "3000"}, F),
    ("weight > 10", {"weight": "heavy"}, U),
    ("NOT (weight > 10)", {"weight": "heavy"}, U),
    ("weight <> 10", {"weight": "heavy"}, U),
    ("code = 7", {"code": "007"}, T),
    ("code = '7'", {"code": "007"}, F),
    ("x = 1e3", {"x": "1000"}, T),
    ("x = 6.02E23", {"x": "6.02e23"}, T),
    ("x = 7.", {"x": "7"}, T),
    ("x > .5", {"x": "0.75"}, T),
    ("x = -12", {"x": "-12"}, T),
    ("x = 16", {"x": "0x10"}, U),
    ("x = 1000", {"x": "1_000"}, U),
    ("x = 5", {"x": " 5"}, U),
    ("x > 1", {"x": "9" * 5000}, T),  # beyond a long: a float (here inf)
    ("x = 9223372036854775807", {"x": "9223372036854775807"}, T),  # the largest long
    ("x * x * x > 1e56", {"x": "9223372036854775807"}, T),  # no wrap-around
    ("x - x = 0", {"x": "1e999"}, U),  # inf - inf: NaN
    ("5 = '5'", {}, U),
    ("f = TRUE", {"f": "true"}, T),
    ("f = TRUE", {"f": "TRUE"}, T),
    ("f = false", {"f": "False"}, T),
    ("f = TRUE", {"f": "yes"}, U),
    ("f = 1", {"f": "true"}, U),
    ("f", {"f": "true"}, T),
    ("NOT f", {"f": "false"}, T),
    ("f AND g", {"f": "true", "g": "maybe"}, U),
    ("(a = 1) = TRUE", {"a": "1"}, T),
    ("(a = 1) <> FALSE", {"a": "2"}, F),
    # two headers
    ("a = b", {"a": "5", "b": "5.0"}, T),
    ("a = b", {"a": "x", "b": "x"}, T),
    ("a <> b", {"a": "x", "b": "y"}, T),
    ("a < b", {"a": "2", "b": "10"}, T),  # as numbers, not as text
    ("a < b", {"a": "x", "b": "y"}, U),
    ("a = b", {"a": "x"}, U),
    # literals, keywords, identifiers
    ("name = 'O''Brien'", {"name": "O'Brien"}, T),
    ("name = ''", {"name": ""}, T),
    ("Color = 'red'", {"color": "red"}, U),  # identifiers are case-sensitive
    ("a between 1 and 3 or b in ('x') and not c is null", {"a": "2"}, T),
    ("$a_1 = 1 AND _b$ = 2", {"$a_1": "1", "_b$": "2"}, T),
    ("été = 'oui'", {"été": "oui"}, T),
    ("n IN (1, 2, -3)", {"n": "2.0"}, T),
    ("n IN (1, 2, -3)", {"n": "-3"}, T),
    ("n IN ('1', 2)", {"n": "01"}, F),
    ("n IN ('x')", {"n": "1"}, F),
    # LIKE
    ("s LIKE '%.txt'", {"s": "a.txt"}, T),
    ("s LIKE '%.txt'", {"s": "atxt"}, F),
    ("s LIKE 'a%b%c'", {"s": "abc"}, T),
    ("s LIKE 'a%b%c'", {"s": "axbyc"}, T),
    ("s LIKE 'a%b%c'", {"s": "acb"}, F),
    ("s LIKE 'a%a'", {"s": "a"}, F),
    ("s LIKE '%'", {"s": ""}, T),
    ("s LIKE ''", {"s": ""}, T),
    ("s LIKE 'a%'", {"s": "a\nb"}, T),
    ("s LIKE '_%_'", {"s": "ab"}, T),
    ("s LIKE '100!%' ESCAPE '!'", {"s": "100%"}, T),
    ("s LIKE '100!%' ESCAPE '!'", {"s": "1000"}, F),
    ("s LIKE '(a|b)*'", {"s": "(a|b)*"}, T),
    ("s LIKE 'x'", {"s": "5"}, F),
    ("s LIKE 'x'", {}, U),
    # the JMS header names
    ("JMSPriority = 4", {}, T),
    ("JMSPriority > 5", {"priority": "9"}, T),
    ("JMSPriority IN (4, 5)", {"priority": "5"}, T),
    ("JMSDeliveryMode = 'PERSISTENT'", {"persistent": "true"}, T),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", {}, T),
    ("JMSCorrelationID = 'c1'", {"correlation-id": "c1"}, T),
    ("JMSMessageID LIKE 'ID:%'", {"message-id": "ID:7"}, T),
    ("JMSTimestamp > 1000", {"timestamp": "1700000000000"}, T),
    ("JMSExpiration IS NULL", {}, T),
    ("JMSDestination = '/queue/a' AND JMSReplyTo = '/temp-queue/r'",
     {"destination": "/queue/a", "reply-to": "/temp-queue/r"}, T),
]


@pytest.mark.parametrize(("text", "headers", "expected"), CASES)
def test_selector_evaluates_as_jms(text: str, headers: dict[str, str],
                                   expected: bool | None) -> None:
    selector = compile_selector(text)
    assert selector.evaluate(headers) is expected
    assert selector.matches(headers) is (expected is True)
    assert selector.text == text


END = "end of selector"
# (selector, 0-based position, the token as the message names it)
BAD: list[tuple[str, int, str]] = [
    ("a = ", 4, END),
    ("a = 'x", 4, "\"'x\""),
    ("a == 1", 3, "'='"),
    ("(a = 1", 6, END),
    ("a IN ()", 6, "')'"),
    ("a LIKE 5", 7, "'5'"),
    ("1abc = 2", 0, "'1abc'"),
    ("a = 1 b", 6, "'b'"),
    ("a = 1 AND b = )", 14, "')'"),
    ("a = 1)", 5, "')'"),
    ("a = 1 = 2", 6, "'='"),
    ("a != 1", 2, "'!'"),
    ('a = "x"', 4, "'\"'"),
    ("a ~ 1", 2, "'~'"),
    ("a.b = 1", 1, "'.'"),
    ("a-b = 1 AND", 11, END),
    ("a = 1.2.3", 4, "'1.2.3'"),
    ("a = 1e", 4, "'1e'"),
    ("a NOT = 1", 6, "'='"),
    ("a IS 5", 5, "'5'"),
    ("a = NULL", 4, "'NULL'"),
    ("and = 1", 0, "'and'"),
    ("NOT", 3, END),
    ("a BETWEEN 1", 11, END),
    ("a BETWEEN 1 OR 2", 12, "'OR'"),
    ("a IN ('x',)", 10, "')'"),
    ("a IN ('x' 'y')", 10, "\"'y'\""),
    ("a IN ('x', b)", 11, "'b'"),
    ("a IN 'x'", 5, "\"'x'\""),
    ("a LIKE 'x' ESCAPE 'ab'", 18, "\"'ab'\""),
    ("a LIKE 'x' ESCAPE", 17, END),
    ("a LIKE 'x!' ESCAPE '!'", 7, "\"'x!'\""),
    ("a > 'x'", 2, "'>'"),
    ("a BETWEEN 'a' AND 'c'", 2, "'BETWEEN'"),
    ("TRUE < a", 5, "'<'"),
    ("'a' + 1", 0, "\"'a'\""),
    ("TRUE + 1", 0, "'TRUE'"),
    ("5", 0, "'5'"),
    ("'yes'", 0, "\"'yes'\""),
    ("a AND 5", 6, "'5'"),
    ("NOT 5", 4, "'5'"),
    ("JMSPriority LIKE '4'", 0, "'JMSPriority'"),
    ("(a = 1) IN ('x')", 1, "'a'"),
    ("(" * (MAX_DEPTH + 1) + "a" + ")" * (MAX_DEPTH + 1), MAX_DEPTH, "'('"),
    ("NOT " * (MAX_DEPTH + 1) + "a", 4 * MAX_DEPTH, "'NOT'"),
]


@pytest.mark.parametrize(("text", "position", "token"), BAD)
def test_a_bad_selector_is_refused_naming_position_and_token(text: str, position: int,
                                                             token: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    message = str(caught.value)
    assert message.startswith("selector: ")
    assert f"at position {position} (0-based)" in message
    assert token in message


def test_empty_and_oversized_selectors_are_refused() -> None:
    for text in ("", "   ", "\t\n"):
        with pytest.raises(SelectorError, match="empty"):
            compile_selector(text)
    with pytest.raises(SelectorError, match="too long"):
        compile_selector("a = 1 OR " * 500 + "a = 1")
    assert issubclass(SelectorError, CoreError)


def test_limits_that_are_allowed_evaluate_without_recursion_errors() -> None:
    nested = "(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH
    assert compile_selector(nested).matches({"a": "1"})
    chain = " OR ".join(f"a={i}" for i in range(400))  # one n-ary node, not 400 levels
    assert len(chain) < 4096
    assert compile_selector(chain).matches({"a": "399"})
    sums = "1" + " + a" * 1000 + " > 0"
    assert compile_selector(sums).matches({"a": "1"})


def test_like_does_not_backtrack_on_a_long_value() -> None:
    """One `.*` regex takes seconds here (its backtracking is polynomial in the value)."""
    selector = compile_selector("s LIKE '%a%a%a%a%a%a%b'")
    started = time.perf_counter()
    assert not selector.matches({"s": "a" * 20_000})
    assert selector.matches({"s": "a" * 20_000 + "b"})
    assert time.perf_counter() - started < 1.0


# ------------------------------------------------------------------------- properties

KEYS = ["a", "b", "s", "priority", "persistent", "type"]
VALUES = st.one_of(
    st.text(max_size=8),
    st.integers(-(10**6), 10**6).map(str),
    st.floats().map(str),  # '1e+300', 'inf', 'nan', '-0.0'
    st.sampled_from(["0", "-0", ".5", "7.", "1e3", "1e999", "true", "FALSE", "9" * 5000, "",
                     "%", "_", "'", "\x00", "١٢", "0x1F", " 5"]),
)
HEADERS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=len(KEYS))

FIXED = [compile_selector(text) for text, _, _ in CASES] + [
    compile_selector(text) for text in (
        "a * b / (a - b) > -1e308 OR a / b < 0.5",
        "a + b = a * b AND a - b <> b / a",
        "a = b OR a <> b OR a < b OR a >= b",
        "s LIKE '%a_b%' OR s NOT LIKE '_' OR s IN ('x', 1, -2.5)",
        "JMSPriority * a BETWEEN b AND 9 OR JMSDeliveryMode = JMSType",
        "a OR b OR NOT s",
    )]


@settings(max_examples=200, deadline=None)
@given(HEADERS)
def test_evaluation_never_raises(headers: dict[str, str]) -> None:
    for selector in FIXED:
        result = selector.evaluate(headers)
        assert result in (True, False, None)
        assert selector.matches(headers) is (result is True)


def _numeric() -> st.SearchStrategy[str]:
    leaf = st.one_of(st.sampled_from(["a", "b", "JMSPriority"]),
                     st.integers(-3, 3).map(str), st.sampled_from(["0.5", "1e1", "2."]))
    return st.recursive(leaf, lambda e: st.tuples(e, st.sampled_from("+-*/"), e).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"), max_leaves=4)


def _condition() -> st.SearchStrategy[str]:
    num = _numeric()
    text = st.sampled_from(["a", "s", "'x'", "'1'", "''"])
    leaf = st.one_of(
        st.tuples(num, st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), num).map(" ".join),
        st.tuples(text, st.sampled_from(["=", "<>"]), text).map(" ".join),
        st.tuples(num, st.sampled_from(["BETWEEN", "NOT BETWEEN"]), num, num).map(
            lambda t: f"{t[0]} {t[1]} {t[2]} AND {t[3]}"),
        st.tuples(st.sampled_from(["a", "s"]), st.sampled_from(["LIKE", "NOT LIKE"]),
                  st.sampled_from(["'%'", "'1%'", "'_'", "'x%y'"])).map(" ".join),
        st.tuples(st.sampled_from(["a", "s"]), st.sampled_from(["IN", "NOT IN"])).map(
            lambda t: f"{t[0]} {t[1]} ('x', '1', 2)"),
        st.sampled_from(["a IS NULL", "s IS NOT NULL", "a", "TRUE", "FALSE", "a = TRUE"]),
    )
    return st.recursive(leaf, lambda c: st.one_of(
        c.map(lambda x: f"NOT ({x})"),
        st.tuples(c, st.sampled_from(["AND", "OR"]), c).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
    ), max_leaves=6)


COMPLEMENT = {True: False, False: True, None: None}


@settings(max_examples=150, deadline=None)
@given(_condition(), HEADERS)
def test_not_is_the_three_valued_complement(text: str, headers: dict[str, str]) -> None:
    selector, negated = compile_selector(text), compile_selector(f"NOT ({text})")
    result = selector.evaluate(headers)
    assert negated.evaluate(headers) is COMPLEMENT[result]
    assert not (selector.matches(headers) and negated.matches(headers))
    either = compile_selector(f"({text}) OR NOT ({text})")
    assert either.evaluate(headers) is (None if result is None else True)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_compiling_any_text_raises_only_selector_error(text: str) -> None:
    try:
        compile_selector(text)
    except SelectorError as e:
        assert "selector: " in str(e)


def _as_regex(pattern: str, escape: str) -> str | None:
    """The obvious translation: `%` is `.*`, `_` is `.`; None when ESCAPE ends it."""
    out, chars = [], iter(pattern)
    for c in chars:
        if c == escape:
            escaped = next(chars, None)
            if escaped is None:
                return None
            out.append(re.escape(escaped))
        else:
            out.append({"%": ".*", "_": "."}.get(c, re.escape(c)))
    return "".join(out)


@settings(max_examples=150, deadline=None)
@given(st.text("ab%_!", max_size=8), st.text("ab%_!\n", max_size=10))
def test_like_agrees_with_a_backtracking_regular_expression(pattern: str, value: str) -> None:
    """The piecewise matcher finds what one `.*` regex finds, on values short enough."""
    text = f"s LIKE '{pattern}' ESCAPE '!'"
    source = _as_regex(pattern, "!")
    if source is None:
        with pytest.raises(SelectorError, match="ESCAPE"):
            compile_selector(text)
        return
    expected = re.fullmatch(source, value, re.DOTALL) is not None
    assert compile_selector(text).matches({"s": value}) is expected


def test_exact_arithmetic_stays_within_a_long_so_it_stays_cheap() -> None:
    """Python's ints grow without bound: 1,000 products of a 5,000-digit value would take
    minutes; beyond a Java long they are floats."""
    selector = compile_selector("1" + " * a" * 1000 + " > 0")
    started = time.perf_counter()
    assert selector.matches({"a": "9" * 5000})
    assert selector.matches({"a": "9" * 19})
    assert time.perf_counter() - started < 0.5
