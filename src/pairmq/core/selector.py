"""JMS message selectors: the SQL-92 subset of JMS 1.1/2.0 section 3.8.1, as ActiveMQ,
Artemis and TIBCO EMS implement it, evaluated on a message's STOMP headers.

A selector is compiled once (`compile_selector`; the compiler, core/selector_compiler.py,
reads this language) into a tree of closures, then `Selector.matches(headers)` runs per
message per selective subscriber: it never raises, whatever the header values, and is True
only when the selector is TRUE (`Selector.evaluate` gives the three-valued result: True,
False, None for UNKNOWN).

The language:
- Literals: strings in single quotes (`'it''s'` holds a quote); exact numbers (`57`);
  approximate numbers (`7.`, `7.5`, `.5`, `6.02E23`, `1e-3`); `TRUE` / `FALSE`. A sign is
  the unary operator: `-5`. Keywords are case-insensitive: NOT AND OR BETWEEN LIKE ESCAPE
  IN IS NULL TRUE FALSE.
- Identifiers follow Java's rules (letters, digits, `_`, `$`; not starting with a digit;
  not a keyword) and are case-sensitive. `-` is subtraction and `.` is not allowed, so a
  STOMP header whose name has either (`content-type`) cannot be named, as in ActiveMQ.
  The JMS header names in `JMS_HEADERS` (core/selector_compiler.py) read the STOMP header
  listed there; `JMSPriority` is 4 when absent, `JMSDeliveryMode` is 'PERSISTENT' with
  `persistent:true`, else 'NON_PERSISTENT'. Any other identifier reads the header of that
  name; absent is NULL.
- Header values are strings on the wire. One that reads as a number (ASCII digits, an
  optional sign, an optional fraction and exponent: `-12`, `2.5`, `1e3`; not `0x1F`, not
  ` 5`, not `1_000`) is that number when compared with a number or used in arithmetic;
  it stays its text when compared with a string (`weight = '3000'` with `weight:3000` is
  TRUE, and so is `weight = 3000.0`). `true` / `false` (any case) equal TRUE / FALSE.
  Two headers compared together compare as numbers when both read as numbers, else as
  text (with `=` and `<>` only: ordering two texts is UNKNOWN). A header that does not
  read as the type it meets (`weight > 10` with `weight:heavy`) makes it UNKNOWN.
- Operators, tightest first: unary `+ -`; `* /`; `+ -`; comparisons `= <> < > <= >=`,
  `[NOT] BETWEEN a AND b`, `[NOT] IN (literal, ...)`, `[NOT] LIKE 'pattern' [ESCAPE 'c']`,
  `IS [NOT] NULL` (none of these chain: `a = b = c` is an error); `NOT`; `AND`; `OR`.
  Parentheses group. A header alone is a condition: TRUE when it is `true`.
- Types, as JMS: numbers compare with numbers (exact against approximate by value);
  strings and booleans with `=` and `<>` only, so `name > 'm'` is refused when compiled
  (ActiveMQ orders strings; JMS does not). Values of different types (a string against a
  number, a boolean against a number) compare as UNKNOWN, not FALSE, so that
  `NOT (a = 1)` and `a <> 1` agree. Arithmetic takes numbers only (`'a' + 1` is refused);
  an exact number divided by an exact number truncates toward zero (Java's `long`
  division); an exact number beyond a `long`'s range becomes approximate (it does not
  wrap around, nor grow without bound); division by zero and NaN are UNKNOWN.
- Three-valued logic, as the JMS tables: a NULL operand makes a comparison, arithmetic,
  BETWEEN, IN and LIKE UNKNOWN; FALSE AND UNKNOWN = FALSE, TRUE OR UNKNOWN = TRUE,
  NOT UNKNOWN = UNKNOWN. `x BETWEEN a AND b` is `a <= x AND x <= b`.
- `IN` lists string literals (JMS) or numbers: a header is in the list when its text is
  one of the strings or, read as a number, equals one of the numbers; `JMSPriority IN
  (4, 5)` works too. `LIKE` takes a header (or a string): `JMSPriority LIKE '4'` is refused.
- `LIKE`: `%` any sequence, `_` one character, the ESCAPE character makes the next one
  literal. The pattern is matched piece by piece (the fixed-length pieces between `%`s,
  each as leftmost as it goes), not as one `.*` regular expression, whose backtracking
  takes seconds on a few hundred characters against a pattern like `'%a%a%a%a%b'`.
- Refused when compiled, with a `SelectorError` naming the 0-based position and the
  token: syntax errors, the type errors above, an empty selector, one longer than 4,096
  characters or nested (parentheses, NOT, signs) deeper than 100 levels.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pairmq.core.message import Message
from pairmq.core.selector_compiler import Fn, compile_text


class _Identified(Mapping[str, str]):
    """A message's headers with its id and destination, which are not stored among them."""

    __slots__ = ("_message",)

    def __init__(self, message: Message) -> None:
        self._message = message

    def __getitem__(self, key: str) -> str:
        if key == "message-id":
            return self._message.message_id
        if key == "destination":
            return self._message.destination
        return self._message.headers[key]

    def __iter__(self) -> Iterator[str]:
        yield "message-id"
        yield "destination"
        yield from self._message.headers

    def __len__(self) -> int:
        return len(self._message.headers) + 2


class Selector:
    """A compiled selector. Immutable and shared: evaluating it has no side effects."""

    __slots__ = ("_fn", "_identity", "text")

    def __init__(self, text: str, fn: Fn, identity: bool = False) -> None:
        self.text = text
        self._fn = fn
        self._identity = identity  # it reads JMSMessageID or JMSDestination

    def matches(self, headers: Mapping[str, str]) -> bool:
        """True only when the selector is TRUE for these headers (UNKNOWN does not match)."""
        return self._fn(headers) is True

    def matches_message(self, message: Message) -> bool:
        """`matches` for a message the broker holds: its id and destination are not among
        its stored headers (core/broker/intake.py), so a selector naming them reads them here."""
        if self._identity:
            return self._fn(_Identified(message)) is True
        return self._fn(message.headers) is True

    def evaluate(self, headers: Mapping[str, str]) -> bool | None:
        """The three-valued result: True, False, or None for UNKNOWN."""
        result = self._fn(headers)
        return None if result is None else bool(result)

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and type-check `text` once; raises SelectorError (core/selector_compiler.py)."""
    fn, identity = compile_text(text)
    return Selector(text, fn, identity)
