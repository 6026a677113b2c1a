"""Bounds on what one template expression may build, checked before the value is built.

A width, a precision, a replacement or a separator is cheap to write and
expensive to honour: ``'%400000000s' % 'x'``, ``'{:>400000000}'.format(x)``,
``('x' * 10**6).replace('x', 'y' * 440)`` each built ~440 MB, for seconds,
before the render cap saw the result. The sandbox
(:mod:`llmconn.providers.template_sandbox`) calls these checks from its
``%`` operator, its ``str`` method calls and ``str.format``, and uses the
filters below in place of the stock ``format``, ``replace``, ``join``,
``indent``, ``center``, ``batch`` and ``slice``. Each check counts what the
value would hold and raises :class:`SecurityError` past the bound.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import filters, pass_eval_context
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter

MAX_REPEAT = 1_000_000          # items a sequence may be repeated to with ``*``; the widest field or padding
MAX_RENDER_CHARS = 10 * 1024 * 1024     # a render longer than any request body the host accepts
MAX_BUILT_CHARS = MAX_RENDER_CHARS      # what one replace, join or indent may build: no more than a whole render
# str methods and filters whose int argument is the length of what they build: 'x'|center(10**9)
# took 23 s and 1 GB; their width is bounded as ``*`` is.
WIDTH_METHODS = frozenset({'center', 'ljust', 'rjust', 'zfill', 'expandtabs'})
# One printf-style conversion: "%%", or "%" [(key)] [flags] [width|*] [.precision|*] (the type follows).
_PERCENT = re.compile(r'%(?:%|(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?)')
_DIGITS = re.compile(r'\d+')


class BoundedFormatter(SandboxedFormatter):
    """The sandbox's ``str.format``, refusing a field spec whose width or precision is huge
    (nested ``{:{w}}`` specs included: they are resolved by the time a field is formatted)."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        for digits in _DIGITS.findall(format_spec):
            check_width(digits)
        return super().format_field(value, format_spec)


class BoundedEscapeFormatter(BoundedFormatter, SandboxedEscapeFormatter):
    pass


def check_width(digits: str) -> None:
    if len(digits) > 7 or int(digits) > MAX_REPEAT:
        raise SecurityError(f'a width or precision of more than {MAX_REPEAT} characters')


def check_percent(template: str, values: Any) -> None:
    """``template % values`` makes no field wider than MAX_REPEAT (a ``*`` takes its width from ``values``)."""
    stars = False
    for match in _PERCENT.finditer(template):
        for part in match.groups():
            if part == '*':
                stars = True
            elif part:
                check_width(part)
    if stars:
        for value in values if isinstance(values, tuple) else (values,):
            if isinstance(value, int) and abs(value) > MAX_REPEAT:
                raise SecurityError(f'a width or precision of more than {MAX_REPEAT} characters')


def check_replace(text: str, old: Any = '', new: Any = '', count: Any = -1, *_: Any, **__: Any) -> None:
    """``text.replace(old, new, count)`` would build no more than MAX_BUILT_CHARS (counted, not built)."""
    if not (isinstance(old, str) and isinstance(new, str)) or len(new) <= len(old):
        return      # shrinks or fails on its own
    found = len(text) + 1 if not old else text.count(old)
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    if len(text) + found * (len(new) - len(old)) > MAX_BUILT_CHARS:
        raise SecurityError(f'a replace building more than {MAX_BUILT_CHARS:,} characters')


def check_join(separator: str, items: Any) -> Any:
    """The items of ``separator.join(items)``, once it is known the text stays within MAX_BUILT_CHARS."""
    items = list(items)
    size = len(separator) * max(0, len(items) - 1)
    for item in items:
        size += len(item) if isinstance(item, str) else 0
        if size > MAX_BUILT_CHARS:
            raise SecurityError(f'a join building more than {MAX_BUILT_CHARS:,} characters')
    return items


def check_widths(args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and value > MAX_REPEAT:
            raise SecurityError(f'a text padded to more than {MAX_REPEAT} characters')


def width_filter(name: str):
    stock = SandboxedEnvironment().filters[name]

    def bounded(value: Any, *args: Any, **kwargs: Any) -> Any:
        check_widths(args, kwargs)
        return stock(value, *args, **kwargs)

    return bounded


def format_filter(value: Any, *args: Any, **kwargs: Any) -> str:
    check_percent(str(value), kwargs or args)        # the filter is "value % (kwargs or args)"
    return filters.do_format(value, *args, **kwargs)


@pass_eval_context
def replace_filter(eval_ctx, text: Any, old: Any, new: Any, count: int | None = None) -> str:
    check_replace(str(text), str(old), str(new), -1 if count is None else count)
    return filters.do_replace(eval_ctx, text, old, new, count)


@pass_eval_context
def join_filter(eval_ctx, value: Any, d: Any = '', attribute: Any = None) -> str:
    if attribute is not None:
        value = map(filters.make_attrgetter(eval_ctx.environment, attribute), value)
    return filters.sync_do_join(eval_ctx, check_join(str(d), [str(item) for item in value]), d)


def indent_filter(text: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    size = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    if size > MAX_REPEAT or len(str(text)) + size * (str(text).count('\n') + 1) > MAX_BUILT_CHARS:
        raise SecurityError(f'a text padded to more than {min(size, MAX_BUILT_CHARS):,} characters by indent')
    return filters.do_indent(text, width, first, blank)


def count_filter(name: str, stock):
    """``batch`` and ``slice``: their count is how many items (or lists) they make, fill included."""
    def bounded(value: Any, count: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(count, int) and count > MAX_REPEAT:
            raise SecurityError(f'{name} into more than {MAX_REPEAT} parts')
        return stock(value, count, *args, **kwargs)

    return bounded
