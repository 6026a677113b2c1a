"""OpenAI Chat Completions (``POST {address}/chat/completions``), and every compatible server.

Ollama, vLLM, LiteLLM and the like are this provider with another
``address``; they need no secret, so ``Authorization`` is sent only when one
is configured. ``max_tokens`` is the limit field every compatible server
understands; OpenAI's reasoning models (o1, o3, o4-mini, gpt-5...) refuse
it and want ``max_completion_tokens``, which they get, as does any call
whose ``params`` give it.

Some compatible servers stream the model's reasoning as ``reasoning_content``
(DeepSeek, vLLM) or ``reasoning`` (Ollama, OpenRouter); it becomes the
reply's ``thinking``. It is never sent back: those servers ask not to.

Streaming rebuilds a ChatCompletion from the chunks and parses that, so a
streamed reply equals the same answer unstreamed; usage comes in the last
chunk because the request sets ``stream_options.include_usage`` (servers
that ignore it leave usage at 0). A stream is complete at
``data: [DONE]``, which OpenAI and the compatible servers we know (vLLM,
Ollama, LiteLLM) send last, or when it closes cleanly after a
``finish_reason`` (as the official SDK accepts); one that closes before
either lost part of the reply and is an error.

Tools: an assistant message's ``tool_calls`` (arguments as a JSON string,
assembled from the deltas of each call's ``index`` when streamed) are
answered by one ``role: tool`` message per call id.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator

from llmconn import attachments as mod_attachments
from llmconn import items as mod_items
from llmconn.providers.base import SSE, STREAM, STRUCTURED, SYSTEM, TOOLS, Provider, is_done_marker
from llmconn.providers.base import arguments_json, attached, json_event, nonempty, parse_arguments, plain_reply
from llmconn.providers.base import tokens
from llmconn.types import Event, Reply, Request

# Where compatible servers put the model's reasoning, in the order we look.
REASONING_FIELDS = ('reasoning_content', 'reasoning')

# Models that answer 400 "Unsupported parameter: 'max_tokens'": OpenAI's reasoning families.
_reasoning_model = re.compile(r'(o\d|gpt-5)([.-]|$)')

# Body keys this mapping owns: a param setting them would break the chat.


class OpenAIProvider(Provider):
    """OpenAI Chat Completions and OpenAI-compatible servers."""

    name = 'openai'
    default_address = 'https://api.openai.com/v1'
    capabilities = frozenset({STREAM, SYSTEM, TOOLS, STRUCTURED})
    reserved_params = frozenset({'model', 'messages', 'stream', 'stream_options', 'n', 'tools'})
    # Chat's file part carries bytes only; a text file goes in as text.
    accepts = {mod_attachments.DATA: mod_attachments.MEDIA_TYPES, mod_attachments.URL: mod_attachments.IMAGES}

    cut_short = {'length': 'max_output_tokens', 'content_filter': 'content_filter'}

    def stop_reason(self, raw: dict) -> Any:
        choice = (raw.get('choices') or [{}])[0]
        return choice.get('finish_reason') if isinstance(choice, dict) else None

    def url(self, stream: bool = False) -> str:
        return f'{self.conf.address}/chat/completions'

    def ping_url(self) -> str:
        return f'{self.conf.address}/models'

    def headers(self) -> dict[str, str]:
        return bearer_headers(self.conf)

    # ---- request

    def build_request(self, request: Request) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({'role': 'system', 'content': request.system})
        for turn in request.history:
            messages += _turn_messages(user_content(turn.user, attached(turn)), self.steps(turn))
        messages += _turn_messages(user_content(request.text, request.attachments), self.current(request))

        params = self.body_params(request)
        # OpenAI rejects a body that carries both limits.
        limit = ('max_completion_tokens' if 'max_completion_tokens' in params
                 or _reasoning_model.match(self.conf.model) else 'max_tokens')
        body: dict[str, Any] = {'model': self.conf.model, 'messages': messages, limit: self.conf.max_tokens}
        tools = [_tool(t) for t in request.tools] + list(request.hosted)
        if tools:
            body['tools'] = tools
        if request.schema is not None:
            body['response_format'] = response_format(request.schema)
        if request.stream:
            body['stream'] = True
            body['stream_options'] = {'include_usage': True}
        if 'max_tokens' in params:
            body.pop('max_completion_tokens', None)
        if self.conf.cache == 'auto' and request.cache_key:
            body['prompt_cache_key'] = request.cache_key        # keeps the chat on one cache (caching.py)
        body.update(params)
        return body

    # ---- response

    def parse_response(self, body: Any) -> Reply:
        if not isinstance(body, dict) or body.get('error'):
            said = error_text(body)
            raise self.error(f'the provider answered with an error: {said}', body, quoted=said)
        choices = body.get('choices') or []
        if not choices or not isinstance(choices[0], dict):
            raise self.error('the provider answered without any choice; see provider_body', body)
        message = choices[0].get('message') or {}
        usage = body.get('usage') or {}
        thinking = next((text_of(message[k]) for k in REASONING_FIELDS if message.get(k)), '')
        text = text_of(message.get('content'))
        steps = []
        if text:
            steps.append(mod_items.text(text))
        elif message.get('refusal'):
            steps.append(mod_items.refusal(message['refusal']))
        for call in message.get('tool_calls') or ():
            if not isinstance(call, dict):
                continue
            function = call.get('function') or {}
            steps.append(mod_items.call(call.get('id') or '', function.get('name') or '',
                                        parse_arguments(function.get('arguments'))))
        return Reply(text=text or message.get('refusal') or '', steps=tuple(steps),
                     **_usage(usage),
                     raw=body, thinking=thinking, response_id=body.get('id') or '',
                     model=body.get('model') or '')

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        answer = _Answer()
        for sse in events:
            if is_done_marker(sse):
                break
            chunk = json_event(self, sse)
            if chunk.get('error'):
                said = error_text(chunk)
                raise self.error(f'the provider reported an error mid-stream: {said}; the reply was not saved, '
                                 f'try again', chunk, quoted=said)
            yield from answer.add(chunk)
        else:
            if answer.finish_reason is None:
                raise self.error('the stream ended before the model finished (no finish_reason, no '
                                 '"data: [DONE]"), so the reply is incomplete and was not saved; try again',
                                 answer.completion())
        yield self.done(self.parse_response(answer.completion()))


_HEAD_KEYS = ('id', 'created', 'model', 'system_fingerprint')      # a completion's own fields, in its chunks


class _Answer:
    """A ChatCompletion being rebuilt from its chunks."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.finish_reason = None
        self.usage = None
        self.calls: dict[int, dict] = {}

    def add(self, chunk: dict) -> Iterator[Event]:
        head = self.head
        if len(head) < len(_HEAD_KEYS):         # every chunk repeats them: the first of each is kept
            for key in _HEAD_KEYS:
                if chunk.get(key) is not None:
                    head.setdefault(key, chunk[key])
        if chunk.get('usage'):
            self.usage = chunk['usage']
        for choice in chunk.get('choices') or ():
            if not isinstance(choice, dict) or choice.get('index', 0) != 0:
                continue
            self.finish_reason = choice.get('finish_reason') or self.finish_reason
            delta = choice.get('delta') or {}
            reasoning = ''
            for name in REASONING_FIELDS:
                if delta.get(name):
                    reasoning = text_of(delta[name])
                    break
            if reasoning:
                self.reasoning.append(reasoning)
                yield Event('thinking', text=reasoning)
            content = text_of(delta.get('content'))
            if content:
                self.text.append(content)
                yield Event('text', text=content)
            if delta.get('refusal'):
                self.refusal.append(delta['refusal'])
            for piece in delta.get('tool_calls') or ():
                self._call(piece)

    def _call(self, piece: dict) -> None:
        """One tool-call delta: the first of an index names the call, the rest add argument text."""
        if not isinstance(piece, dict):
            return
        call = self.calls.setdefault(piece.get('index', len(self.calls)),
                                     {'id': '', 'type': 'function', 'function': {'name': '', 'arguments': ''}})
        call['id'] = piece.get('id') or call['id']
        function = piece.get('function') or {}
        call['function']['name'] += function.get('name') or ''
        call['function']['arguments'] += function.get('arguments') or ''

    def completion(self) -> dict:
        message: dict[str, Any] = {'role': 'assistant', 'content': ''.join(self.text) or None}
        if self.refusal:
            message['refusal'] = ''.join(self.refusal)
        if self.reasoning:
            message['reasoning_content'] = ''.join(self.reasoning)
        if self.calls:
            message['tool_calls'] = [self.calls[i] for i in sorted(self.calls)]
        completion = {**self.head, 'object': 'chat.completion',
                      'choices': [{'index': 0, 'message': message, 'finish_reason': self.finish_reason}]}
        if self.usage is not None:
            completion['usage'] = self.usage
        return completion


