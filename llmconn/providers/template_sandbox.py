"""The Jinja2 sandbox template endpoints render in, and its error reporting.

:class:`TemplateSandbox` is :class:`~jinja2.sandbox.SandboxedEnvironment` -
not the immutable variant, since adapters build lists with ``.extend`` - with
its quiet failures made loud: reaching an internal attribute (``__class__``,
``mro``, a frame or a function's globals; through ``.``, ``[]``, ``|attr``,
``|map(attribute=...)`` or ``str.format``) raises :class:`SecurityError`
where the stock sandbox renders an empty string, and no one expression may
build a huge value: ``*`` / ``**`` are bounded, and so is every width or
precision (``'%400000000s' % x``, ``|format``, ``'{:>400000000}'.format``,
``'%*s'``, ``center`` and friends) and what ``replace`` and ``join`` may
build, and the text any join makes (:mod:`~llmconn.providers.template_bounds`).
Each is checked before the value is made, so a refusal costs milliseconds,
not the seconds and gigabytes the value would have.

Its only global is ``namespace``; ``fromjson`` joins the stock filters, and
``tojson`` names what is missing instead of failing to serialize it. Missing
variables and keys raise (``StrictUndefined``); test optional ones with
``is defined``. ``include``, ``import`` and ``extends`` are refused when a
template compiles: a template holds all of its own text.
"""

from __future__ import annotations

import json
from functools import update_wrapper
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, filters, nodes, pass_eval_context
from jinja2.exceptions import SecurityError
from jinja2.filters import do_tojson
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import Namespace

from llmconn.providers import template_bounds as bounds
from llmconn.providers.template_bounds import MAX_RENDER_CHARS, MAX_REPEAT

MAX_INT_BITS = 1 << 16          # ``9 ** 10 ** 9`` or repeated squaring would hold a worker for minutes
SHOWN_CHARS = 200               # of a rendered text quoted in an error
MAX_JSON_INDENT = 64            # tojson's indent is written again on every line of the JSON
_refused_tags = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)


class TemplateSandbox(SandboxedEnvironment):
    """The sandbox with its silent failures made loud and its arithmetic bounded."""

    intercepted_binops = frozenset({'*', '**', '%', '+'})
    code_generator_class = bounds.BoundedCodeGenerator
    concat = staticmethod(bounds.concat)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # The stock sandbox returns an undefined value, which renders as '' and hides the attempt.
        raise SecurityError(f'access to attribute {attribute!r} of a value of type {type(obj).__name__}')

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        # Loops can still build large values; these are the one-expression blow-ups.
        if operator == '%':
            if isinstance(left, str):
                bounds.check_percent(left, right)
            return left % right
        if operator == '+':
            bounds.check_sum(left, right)
            return left + right
        if isinstance(left, int) and isinstance(right, int):
            bits = left.bit_length() + right.bit_length() if operator == '*' else left.bit_length() * right
            if bits > MAX_INT_BITS:
                raise SecurityError(f'an integer of more than {MAX_INT_BITS} bits')
        elif operator == '*':
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_REPEAT:
                    raise SecurityError(f'a value repeated to more than {MAX_REPEAT} items')
                if isinstance(seq, (list, tuple)) and isinstance(times, int) and \
                        times * bounds.text_length(seq) > bounds.MAX_BUILT_CHARS:
                    raise SecurityError(f'a list repeated to more than {bounds.MAX_BUILT_CHARS:,} characters of text')
        return left * right if operator == '*' else left ** right

    def call(__self, __context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's names)
        if isinstance(getattr(__obj, '__self__', None), str):
            name = getattr(__obj, '__name__', '')
            if name in bounds.WIDTH_METHODS:
                bounds.check_widths(args, kwargs)
            elif name == 'replace':
                bounds.check_replace(__obj.__self__, *args, **kwargs)
            elif name == 'join' and len(args) == 1 and not kwargs:
                args = (bounds.check_join(__obj.__self__, args[0]),)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any):
        """``str.format`` / ``format_map`` as the stock sandbox wraps them, with every field's width bounded."""
        if super().wrap_str_format(value) is None:
            return None
        text, is_map = value.__self__, value.__name__ == 'format_map'
        formatter = bounds.BoundedEscapeFormatter(self, escape=text.escape) if hasattr(text, 'escape') \
            else bounds.BoundedFormatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError('format_map() takes exactly one argument')
                args, kwargs = (), args[0]
            return type(text)(formatter.vformat(text, args, kwargs))

        return update_wrapper(wrapper, value)


