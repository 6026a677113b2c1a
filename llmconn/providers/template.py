"""Template endpoints (``provider: template``): any HTTP model described by two Jinja2 templates.

The request template renders the JSON body from ``input.messages`` (the
system prompt, the window's user and assistant messages, the new user
message), ``model_info.model_key``, ``kwargs`` (the connection's ``params``
overlaid by the call's) and ``secret``. The response template sees the
answer as it came - ``body`` (text), ``status_code``, ``headers`` (names
lower-cased), error statuses included, after the transport's retries - and
renders::

    {"choices": [{"message": {"role": "assistant", "content": "...", ...extras}}],
     "usage": {"num_prompt_tokens": N, "num_completion_tokens": M}}     (usage optional)

or ``{"error": "..."}``. The extras (a ``response_id``, a ``thread_id``) are
stored with the turn and come back on that assistant message in every later
request while the turn is in the window: that is how a stateful endpoint's
state id travels from one answer to the next request.

Templates run in a :class:`~jinja2.sandbox.SandboxedEnvironment` (not the
immutable one: building lists with ``.extend`` is a common idiom) whose only
global is ``namespace`` and whose extra filter is ``fromjson``. Reaching an
internal attribute (``__class__``, ``mro``, a frame, a function's globals,
through ``.``, ``[]``, ``|attr`` or ``str.format``) raises at once instead
of rendering empty; ``include``/``import``/``extends`` are refused at load;
``*`` and ``**`` cannot build huge values. A missing variable or key is an
error too (``StrictUndefined``), so a typo is reported instead of sending a
body with a hole in it; test with ``is defined``.

Syntax errors are found at load (a ``ValueError`` that config turns into a
ConfigError naming the connection, the template and the line); a failing
render or a result of the wrong shape is an :class:`LLMError` naming the
template, the line and what is missing, with the secret masked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, nodes, pass_eval_context
from jinja2.exceptions import SecurityError
from jinja2.filters import do_tojson
from jinja2.sandbox import SandboxedEnvironment
from jinja2.utils import Namespace

from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited
from llmconn.providers.base import SYSTEM, Provider
from llmconn.redact import scrub
from llmconn.types import HTTPAnswer, Reply, Request

if TYPE_CHECKING:
    from llmconn.config import ConnectionConfig

REQUEST = 'request_template'
RESPONSE = 'response_template'
MAX_TEMPLATE_FILE_BYTES = 1 << 20
MAX_EXTRAS_CHARS = 64 * 1024    # extras are stored with every turn and sent back while it is in the window
MAX_REPEAT = 1_000_000          # items a sequence may be repeated to with ``*``
MAX_INT_BITS = 1 << 16          # ``9 ** 10 ** 9`` or repeated squaring would hold a worker for minutes
SHOWN_CHARS = 200               # of a rendered text quoted in an error
MESSAGE_FIELDS = ('role', 'content')
_header_name = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_refused_tags = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)


class TemplateSandbox(SandboxedEnvironment):
    """The sandbox with its silent failures made loud and its arithmetic bounded."""

    intercepted_binops = frozenset({'*', '**'})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # The stock sandbox returns an undefined value, which renders as '' and hides the attempt.
        raise SecurityError(f'access to attribute {attribute!r} of a value of type {type(obj).__name__}')

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        # Loops can still build large values; these are the one-expression blow-ups.
        if isinstance(left, int) and isinstance(right, int):
            bits = left.bit_length() + right.bit_length() if operator == '*' else left.bit_length() * right
            if bits > MAX_INT_BITS:
                raise SecurityError(f'an integer of more than {MAX_INT_BITS} bits')
        elif operator == '*':
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_REPEAT:
                    raise SecurityError(f'a value repeated to more than {MAX_REPEAT} items')
        return left * right if operator == '*' else left ** right


@pass_eval_context
def _tojson(eval_ctx, value: Any, indent: int | None = None) -> Any:
    # The stock filter would say "StrictUndefined is not JSON serializable"; say what is missing.
    if isinstance(value, Undefined):
        value._fail_with_undefined_error()
    return do_tojson(eval_ctx, value, indent)


def _fromjson(text: Any) -> Any:
    if isinstance(text, Undefined):
        text._fail_with_undefined_error()
    if not isinstance(text, str):
        raise ValueError(f'fromjson takes a str, got {type(text).__name__}')
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f'fromjson: the text is not JSON ({e}): {_shown(text)}') from None


def environment() -> TemplateSandbox:
    env = TemplateSandbox(undefined=StrictUndefined, autoescape=False,
                          extensions=['jinja2.ext.do', 'jinja2.ext.loopcontrols'])
    env.globals.clear()                 # range, dict, lipsum, cycler, joiner: none is needed
    env.globals['namespace'] = Namespace
    env.filters['fromjson'] = _fromjson
    env.filters['tojson'] = _tojson
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
    try:
        return template.render(context)
    except Exception as e:      # the template is the boundary: whatever it raised, name it and its line
        kind = 'the sandbox refused ' if isinstance(e, SecurityError) else ''
        raise RenderError(f'{label}{_line(e, label)}: {kind}{e}; fix the template') from None


class TemplateProvider(Provider):
    """An endpoint declared in YAML: one request template, one response template."""

    name = 'template'
    default_address = ''
    capabilities = frozenset({SYSTEM})      # no streaming, no tools: a template renders one whole answer
    raw_answers = True

    def __init__(self, conf: 'ConnectionConfig') -> None:
        super().__init__(conf)
        self.http_method = conf.method
        env = environment()
        self._request = compile_template(env, conf.request_template, _label(conf, REQUEST))
        self._response = compile_template(env, conf.response_template, _label(conf, RESPONSE))
        self._headers = {name: compile_template(env, value, f'headers.{name}') for name, value in conf.headers.items()}

    @classmethod
    def read_files(cls, conf: 'ConnectionConfig', base_dir: Path) -> 'ConnectionConfig':
        update = {}
        for key in (REQUEST, RESPONSE):
            name = getattr(conf, f'{key}_file')
            if name:
                update[key] = _read(base_dir / name, f'{key}_file')
        return conf.model_copy(update=update) if update else conf

    @classmethod
    def check_config(cls, conf: 'ConnectionConfig') -> None:
        super().check_config(conf)
        if not conf.address:
            raise ValueError('field "address": provider template needs the endpoint\'s full URL')
        for key in (REQUEST, RESPONSE):
            if not getattr(conf, key):
                raise ValueError(f'field "{key}": provider template needs {key} or {key}_file')
        for name in conf.headers:
            if not _header_name.match(name):
                raise ValueError(f'field "headers": {name!r} is not a valid header name')
        try:
            cls(conf).headers()     # compiles every template and renders the headers once
        except ValueError as e:
            raise ValueError(scrub(str(e), conf.secret_value)) from None

    def url(self, stream: bool = False) -> str:
        return self.conf.address

    def ping_url(self) -> str:
        return ''       # no cheap GET is known: ping asks a one-word question

    def headers(self) -> dict[str, str]:
        """Rendered once per connection, from ``secret`` and ``model_info`` (ValueError when one fails)."""
        context = {'secret': self.conf.secret_value, 'model_info': self._model_info()}
        headers = {'content-type': 'application/json'}
        for name, template in self._headers.items():
            value = render(template, f'headers.{name}', context)
            if '\r' in value or '\n' in value:
                raise ValueError(f'headers.{name} renders a line break, which no header may hold')
            headers[name.lower()] = value
        return headers

    def build_request(self, request: Request) -> Any:
        context = {'input': {'messages': _messages(request)}, 'model_info': self._model_info(),
                   'kwargs': self.body_params(request), 'secret': self.conf.secret_value}
        label = _label(self.conf, REQUEST)
        text = self._render(self._request, label, context)
        try:
            return json.loads(text)
        except ValueError as e:
            raise self._fail(f'{label} did not render JSON ({e}): {_shown(text)}') from None

    def parse_response(self, answer: HTTPAnswer) -> Reply:
        context = {'body': answer.text, 'status_code': answer.status, 'headers': dict(answer.headers)}
        label = _label(self.conf, RESPONSE)
        text = self._render(self._response, label, context, answer)
        try:
            shape = json.loads(text)
        except ValueError as e:
            raise self._fail(f'{label} did not render JSON ({e}): {_shown(text)}', answer) from None
        if isinstance(shape, dict) and 'error' in shape:
            raise self._fail(f'{label} reported an error: {shape["error"]}', answer)
        message, usage = _reply_shape(shape, label, self._fail, answer)
        extras = {k: v for k, v in message.items() if k not in MESSAGE_FIELDS}
        if len(json.dumps(extras)) > MAX_EXTRAS_CHARS:
            raise self._fail(f'{label}: the message\'s extra fields take more than {MAX_EXTRAS_CHARS} characters '
                             f'of JSON; keep only the ids the next request needs', answer)
        return Reply(text=message['content'], input_tokens=usage[0], output_tokens=usage[1],
                     raw=_body(answer.text), meta=extras)

    # ---- internals

    def _model_info(self) -> dict:
        return {'model_key': self.conf.model}

    def _render(self, template, label: str, context: dict, answer: HTTPAnswer | None = None) -> str:
        try:
            return render(template, label, context)
        except RenderError as e:
            raise self._fail(str(e), answer) from None

    def _fail(self, message: str, answer: HTTPAnswer | None = None) -> LLMError:
        """An LLMError for a render or an answer, secret masked; its class follows the HTTP status."""
        secret = self.conf.secret_value
        status = answer.status if answer is not None else None
        if status is not None and status >= 400:
            message += f' (HTTP {status}: {_shown(answer.text)})'
        cls = {401: LLMAuthError, 403: LLMAuthError, 429: LLMRateLimited, 529: LLMRateLimited}.get(status, LLMError)
        body = scrub(_body(answer.text), secret) if answer is not None else None
        return cls(scrub(f'{self.conf.name}: {message}', secret), status=status, provider_body=body,
                   connection=self.conf.name)


def _messages(request: Request) -> list[dict]:
    """System, the window, the new message; each assistant message carries its turn's extras."""
    messages = [{'role': 'system', 'content': request.system}] if request.system else []
    for turn in request.history:
        messages.append({'role': 'user', 'content': turn.user})
        messages.append({**turn.meta, 'role': 'assistant', 'content': turn.assistant})
    messages.append({'role': 'user', 'content': request.text})
    return messages