def user_content(text: str, attached: tuple) -> Any:
    """A user message's content: its text, after ``image_url`` / ``file`` parts for its attachments."""
    if not attached:
        return text
    return [_attachment_part(a) for a in attached] + [{'type': 'text', 'text': text}]


def _attachment_part(attachment) -> dict:
    kind = attachment.media_type
    if kind in mod_attachments.IMAGES:
        return {'type': 'image_url', 'image_url': {'url': attachment.url or attachment.data_url}}
    if kind == mod_attachments.TEXT:
        return {'type': 'text', 'text': attachment.text}
    return {'type': 'file', 'file': {'file_data': attachment.data_url, 'filename': attachment.name or 'document.pdf'}}


def _turn_messages(user: Any, steps: list[dict]) -> list[dict]:
    """One turn: the user's message, each round's assistant message, one tool message per output."""
    messages: list[dict[str, Any]] = [{'role': 'user', 'content': user}]
    reply = plain_reply(steps)
    if reply is not None:
        return messages + [{'role': 'assistant', 'content': reply}]
    for said, answers in mod_items.rounds(steps):
        calls = mod_items.calls(said)
        text = ''.join(i['text'] for i in said if i['kind'] in (mod_items.TEXT, mod_items.REFUSAL))
        if said:
            message: dict[str, Any] = {'role': 'assistant', 'content': text or None if calls else nonempty(text)}
            if calls:
                message['tool_calls'] = [{'id': c['call_id'], 'type': 'function', 'function': {
                    'name': c['name'], 'arguments': arguments_json(c['arguments'])}} for c in calls]
            messages.append(message)
        messages += [{'role': 'tool', 'tool_call_id': a['call_id'], 'content': a['output']} for a in answers]
    return messages


