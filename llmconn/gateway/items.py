"""Canonical conversation items, and how a list of them becomes a provider request.

The gateway keeps a conversation as a list of plain dicts (typed as the
:class:`MessageItem`, :class:`CallInput`, :class:`OutputInput` and
:class:`ReasoningInput` TypedDicts), whatever the route or backend::

    {"type": "message", "role": "user" | "assistant" | "system" | "developer", "text": str,
     "opaque": {"tag": "claude/<model>/<mode>", "items": [...]},    # assistant only, optional
     "attachments": [...]}      # user only, optional: its images and files (llmconn.gateway.parts)

``opaque`` holds the provider's own items: the answer's canonical
:mod:`llmconn.items` (thinking blocks, Responses reasoning, function calls
with their natives) verbatim; the natives go back only to the provider,
model and mode in ``tag``. Function calls a client sends back and the
outputs that answer them are items of their own::

    {"type": "function_call", "call_id": str, "name": str, "arguments": dict}
    {"type": "function_call_output", "call_id": str, "output": str}

A custom tool's call (free-form ``input``) is a call whose arguments are
``{"input": <text>}``, and its output an output like any other::

    {"type": "custom_tool_call", "call_id": str, "name": str, "arguments": {"input": str}}
    {"type": "custom_tool_call_output", "call_id": str, "output": str}

A reasoning item a client sends back is kept only for its
``encrypted_content`` (:mod:`llmconn.gateway.reasoning` opens it and
drops the rest)::

    {"type": "reasoning", "encrypted_content": str | None, "where": "input[<i>]"}

An output must answer a call of the assistant message just before it, and
every call must be answered before the conversation goes on: either is a
400 naming the call id, before any network call.

A provider request is (system, turns, text): system and developer messages
joined into the system prompt, the conversation paired into user/assistant
turns, and the last user message. What that pairing cannot express is a
named loss (``system_messages_hoisted``, ``messages_merged``) or a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypedDict

from llmconn.errors import GatewayError
from llmconn.gateway import parts, summary_item
from llmconn.gateway.echo import shown

MAX_TEXT_CHARS = 1_000_000          # as a connection's own limit on one message
SYSTEM_ROLES = ('system', 'developer')
ROLES = ('user', 'assistant', *SYSTEM_ROLES)
MERGE_SEPARATOR = '\n\n'
MAX_CALL_ID_CHARS = 256             # providers' call ids are a few dozen characters
_TEXT_PARTS = ('input_text', 'output_text', 'text')
CALL_TYPES = ('function_call', 'custom_tool_call')
OUTPUT_TYPES = ('function_call_output', 'custom_tool_call_output')
CUSTOM_TYPES = ('custom_tool_call', 'custom_tool_call_output')


class Opaque(TypedDict):
    """An assistant answer's own items: canonical :mod:`llmconn.items`, natives replayed only to ``tag``."""

    tag: str
    items: list


class _Said(TypedDict, total=False):
    opaque: Opaque          # assistant messages the gateway made (ledger, registry, sealed reasoning)
    message: str            # the Chat message an item came from (its calls are one answer)


class _Attached(_Said, total=False):
    attachments: list       # a user message's images and files, as llmconn.gateway.parts keeps them


class MessageItem(_Attached):
    type: str               # 'message'
    role: str
    text: str


class CallInput(_Said):
    type: str               # 'function_call' | 'custom_tool_call'
    call_id: str
    name: str
    arguments: dict


class OutputInput(TypedDict):
    type: str               # 'function_call_output' | 'custom_tool_call_output'
    call_id: str
    output: str


class ReasoningInput(TypedDict):
    type: str               # 'reasoning'
    encrypted_content: str | None
    where: str              # the input item it was, for the 400 that names it


@dataclass(frozen=True)
class Conversation:
    """What a provider is sent: the system prompt, the earlier turns, the new user text."""

    system: str
    turns: tuple
    text: str
    items: tuple = ()       # the turn in progress: calls and their outputs (canonical llmconn items)
    tag: str = ''           # whose natives ``items`` hold
    attachments: tuple = ()     # the new user message's (llmconn.Attachment)


