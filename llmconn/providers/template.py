"""Template endpoints (``provider: template``): any HTTP model described by two Jinja2 templates.

The request template renders the JSON body from ``input.messages`` (system,
the window's user and assistant messages, the new user message),
``model_info.model_key``, ``kwargs`` (the connection's ``params`` overlaid by
the call's) and ``secret``. The response template sees the final answer as it
came - ``body`` (text), ``status_code``, ``headers`` (lower-case names), error
statuses included, after the transport's retries - and renders
``{"choices": [{"message": {"role": "assistant", "content": str, ...}}],
"usage": {"num_prompt_tokens", "num_completion_tokens"}}`` (usage optional;
``num_cached_tokens``, ``num_cache_write_tokens`` and ``num_reasoning_tokens``
too where the endpoint reports them) or ``{"error": str}``. The message's other fields (a ``response_id``, a
``thread_id``) are stored with the turn and ride on that assistant message in
every later request while the turn is in the window: that is how a stateful
endpoint's state id reaches the next request.

Templates render in :mod:`llmconn.providers.template_sandbox`. Syntax errors
surface at load (config makes them a ConfigError naming the connection, the
template and the line); a failing render or a reply of the wrong shape is an
:class:`LLMError` naming the template, the line and what is missing, with the
secret masked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from llmconn.answers import rate_limit_wait
from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited
from llmconn.providers.base import SYSTEM, Provider
from llmconn.providers.template_sandbox import RenderError, compile_template, environment, render, shown
from llmconn.redact import scrub
from llmconn.types import HTTPAnswer, Reply, Request

if TYPE_CHECKING:
    from llmconn.config import ConnectionConfig

REQUEST = 'request_template'
# The response template's optional usage counts, and the Reply fields they fill (parts of the totals).
USAGE_DETAILS = {'num_cached_tokens': 'cache_read_tokens', 'num_cache_write_tokens': 'cache_write_tokens',
                 'num_reasoning_tokens': 'reasoning_tokens'}
RESPONSE = 'response_template'
MAX_TEMPLATE_FILE_BYTES = 1 << 20
MAX_EXTRAS_CHARS = 64 * 1024    # extras are stored with every turn and sent back while it is in the window
MESSAGE_FIELDS = ('role', 'content')
_header_name = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


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
    def read_files(cls, data: dict, base_dir: Path) -> dict:
        for key in (REQUEST, RESPONSE):
            name = data.get(f'{key}_file')
            if name and data.get(key):
                raise ValueError(f'field "{key}": give {key} or {key}_file, not both')
            if name and isinstance(name, str):
                data[key] = _read(base_dir / name, f'{key}_file')
        return data

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
            if not value.isascii():
                raise ValueError(f'headers.{name} renders non-ASCII text, which HTTP headers cannot carry')
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
            raise self._fail(f'{label} did not render JSON ({e}): {shown(text)}') from None

    def parse_response(self, answer: HTTPAnswer) -> Reply:
        context = {'body': answer.text, 'status_code': answer.status, 'headers': dict(answer.headers)}
        label = _label(self.conf, RESPONSE)
        text = self._render(self._response, label, context, answer)
        try:
            shape = json.loads(text)
        except ValueError as e:
            raise self._fail(f'{label} did not render JSON ({e}): {shown(text)}', answer) from None
        if isinstance(shape, dict) and shape.get('error') is not None:
            raise self._fail(f'{label} reported an error: {shape["error"]}', answer)
        message, usage = _reply_shape(shape, label, self._fail, answer)
        extras = {k: v for k, v in message.items() if k not in MESSAGE_FIELDS}
        if len(json.dumps(extras)) > MAX_EXTRAS_CHARS:
            raise self._fail(f'{label}: the message\'s extra fields take more than {MAX_EXTRAS_CHARS} characters '
                             f'of JSON; keep only the ids the next request needs', answer)
        return Reply(text=message['content'], **usage,
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
        said = ''
        if status is not None and status >= 400:
            said = scrub(shown(answer.text), secret)
            message += f' (HTTP {status}: {said})'
        cls = {401: LLMAuthError, 403: LLMAuthError, 429: LLMRateLimited, 529: LLMRateLimited}.get(status, LLMError)
        body = scrub(_body(answer.text), secret) if answer is not None else None
        extra = {'retry_after': rate_limit_wait(answer.headers)} if cls is LLMRateLimited else {}
        return cls(scrub(f'{self.conf.name}: {message}', secret), status=status, provider_body=body,
                   connection=self.conf.name, quoted=said, **extra)


def _messages(request: Request) -> list[dict]:
    """System, the window, the new message; each assistant message carries its turn's extras."""
    messages = [{'role': 'system', 'content': request.system}] if request.system else []
    for turn in request.history:
        messages.append({'role': 'user', 'content': turn.user})
        messages.append({**turn.meta, 'role': 'assistant', 'content': turn.assistant})
    messages.append({'role': 'user', 'content': request.text})
    return messages


def _reply_shape(shape: Any, label: str, fail, answer: HTTPAnswer) -> tuple[Mapping, dict]:
    """The message and the token counts of a rendered reply, or an LLMError saying what is missing."""
    def missing(what: str) -> LLMError:
        return fail(f'{label} rendered no {what}: expected {{"choices": [{{"message": {{"role": "assistant", '
                    f'"content": str}}}}], "usage": {{...}}}} or {{"error": str}}, got {shown(json.dumps(shape))}',
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
        return message, {}
    counts = [usage.get(k) if isinstance(usage, dict) else None for k in ('num_prompt_tokens', 'num_completion_tokens')]
    if not all(_is_count(n) for n in counts):
        raise missing('usage with num_prompt_tokens and num_completion_tokens as counts')
    optional = {name: usage.get(key, 0) for key, name in USAGE_DETAILS.items()}
    wrong = [key for key, name in USAGE_DETAILS.items() if not _is_count(optional[name])]
    if wrong:
        raise missing(f'{", ".join(wrong)} as counts (a non-negative int, or leave the key out)')
    return message, {'input_tokens': counts[0], 'output_tokens': counts[1], **optional}


def _is_count(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _label(conf: 'ConnectionConfig', key: str) -> str:
    path = getattr(conf, f'{key}_file')
    return f'{key} ({path})' if path else key


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