def _tool(tool) -> dict:
    function = {'name': tool.name, 'parameters': tool.parameters}
    if tool.description:
        function['description'] = tool.description
    if tool.strict is not None:
        function['strict'] = tool.strict
    return {'type': 'function', 'function': function}


def response_format(schema) -> dict:
    """Chat Completions' structured output: a strict json_schema (llmconn.structured)."""
    return {'type': 'json_schema', 'json_schema': {'name': schema.name, 'schema': schema.schema, 'strict': True}}


def bearer_headers(conf) -> dict[str, str]:
    """OpenAI's headers; the key is optional, since local compatible servers need none."""
    headers = {'content-type': 'application/json'}
    if conf.secret_value:
        headers['authorization'] = f'Bearer {conf.secret_value}'
    return headers


def text_of(content: Any) -> str:
    """Text of a message's ``content``: a string, or (Mistral and others) a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return ''.join(p.get('text') or '' for p in content
                       if isinstance(p, dict) and p.get('type', 'text') in ('text', 'output_text'))
    return ''


# ---- shared with the Responses mapping


def error_text(body: Any) -> str:
    """A one-line description of an OpenAI-style ``{"error": {...}}`` body."""
    error = body.get('error') if isinstance(body, dict) else None
    if isinstance(error, dict):
        return error.get('message') or error.get('code') or error.get('type') or 'no message'
    return str(error or body)[:200]


def _usage(usage: dict) -> dict:
    """Reply's counts from a Chat Completions usage; the details are parts of the two totals."""
    return {'input_tokens': tokens(usage, 'prompt_tokens'), 'output_tokens': tokens(usage, 'completion_tokens'),
            'cache_read_tokens': tokens(usage, 'prompt_tokens_details', 'cached_tokens'),
            'cache_write_tokens': tokens(usage, 'prompt_tokens_details', 'cache_write_tokens'),
            'reasoning_tokens': tokens(usage, 'completion_tokens_details', 'reasoning_tokens')}