def message(role: str, text: str, opaque: Opaque | None = None, attachments: list | None = None) -> MessageItem:
    item: MessageItem = {'type': 'message', 'role': role, 'text': text}
    if opaque:
        item['opaque'] = opaque
    if attachments:
        item['attachments'] = attachments
    return item


def check_text(text: Any, where: str) -> str:
    if not isinstance(text, str):
        raise GatewayError(f'{where} must be a string', param=where)
    if len(text) > MAX_TEXT_CHARS:
        raise GatewayError(f'{where} has {len(text)} characters, more than the limit of {MAX_TEXT_CHARS}',
                           param=where)
    try:
        text.encode('utf-8')
    except UnicodeEncodeError:
        raise GatewayError(f'{where} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text',
                           param=where) from None
    return text


def _content_text(content: Any, where: str) -> str:
    """Content that can hold only text: a string, or a list of text parts."""
    text, _ = _content(content, where, files=False)
    return text


def _content(content: Any, where: str, files: bool) -> tuple[str, list]:
    """A message's content: its text, and (``files``: a user message) its image and file parts."""
    if isinstance(content, str):
        return check_text(content, where), []
    if not isinstance(content, list):
        raise GatewayError(f'{where} must be a string or a list of content parts', param=where)
    texts, attached = [], []
    for index, part in enumerate(content):
        here = f'{where}[{index}]'
        kind = part.get('type') if isinstance(part, dict) else None
        if files and parts.is_part(part):
            attached.append(parts.read(part, here))
            continue
        if kind not in _TEXT_PARTS:
            also = 'text, and images and files in user messages' if files else 'text only'
            if parts.is_part(part):
                also = 'images and files go in user messages only'
            raise GatewayError(f'{here}: content part type {shown(kind)} is not supported through the gateway '
                               f'here ({also})', param=f'{here}.type', code='unsupported_field')
        texts.append(check_text(part.get('text'), f'{here}.text'))
    return ''.join(texts), attached