@pass_eval_context
def _tojson(eval_ctx, value: Any, indent: int | None = None) -> Any:
    # The stock filter would say "StrictUndefined is not JSON serializable"; say what is missing.
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    if isinstance(indent, (int, str)) and not isinstance(indent, bool) and \
            (len(indent) if isinstance(indent, str) else indent) > MAX_JSON_INDENT:
        raise SecurityError(f'a JSON indent of more than {MAX_JSON_INDENT} (it is repeated on every line)')
    return do_tojson(eval_ctx, value, indent)


def _fromjson(text: Any) -> Any:
    if isinstance(text, Undefined):
        text._fail_with_undefined_error()
    if not isinstance(text, str):
        raise ValueError(f'fromjson takes a str, got {type(text).__name__}')
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f'fromjson: the text is not JSON ({e}): {shown(text)}') from None


def environment() -> TemplateSandbox:
    """A fresh sandbox; each connection compiles its templates in its own."""
    env = TemplateSandbox(undefined=StrictUndefined, autoescape=False,
                          extensions=['jinja2.ext.do', 'jinja2.ext.loopcontrols'])
    env.globals.clear()                 # range, dict, lipsum, cycler, joiner: none is needed
    env.globals['namespace'] = Namespace
    env.filters['fromjson'] = _fromjson
    env.filters['tojson'] = _tojson
    env.filters['center'] = bounds.width_filter('center')
    env.filters['indent'] = bounds.indent_filter
    env.filters['format'] = bounds.format_filter
    env.filters['replace'] = bounds.replace_filter
    env.filters['join'] = bounds.join_filter
    env.filters['batch'] = bounds.count_filter('batch', filters.do_batch)
    env.filters['slice'] = bounds.count_filter('slice', filters.sync_do_slice)
    env.policies['json.dumps_kwargs'] = {'sort_keys': False}   # keep the author's key order
    return env


def compile_template(env: TemplateSandbox, source: str, label: str):
    """The compiled template, or a ValueError naming ``label`` and the line."""
    try:
        tree = env.parse(source, name=label, filename=label)
    except TemplateSyntaxError as e:
        raise ValueError(f'{label} line {e.lineno}: {e.message}') from None
    for node in tree.find_all(_refused_tags):
        raise ValueError(f'{label} line {node.lineno}: {type(node).__name__.lower()} is not available; '
                         f'a template holds all of its own text')
    try:
        code = env.compile(tree, name=label, filename=label)
    except TemplateSyntaxError as e:        # an unknown filter or test
        raise ValueError(f'{label} line {e.lineno}: {e.message}') from None
    return env.template_class.from_code(env, code, env.make_globals(None))


class RenderError(ValueError):
    """A template failed while rendering; the message names it and the line."""


def render(template, label: str, context: dict) -> str:
    """The template's text for ``context``, or a RenderError naming ``label``, the line and the cause."""
    try:
        text = template.render(context)
    except MemoryError:         # a loop or a .replace building a huge text; the message is empty
        raise RenderError(f'{label}: rendering ran out of memory (a loop or a value grown too large); '
                          f'fix the template') from None
    except Exception as e:      # the template is the boundary: whatever it raised, name it and its line
        kind = 'the sandbox refused ' if isinstance(e, SecurityError) else ''
        raise RenderError(f'{label}{_line(e, label)}: {kind}{e}; fix the template') from None
    if len(text) > MAX_RENDER_CHARS:
        raise RenderError(f'{label}: rendered {len(text):,} characters, more than the limit of '
                          f'{MAX_RENDER_CHARS:,}; fix the template')
    return text


def _line(error: BaseException, label: str) -> str:
    """`` line N`` of the template frame the error came from, if the traceback holds one."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f' line {line}' if line else ''


def shown(text: str) -> str:
    """``text`` on one line, cut to a length an error message can quote."""
    text = ' '.join(text.split())
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + '...'