def _reply_shape(shape: Any, label: str, fail, answer: HTTPAnswer) -> tuple[Mapping, tuple[int, int]]:
    """The message and the token counts of a rendered reply, or an LLMError saying what is missing."""
    def missing(what: str) -> LLMError:
        return fail(f'{label} rendered no {what}: expected {{"choices": [{{"message": {{"role": "assistant", '
                    f'"content": str}}}}], "usage": {{...}}}} or {{"error": str}}, got {_shown(json.dumps(shape))}',
                    answer)

    choices = shape.get('choices') if isinstance(shape, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise missing('"choices" list with a first choice')
    message = choices[0].get('message')
    if not isinstance(message, dict):
        raise missing('choices[0].message object')
    if not isinstance(message.get('content'), str):
        raise missing('choices[0].message.content string')
    if message.get('role', 'assistant') != 'assistant':
        raise missing('choices[0].message.role "assistant"')
    usage = shape.get('usage')
    if usage is None:
        return message, (0, 0)
    counts = [usage.get(k) if isinstance(usage, dict) else None for k in ('num_prompt_tokens', 'num_completion_tokens')]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise missing('usage with num_prompt_tokens and num_completion_tokens as counts')
    return message, (counts[0], counts[1])


def _label(conf: 'ConnectionConfig', key: str) -> str:
    path = getattr(conf, f'{key}_file')
    return f'{key} ({path})' if path else key


def _line(error: BaseException, label: str) -> str:
    """`` line N`` of the template frame the error came from, if the traceback holds one."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == label:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f' line {line}' if line else ''


def _read(path: Path, key: str) -> str:
    try:
        with path.open('rb') as f:
            data = f.read(MAX_TEMPLATE_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f'field "{key}": cannot read {path} ({e.strerror}); a relative path is read from '
                         f'the configuration file\'s directory') from None
    if len(data) > MAX_TEMPLATE_FILE_BYTES:
        raise ValueError(f'field "{key}": {path} is larger than {MAX_TEMPLATE_FILE_BYTES} bytes')
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError:
        raise ValueError(f'field "{key}": {path} is not UTF-8 text') from None


def _body(text: str) -> Any:
    """The endpoint's body as ``raw``: its JSON when it is JSON, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _shown(text: str) -> str:
    text = ' '.join(text.split())
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + '...'