def _message_item(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise GatewayError(f'{where} must be an object', param=where)
    kind = raw.get('type', 'message')
    if kind == 'function_call':
        return function_call(raw.get('call_id'), raw.get('name'), raw.get('arguments'), where)
    if kind == 'custom_tool_call':
        return custom_call(raw.get('call_id'), raw.get('name'), raw.get('input'), where)
    if kind in OUTPUT_TYPES:
        return dict(function_output(raw.get('call_id'), raw.get('output'), where), type=kind)
    if kind == 'reasoning':
        return reasoning(raw.get('encrypted_content'), where)
    if kind == 'compaction':            # made by POST /v1/responses/compact: its summary, as a developer message
        return message('developer', summary_item.decode(raw.get('encrypted_content'), where))
    if kind != 'message':
        raise GatewayError(f'{where}: item type {shown(kind)} is not supported through the gateway',
                           param=f'{where}.type', code='unsupported_field')
    role = raw.get('role')
    if role not in ROLES:
        raise GatewayError(f'{where}.role must be one of {", ".join(ROLES)}', param=f'{where}.role')
    text, attached = _content(raw.get('content'), f'{where}.content', files=role == 'user')
    return message(role, text, attachments=attached)


def _call_id(call_id: Any, where: str) -> str:
    if not isinstance(call_id, str) or not call_id or len(call_id) > MAX_CALL_ID_CHARS:
        raise GatewayError(f'{where}.call_id is required: the id of the function call (a string of at most '
                           f'{MAX_CALL_ID_CHARS} characters)', param=f'{where}.call_id')
    return check_text(call_id, f'{where}.call_id')


def function_call(call_id: Any, name: Any, arguments: Any, where: str) -> CallInput:
    """A call the client sends back (its arguments a JSON object, as text)."""
    call_id = _call_id(call_id, where)
    if not isinstance(name, str) or not name:
        raise GatewayError(f'{where}: a function call needs its name', param=f'{where}.name')
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise GatewayError(f'{where}.arguments must be a JSON object as a string', param=f'{where}.arguments')
    return {'type': 'function_call', 'call_id': call_id, 'name': name, 'arguments': parsed}


def custom_call(call_id: Any, name: Any, text: Any, where: str) -> CallInput:
    """A custom tool's call the client sends back (its ``input`` free-form text)."""
    call_id = _call_id(call_id, where)
    if not isinstance(name, str) or not name:
        raise GatewayError(f'{where}: a custom tool call needs its name', param=f'{where}.name')
    return {'type': 'custom_tool_call', 'call_id': call_id, 'name': name,
            'arguments': {'input': check_text(text, f'{where}.input')}}


def reasoning(encrypted: Any, where: str) -> ReasoningInput:
    if encrypted is not None and not isinstance(encrypted, str):
        raise GatewayError(f'{where}.encrypted_content must be a string', param=f'{where}.encrypted_content')
    return {'type': 'reasoning', 'encrypted_content': encrypted, 'where': where}


def function_output(call_id: Any, output: Any, where: str) -> OutputInput:
    call_id = _call_id(call_id, where)
    if isinstance(output, list):
        output = _content_text(output, f'{where}.output')
    return {'type': 'function_call_output', 'call_id': call_id, 'output': check_text(output, f'{where}.output')}


def from_responses_input(raw: Any) -> list[dict]:
    """Responses ``input``: a string (one user message) or a list of message items."""
    if isinstance(raw, str):
        return [message('user', check_text(raw, 'input'))]
    if not isinstance(raw, list) or not raw:
        raise GatewayError('input must be a string or a non-empty list of items', param='input')
    return [_message_item(item, f'input[{i}]') for i, item in enumerate(raw)]


def from_chat_messages(raw: Any) -> list[dict]:
    """Chat Completions ``messages``; ``tool`` and ``function`` messages wait for tool calling."""
    if not isinstance(raw, list) or not raw:
        raise GatewayError('messages must be a non-empty list', param='messages')
    items = []
    for index, entry in enumerate(raw):
        where = f'messages[{index}]'
        if isinstance(entry, dict) and entry.get('role') == 'function':
            raise GatewayError(f'{where}: function messages (the deprecated form) are not supported; answer '
                               f'tool_calls with role "tool" messages', param=f'{where}.role',
                               code='unsupported_field')
        if isinstance(entry, dict) and entry.get('role') == 'tool':
            items.append(function_output(entry.get('tool_call_id'), entry.get('content'), where))
            continue
        if isinstance(entry, dict) and entry.get('role') == 'assistant' and entry.get('tool_calls'):
            items += _chat_calls(entry, where)
            continue
        if isinstance(entry, dict) and entry.get('name'):
            raise GatewayError(f'{where}.name: participant names are not supported through the gateway',
                               param=f'{where}.name', code='unsupported_field')
        # An assistant message's refusal is its text already (as the gateway answers it).
        items.append(_message_item({k: v for k, v in entry.items() if k not in ('name', 'refusal')}
                                   if isinstance(entry, dict) else entry, where))
    return items


def _chat_calls(entry: dict, where: str) -> list[dict]:
    calls = entry['tool_calls']
    if not isinstance(calls, list):
        raise GatewayError(f'{where}.tool_calls must be a list', param=f'{where}.tool_calls')
    said = [] if not entry.get('content') else [_message_item({'role': 'assistant', 'content': entry['content']},
                                                              where)]
    for index, call in enumerate(calls):
        here = f'{where}.tool_calls[{index}]'
        function = call.get('function') if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise GatewayError(f'{here}.function is required', param=f'{here}.function')
        said.append(function_call(call.get('id'), function.get('name'), function.get('arguments'), here))
    return [dict(item, message=where) for item in said]      # one assistant message (call_registry.restore)
