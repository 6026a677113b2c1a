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

Values written many times are counted too: ``+`` and ``~`` (a loop doubling
a text), a list repeated with ``*`` by the text it holds, and every join
Jinja2 makes of a render, a ``{% set %}`` block or a macro (:func:`concat`),
so the render cap applies while the text is made, not after. What is left:
a loop that appends to a list or a namespace for as many rounds as its
input allows. Templates are configuration, written by whoever writes llm.yaml.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import filters, pass_eval_context
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter

MAX_REPEAT = 1_000_000          # items a sequence may be repeated to with ``*``; the widest field or padding
MAX_RENDER_CHARS = 10 * 1024 * 1024     # a render longer than any request body the host accepts
MAX_BUILT_CHARS = MAX_RENDER_CHARS      # what one replace, join or indent may build: no more than a whole render
# str methods and filters whose int argument is the length of what they build: 'x'|center(10**9)
# took 23 s and 1 GB; their width is bounded as ``*`` is.
WIDTH_METHODS = frozenset({'center', 'ljust', 'rjust', 'zfill', 'expandtabs'})
# One printf-style conversion: "%%", or "%" [(key)] [flags] [width|*] [.precision|*] (the type follows).
_PERCENT = re.compile(r'%(?:%|(\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?)')
_DIGITS = re.compile(r'\d+')


def concat(pieces: Any) -> str:
    """``''.join(pieces)``, refused once the pieces add up to more than MAX_RENDER_CHARS.

    Jinja2 joins every render, ``{% set %}`` block, macro and filter block with its
    environment's ``concat``: counted as they come, a template writing the same large
    value 200,000 times is stopped at the cap instead of being built first.
    """
    kept, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_RENDER_CHARS:
            raise SecurityError(f'a text of more than the limit of {MAX_RENDER_CHARS:,} characters')
        kept.append(piece)
    return ''.join(kept)


class BoundedCodeGenerator(CodeGenerator):
    """Compiles ``a ~ b ~ ...`` to the environment's bounded :func:`concat` (Jinja2's own ``str_join``
    would join any number of large values). The sandbox never autoescapes, so no Markup case."""

    def visit_Concat(self, node, frame) -> None:
        self.write('environment.concat(map(str, (')
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(', ')
        self.write(')))')


def check_sum(left: Any, right: Any) -> None:
    """``left + right`` of two texts or lists builds no more than MAX_BUILT_CHARS (a loop that doubles a
    value each time reaches gigabytes in 30 rounds)."""
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) and \
            len(left) + len(right) > MAX_BUILT_CHARS:
        raise SecurityError(f'a value of more than {MAX_BUILT_CHARS:,} items built with +')


class BoundedFormatter(SandboxedFormatter):
    """The sandbox's ``str.format``, refusing a field spec whose width or precision is huge
    (nested ``{:{w}}`` specs included: they are resolved by the time a field is formatted), and a
    result longer than MAX_BUILT_CHARS (``('{0}' * 300000).format(big)``), counted field by field."""

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._built = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        for digits in _DIGITS.findall(format_spec):
            check_width(digits)
        text = super().format_field(value, format_spec)
        self._built += len(text)
        if self._built > MAX_BUILT_CHARS:
            raise SecurityError(f'a format building more than {MAX_BUILT_CHARS:,} characters')
        return text


class BoundedEscapeFormatter(BoundedFormatter, SandboxedEscapeFormatter):
    pass


def check_width(digits: str) -> None:
    if len(digits) > 7 or int(digits) > MAX_REPEAT:
        raise SecurityError(f'a width or precision of more than {MAX_REPEAT} characters')


def check_percent(template: str, values: Any) -> None:
    """``template % values`` makes no field wider than MAX_REPEAT (a ``*`` takes its width from
    ``values``), and no more than MAX_BUILT_CHARS in all: ``'%(a)s' * 300000 % {'a': big}``.

    Counted field by field, so a long template stops at the first field past the bound.
    """
    positional = values if isinstance(values, tuple) else (values,)
    mapping = hasattr(values, 'get')
    lengths: dict[int, int] = {}        # by id: the same value in many fields is measured once
    size, index = len(template), 0
    for match in _PERCENT.finditer(template):
        if match.group(0) == '%%':
            continue
        key, width, precision = match.groups()
        for part in (width, precision):
            if part == '*':
                star = positional[index] if index < len(positional) else 0
                index += 1
                if isinstance(star, int) and abs(star) > MAX_REPEAT:
                    raise SecurityError(f'a width or precision of more than {MAX_REPEAT} characters')
                size += abs(star) if isinstance(star, int) else 0
            elif part:
                check_width(part)
                size += int(part)
        if key:
            value = values.get(key[1:-1]) if mapping else None
        else:
            value, index = (positional[index] if index < len(positional) else None), index + 1
        size += text_length(value, lengths)
        if size > MAX_BUILT_CHARS:
            raise SecurityError(f'a % format building more than {MAX_BUILT_CHARS:,} characters')


def text_length(value: Any, lengths: dict | None = None) -> int:
    """About how long ``str(value)`` is, found without building it (it may be gigabytes: a list
    holding one large text a million times); past MAX_BUILT_CHARS the count stops."""
    lengths = {} if lengths is None else lengths
    known = lengths.get(id(value))
    if known is not None:
        return known
    if isinstance(value, str):
        size = len(value)
    elif isinstance(value, (list, tuple, dict)):
        size = 2
        for item in (value.items() if isinstance(value, dict) else value):
            size += text_length(item, lengths) + 2
            if size > MAX_BUILT_CHARS:
                break
    else:
        size = len(str(value))      # numbers (bounded in bits), None, booleans, namespaces
    lengths[id(value)] = size
    return size


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
