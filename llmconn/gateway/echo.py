"""How a client's own value appears in a gateway error: escaped, and never longer than a line.

An error naming what was wrong helps (``The model 'Suport' does not
exist``), but quoting the value whole does not: a 1 MB ``model`` would come
back whole, and a value holding newlines or terminal escapes would reach
the client's logs raw. :func:`shown` quotes a value as ``repr`` does
(control characters escaped), cut to :data:`MAX_ECHO_CHARS`; :func:`param`
is the same cut for the ``param`` field, without quotes.

:func:`bounded` is the last guard, applied to every error the gateway
sends: a message or ``param`` still too long (a backend's own error text,
a library's message) is cut, and its control characters escaped.
"""

from __future__ import annotations

from typing import Any, Iterable

MAX_ECHO_CHARS = 64             # of a client's value quoted in an error
MAX_ECHOED_VALUES = 5           # of a list of them (unknown loss names, call ids)
MAX_MESSAGE_CHARS = 2000        # of a whole error message, whatever it quotes
MAX_PARAM_CHARS = 128           # of the param field (a path such as input[3].content[0].type)
ELLIPSIS = '…'
_CONTROL = {c: repr(chr(c))[1:-1] for c in (*range(32), 127)}
_CONTROL.update({0x2028: '\\u2028', 0x2029: '\\u2029'})       # line separators some clients break on


def shown(value: Any) -> str:
    """``value`` as an error may quote it: a string repr-escaped and cut, other JSON values by kind."""
    if isinstance(value, str):
        if len(value) <= MAX_ECHO_CHARS:
            return repr(value)
        return f'{value[:MAX_ECHO_CHARS]!r}{ELLIPSIS} ({len(value)} characters)'
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
        return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + ELLIPSIS
    if isinstance(value, list):
        return 'a list'
    if isinstance(value, dict):
        return 'an object'
    return f'a {type(value).__name__}'


def shown_all(values: Iterable[Any]) -> str:
    """Several values, each :func:`shown`, at most :data:`MAX_ECHOED_VALUES` of them."""
    values = list(values)
    text = ', '.join(shown(v) for v in values[:MAX_ECHOED_VALUES])
    more = len(values) - MAX_ECHOED_VALUES
    return f'{text} and {more} more' if more > 0 else text


def param(value: str) -> str:
    """A client's field name as the ``param`` of an error: control characters escaped, cut."""
    text = value.translate(_CONTROL)
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + ELLIPSIS


def bounded(text: str | None, limit: int = MAX_MESSAGE_CHARS) -> str | None:
    """Any text of an error: control characters escaped, and cut to ``limit`` characters."""
    if text is None:
        return None
    text = text[:limit * 4].translate(_CONTROL)     # escapes can grow it fourfold: cut once before, once after
    text = text.encode('utf-8', 'backslashreplace').decode('utf-8')        # a lone surrogate, escaped
    return text if len(text) <= limit else text[:limit] + ELLIPSIS
