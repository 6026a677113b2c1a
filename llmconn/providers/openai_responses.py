"""OpenAI Responses API (``POST {address}/responses``), stateless or stateful.

``state: local`` (the default) sends ``store: false`` and replays the chat
window as input items. ``state: provider`` sends ``store: true`` and, when
the connection gives a ``previous_response_id``, only the new user message;
without one (a new chain) the window is replayed as in local mode.

Reasoning models pair each reasoning item with the output message that
followed it, by id: a reasoning item replayed without its message (or the
reverse) is rejected. So when a reply carries reasoning, the turn's opaque
items are the reply's whole ``output`` list, verbatim, and replaying the turn
means sending those items instead of a plain assistant message. Without
``store`` a reasoning item is only usable with its ``encrypted_content``,
which is asked for (``include``) when the call sets ``reasoning``. Asking
always would break non-reasoning models (gpt-4o, gpt-4.1 answer 400
"Encrypted content is not supported with this model"), so a local-mode reply
whose reasoning came back without it keeps no items and replays as text.

A stream's text is taken from ``response.completed``, which carries the
whole response; if that response holds no text, the deltas already streamed
are the answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator

from llmconn.providers.base import REASONING_REPLAY, SSE, STATEFUL, STREAM, SYSTEM, Provider
from llmconn.providers.base import is_done_marker, json_event, said
from llmconn.providers.openai import bearer_headers, error_text
from llmconn.types import Event, Reply, Request, Turn

ENCRYPTED_REASONING = 'reasoning.encrypted_content'

# Several reasoning summaries read as paragraphs, streamed and unstreamed alike.
THINKING_SEPARATOR = '\n\n'

# Events that end a stream with a response to parse; ``incomplete`` is a partial answer (max_output_tokens).
_final_events = ('response.completed', 'response.incomplete')
_text_deltas = ('response.output_text.delta', 'response.refusal.delta')
# Summaries from OpenAI; the raw reasoning text from servers that show it (vLLM, LM Studio).
_thinking_deltas = ('response.reasoning_summary_text.delta', 'response.reasoning_text.delta')



class OpenAIResponsesProvider(Provider):
    """OpenAI Responses, replaying reasoning items or continuing a provider-side chain."""

    name = 'openai-responses'
    default_address = 'https://api.openai.com/v1'
    capabilities = frozenset({STREAM, SYSTEM, REASONING_REPLAY, STATEFUL})
    reserved_params = frozenset({'model', 'input', 'instructions', 'stream', 'store', 'previous_response_id'})

    @property
    def mode(self) -> str:
        return self.conf.state

    def url(self, stream: bool = False) -> str:
        return f'{self.conf.address}/responses'

    def ping_url(self) -> str:
        return f'{self.conf.address}/models'

    def headers(self) -> dict[str, str]:
        return bearer_headers(self.conf)

    # ---- request

    def build_request(self, request: Request) -> dict[str, Any]:
        stateful = self.conf.state == 'provider'
        items: list[dict[str, Any]] = []
        if not (stateful and request.previous_response_id):
            for turn in request.history:
                items.append(_message('user', turn.user))
                items.extend(self._assistant_items(turn))
        items.append(_message('user', request.text))

        body: dict[str, Any] = {'model': self.conf.model}
        # Instructions are not carried along a chain: they go with every call.
        if request.system:
            body['instructions'] = request.system
        body['input'] = items
        body['max_output_tokens'] = self.conf.max_tokens
        body['store'] = stateful
        if stateful and request.previous_response_id:
            body['previous_response_id'] = request.previous_response_id
        if request.stream:
            body['stream'] = True
        params = self.body_params(request)
        if not stateful and 'reasoning' in params and 'include' not in params:
            body['include'] = [ENCRYPTED_REASONING]
        body.update(params)
        return body

    def _assistant_items(self, turn: Turn) -> list[dict[str, Any]]:
        if self.replays_items(turn):
            return list(turn.items)     # reasoning and message items exactly as the reply gave them
        return [_message('assistant', said(turn))]

    # ---- response

    def parse_response(self, body: Any) -> Reply:
        if not isinstance(body, dict) or 'output' not in body:
            raise self.error(f'the provider answered with something that is not a response: {error_text(body)}',
                             body)
        if body.get('error') or body.get('status') == 'failed':
            raise self.error(f'the response failed: {error_text(body)}; try again', body)
        output = [i for i in body.get('output') or () if isinstance(i, dict)]
        text, thinking = [], []
        for item in output:
            if item.get('type') == 'message':
                text += [p.get('text') or p.get('refusal') or '' for p in item.get('content') or ()
                         if isinstance(p, dict)]
            elif item.get('type') == 'reasoning':
                thinking += _reasoning_texts(item)
        usage = body.get('usage') or {}
        return Reply(text=''.join(text), input_tokens=usage.get('input_tokens') or 0,
                     output_tokens=usage.get('output_tokens') or 0, raw=body,
                     thinking=THINKING_SEPARATOR.join(t for t in thinking if t),
                     items=self._replayable(output), response_id=body.get('id') or '',
                     model=body.get('model') or '')

    def _replayable(self, output: list) -> tuple:
        reasoning = [i for i in output if i.get('type') == 'reasoning']
        if not reasoning:
            return ()
        # Without store, the provider keeps nothing: a reasoning item is only usable with its encrypted content.
        if self.conf.state == 'local' and not all(i.get('encrypted_content') for i in reasoning):
            return ()
        return tuple(output)

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        last_summary = None
        streamed: list[str] = []
        thought: list[str] = []
        for sse in events:
            if is_done_marker(sse):
                continue
            data = json_event(self, sse)
            kind = data.get('type') or sse.event
            if kind in _text_deltas and data.get('delta'):
                streamed.append(data['delta'])
                yield Event('text', text=data['delta'])
            elif kind in _thinking_deltas and data.get('delta'):
                summary = (data.get('item_id'), data.get('summary_index', data.get('content_index')))
                if last_summary is not None and summary != last_summary:
                    thought.append(THINKING_SEPARATOR)
                    yield Event('thinking', text=THINKING_SEPARATOR)
                last_summary = summary
                thought.append(data['delta'])
                yield Event('thinking', text=data['delta'])
            elif kind in _final_events:
                reply = self.parse_response(data.get('response'))
                if not reply.text and streamed:
                    reply = dataclasses.replace(reply, text=''.join(streamed))
                if not reply.thinking and thought:
                    reply = dataclasses.replace(reply, thinking=''.join(thought))
                yield self.done(reply)
                return
            elif kind == 'response.failed':
                response = data.get('response') or {}
                raise self.error(f'the response failed: {error_text(response)}; try again', response)
            elif kind == 'error':
                raise self.error(f'the provider reported an error mid-stream: '
                                 f'{data.get("message") or error_text(data)}; the reply was not saved, try again',
                                 data)
        raise self.error('the stream ended before response.completed, so the reply is incomplete; try again')


def _reasoning_texts(item: dict) -> list[str]:
    """A reasoning item's readable text: its summary, or else (vLLM, LM Studio, gpt-oss servers) its
    ``content`` of ``reasoning_text`` parts, the raw reasoning OpenAI itself keeps to itself."""
    summary = [s.get('text') or '' for s in item.get('summary') or () if isinstance(s, dict)]
    if any(summary):
        return summary
    return [p.get('text') or '' for p in item.get('content') or ()
            if isinstance(p, dict) and p.get('type', 'reasoning_text') == 'reasoning_text']


def _message(role: str, text: str) -> dict[str, Any]:
    return {'role': role, 'content': text}
