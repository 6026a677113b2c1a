"""The stream normalizer: llmconn's ``thinking`` / ``text`` / ``done`` events as OpenAI event streams.

:class:`ResponseEvents` emits the Responses lifecycle, each event numbered
by ``sequence_number``::

    response.created, response.in_progress,
    (per output item, in order)
        response.output_item.added
        reasoning:  reasoning_summary_part.added, reasoning_summary_text.delta..., .done, part.done
        message:    content_part.added, output_text.delta..., output_text.done, content_part.done
        function_call:      function_call_arguments.delta..., .done
        custom_tool_call:   custom_tool_call_input.delta..., .done
        response.output_item.done
    response.completed | response.incomplete | response.failed

An item is opened by its first delta and closed when a delta of the other
kind arrives or the answer ends, so interleaved thinking and text become
several items, each well-formed. There is always a message item, even for an
empty answer, unless the answer is only calls. The sealed reasoning a
stateless client asked for (``include``) is known only once the answer is
whole, so it comes as one more reasoning item (empty summary) after the
text and before the calls, complete in its ``output_item.done``. :class:`ChatChunks` emits ``chat.completion.chunk`` objects.

Neither does I/O: the route feeds them and writes what they return.
"""

from __future__ import annotations

import secrets
from typing import Any

from llmconn import jsontext


def item_id(prefix: str) -> str:
    return f'{prefix}_{secrets.token_hex(24)}'


def arguments_text(arguments: Any) -> str:
    """A call's arguments as the JSON string both OpenAI APIs carry."""
    return arguments if isinstance(arguments, str) else jsontext.dumps(arguments)


def sse(event: dict) -> bytes:
    return f'event: {event["type"]}\ndata: {jsontext.dumps(event)}\n\n'.encode()


def chat_sse(chunk: Any) -> bytes:
    data = chunk if isinstance(chunk, str) else jsontext.dumps(chunk)
    return f'data: {data}\n\n'.encode()


def message_item(text: str, status: str = 'completed', ident: str = '') -> dict:
    return {'id': ident or item_id('msg'), 'type': 'message', 'role': 'assistant', 'status': status,
            'content': [{'type': 'output_text', 'text': text, 'annotations': [], 'logprobs': []}]}


def reasoning_item(summary: str, ident: str = '', sealed: str = '') -> dict:
    """A reasoning item; ``sealed`` (:mod:`llmconn.gateway.reasoning`) is its ``encrypted_content``."""
    item = {'id': ident or item_id('rs'), 'type': 'reasoning',
            'summary': [{'type': 'summary_text', 'text': summary}] if summary else []}
    if sealed:
        item['encrypted_content'] = sealed
    return item


class ResponseEvents:
    """The Responses events of one streamed response; ``response`` is its in-progress object."""

    def __init__(self, response: dict) -> None:
        self.response = response
        self.seq = 0
        self.output: list[dict] = []       # closed items, in order
        self.open: dict | None = None      # {'kind', 'id', 'index', 'parts'}
        self.streamed_chars = 0
        self.text: list[str] = []

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {'type': kind, 'sequence_number': self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict]:
        return [self._event('response.created', response=self.response),
                self._event('response.in_progress', response=self.response)]

    def feed(self, kind: str, delta: str) -> list[dict]:
        """One ``thinking`` or ``text`` delta."""
        if not delta:
            return []
        out = [] if self.open and self.open['kind'] == kind else self._close() + self._open(kind)
        self.open['parts'].append(delta)
        self.streamed_chars += len(delta)
        where = {'item_id': self.open['id'], 'output_index': self.open['index']}
        if kind == 'thinking':
            out.append(self._event('response.reasoning_summary_text.delta', **where, summary_index=0, delta=delta))
        else:
            self.text.append(delta)
            out.append(self._event('response.output_text.delta', **where, content_index=0, delta=delta,
                                   logprobs=[]))
        return out

    def finish(self, text: str, final: dict, calls: list | tuple = (), sealed: str = '') -> list[dict]:
        """The answer is complete: close the items (adding any text not streamed), add the reasoning item
        that carries ``sealed`` (known only now), the calls (``calls``: Responses ``function_call`` and
        ``custom_tool_call`` items), and end with ``final``."""
        streamed = ''.join(self.text)
        out = []
        if text.startswith(streamed) and len(text) > len(streamed):
            out += self.feed('text', text[len(streamed):])
        if not calls and not any(i['type'] == 'message' for i in self.output) and \
                not (self.open and self.open['kind'] == 'text'):
            out += self._close() + self._open('text')
        out += self._close()
        if sealed:
            out += self._sealed(sealed)
        for call in calls:
            out += self._custom_call(call) if call['type'] == 'custom_tool_call' else self._function_call(call)
        self.response = dict(final, output=self.output)
        kind = {'completed': 'response.completed', 'incomplete': 'response.incomplete'}.get(final['status'],
                                                                                           'response.failed')
        return out + [self._event(kind, response=self.response)]

    def prepared(self, final: dict) -> list[dict]:
        """A response that made no output (a warm-up, ``generate: false``) ends with ``final``."""
        self.response = dict(final, output=[])
        return [self._event('response.completed', response=self.response)]

    def fail(self, final: dict) -> list[dict]:
        """The provider failed mid-answer: the items so far close and ``response.failed`` ends the stream."""
        out = self._close()
        self.response = dict(final, output=self.output)
        return out + [self._event('response.failed', response=self.response)]

    def partial_output(self) -> list[dict]:
        """The items so far, the one still open included (a message as ``incomplete``)."""
        if self.open is None:
            return list(self.output)
        text = ''.join(self.open['parts'])
        item = reasoning_item(text, self.open['id']) if self.open['kind'] == 'thinking' else \
            message_item(text, 'incomplete', self.open['id'])
        return self.output + [item]

    def _sealed(self, sealed: str) -> list[dict]:
        """The reasoning item whose ``encrypted_content`` a stateless client sends back (summary already streamed)."""
        index = len(self.output)
        item = reasoning_item('', sealed=sealed)
        self.output.append(item)
        return [self._event('response.output_item.added', output_index=index,
                            item={'id': item['id'], 'type': 'reasoning', 'summary': []}),
                self._event('response.output_item.done', output_index=index, item=item)]

    def _custom_call(self, item: dict) -> list[dict]:
        """One custom tool call: added (empty input), its input as deltas, done, the item done."""
        index = len(self.output)
        where = {'item_id': item['id'], 'output_index': index}
        out = [self._event('response.output_item.added', output_index=index, item=dict(item, input=''))]
        out += [self._event('response.custom_tool_call_input.delta', **where, delta=piece)
                for piece in _pieces(item['input'])]
        out.append(self._event('response.custom_tool_call_input.done', **where, input=item['input']))
        self.output.append(item)
        return out + [self._event('response.output_item.done', output_index=index, item=item)]

    def _function_call(self, item: dict) -> list[dict]:
        """One call: added (empty arguments), its arguments as deltas, done, the item done."""
        index = len(self.output)
        where = {'item_id': item['id'], 'output_index': index}
        out = [self._event('response.output_item.added', output_index=index,
                           item=dict(item, arguments='', status='in_progress'))]
        text = item['arguments']
        step = max(1, len(text) // 3)
        for start in range(0, len(text), step):
            out.append(self._event('response.function_call_arguments.delta', **where, delta=text[start:start + step]))
        out.append(self._event('response.function_call_arguments.done', **where, arguments=text))
        self.output.append(item)
        return out + [self._event('response.output_item.done', output_index=index, item=item)]

    def _open(self, kind: str) -> list[dict]:
        index = len(self.output)
        if kind == 'thinking':
            ident = item_id('rs')
            self.open = {'kind': kind, 'id': ident, 'index': index, 'parts': []}
            return [self._event('response.output_item.added', output_index=index,
                                item={'id': ident, 'type': 'reasoning', 'summary': []}),
                    self._event('response.reasoning_summary_part.added', item_id=ident, output_index=index,
                                summary_index=0, part={'type': 'summary_text', 'text': ''})]
        ident = item_id('msg')
        self.open = {'kind': kind, 'id': ident, 'index': index, 'parts': []}
        item = {'id': ident, 'type': 'message', 'role': 'assistant', 'status': 'in_progress', 'content': []}
        return [self._event('response.output_item.added', output_index=index, item=item),
                self._event('response.content_part.added', item_id=ident, output_index=index, content_index=0,
                            part={'type': 'output_text', 'text': '', 'annotations': [], 'logprobs': []})]

    def _close(self) -> list[dict]:
        current, self.open = self.open, None
        if current is None:
            return []
        text = ''.join(current['parts'])
        where = {'item_id': current['id'], 'output_index': current['index']}
        if current['kind'] == 'thinking':
            item = reasoning_item(text, current['id'])
            events = [self._event('response.reasoning_summary_text.done', **where, summary_index=0, text=text),
                      self._event('response.reasoning_summary_part.done', **where, summary_index=0,
                                  part={'type': 'summary_text', 'text': text})]
        else:
            item = message_item(text, ident=current['id'])
            part = item['content'][0]
            events = [self._event('response.output_text.done', **where, content_index=0, text=text, logprobs=[]),
                      self._event('response.content_part.done', **where, content_index=0, part=part)]
        self.output.append(item)
        return events + [self._event('response.output_item.done', output_index=current['index'], item=item)]


def _pieces(text: str) -> list[str]:
    step = max(1, len(text) // 3)
    return [text[i:i + step] for i in range(0, len(text), step)]


class ChatChunks:
    """The ``chat.completion.chunk`` objects of one streamed completion."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.head = {'id': completion_id, 'object': 'chat.completion.chunk', 'created': created, 'model': model}
        self.include_usage = include_usage
        self.streamed_chars = 0
        self.text: list[str] = []

    def _chunk(self, delta: dict, finish: str | None = None) -> dict:
        chunk = dict(self.head, choices=[{'index': 0, 'delta': delta, 'finish_reason': finish, 'logprobs': None}])
        if self.include_usage:
            chunk['usage'] = None
        return chunk

    def start(self) -> list[dict]:
        return [self._chunk({'role': 'assistant', 'content': ''})]

    def _tool_call(self, index: int, call: dict) -> list[dict]:
        head = {'index': index, 'id': call['call_id'], 'type': 'function',
                'function': {'name': call['name'], 'arguments': ''}}
        out = [self._chunk({'tool_calls': [head]})]
        for piece in _pieces(arguments_text(call['arguments'])):
            out.append(self._chunk({'tool_calls': [{'index': index, 'function': {'arguments': piece}}]}))
        return out

    def feed(self, kind: str, delta: str) -> list[dict]:
        if not delta:
            return []
        self.streamed_chars += len(delta)
        if kind == 'thinking':
            return [self._chunk({'reasoning_content': delta})]
        self.text.append(delta)
        return [self._chunk({'content': delta})]

    def finish(self, text: str, finish_reason: str, usage: dict, extra: dict, calls: list | tuple = ()) -> list:
        """The last chunks: any text not streamed, the tool calls as OpenAI streams them (the first chunk
        of each with its index, id, type and name, then its arguments in pieces), the finish, the usage."""
        streamed = ''.join(self.text)
        out = self.feed('text', text[len(streamed):]) if text.startswith(streamed) else []
        for index, call in enumerate(calls):
            out += self._tool_call(index, call)
        last = self._chunk({}, finish_reason)
        last.update(extra)
        out.append(last)
        if self.include_usage:
            out.append(dict(self.head, choices=[], usage=usage))
        return out + ['[DONE]']
