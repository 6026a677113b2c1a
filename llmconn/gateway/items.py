"""Canonical conversation items, and how a list of them becomes a provider request.

The gateway keeps a conversation as a list of plain dicts, whatever the
route or backend::

    {"type": "message", "role": "user" | "assistant" | "system" | "developer", "text": str,
     "opaque": {"tag": "claude/<model>/<mode>", "items": [...]}}    # assistant only, optional

``opaque`` holds the provider's own items (Claude thinking blocks, Responses
reasoning items) verbatim; they go back only to the provider, model and
mode in ``tag``. Function calls and their outputs will be items of their own
(``function_call``, ``function_call_output``) once tool calling reaches the
gateway; until then they are refused with a 400 naming the item.

A provider request is (system, turns, text): system and developer messages
joined into the system prompt, the conversation paired into user/assistant
turns, and the last user message. What that pairing cannot express is a
named loss (``system_messages_hoisted``, ``messages_merged``) or a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmconn.errors import GatewayError
from llmconn.gateway.policy import Policy, Resolution, check_loss
from llmconn.types import Turn

MAX_TEXT_CHARS = 1_000_000          # as a connection's own limit on one message
SYSTEM_ROLES = ('system', 'developer')
ROLES = ('user', 'assistant', *SYSTEM_ROLES)
MERGE_SEPARATOR = '\n\n'
_TEXT_PARTS = ('input_text', 'output_text', 'text')
_PENDING_TOOL_ITEMS = ('function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output')


@dataclass(frozen=True)
class Conversation:
    """What a provider is sent: the system prompt, the earlier turns, the new user text."""

    system: str
    turns: tuple
    text: str


def message(role: str, text: str, opaque: dict | None = None) -> dict:
    item = {'type': 'message', 'role': role, 'text': text}
    if opaque:
        item['opaque'] = opaque
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
    """A message's content: a string, or a list of text parts (images and files are refused)."""
    if isinstance(content, str):
        return check_text(content, where)
    if not isinstance(content, list):
        raise GatewayError(f'{where} must be a string or a list of content parts', param=where)
    texts = []
    for index, part in enumerate(content):
        here = f'{where}[{index}]'
        kind = part.get('type') if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise GatewayError(f'{here}: content part type {kind!r} is not supported through the gateway '
                               f'(text only)', param=f'{here}.type', code='unsupported_field')
        texts.append(check_text(part.get('text'), f'{here}.text'))
    return ''.join(texts)


def _message_item(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise GatewayError(f'{where} must be an object', param=where)
    kind = raw.get('type', 'message')
    if kind in _PENDING_TOOL_ITEMS:
        raise GatewayError(f'{where}: {kind} items are not supported through the gateway yet (tool calling '
                           f'is not available)', param=f'{where}.type', code='unsupported_field')
    if kind != 'message':
        raise GatewayError(f'{where}: item type {kind!r} is not supported through the gateway',
                           param=f'{where}.type', code='unsupported_field')
    role = raw.get('role')
    if role not in ROLES:
        raise GatewayError(f'{where}.role must be one of {", ".join(ROLES)}', param=f'{where}.role')
    return message(role, _content_text(raw.get('content'), f'{where}.content'))


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
        if isinstance(entry, dict) and entry.get('role') in ('tool', 'function'):
            raise GatewayError(f'{where}: {entry["role"]} messages are not supported through the gateway yet '
                               f'(tool calling is not available)', param=f'{where}.role', code='unsupported_field')
        if isinstance(entry, dict) and entry.get('tool_calls'):
            raise GatewayError(f'{where}.tool_calls: tool calling is not available through the gateway yet',
                               param=f'{where}.tool_calls', code='unsupported_field')
        if isinstance(entry, dict) and entry.get('name'):
            raise GatewayError(f'{where}.name: participant names are not supported through the gateway',
                               param=f'{where}.name', code='unsupported_field')
        # An assistant message's refusal is its text already (as the gateway answers it).
        items.append(_message_item({k: v for k, v in entry.items() if k not in ('name', 'refusal')}
                                   if isinstance(entry, dict) else entry, where))
    return items


def to_conversation(items: list[dict], instructions: str, policy: Policy, resolution: Resolution) -> Conversation:
    """Pair ``items`` into turns for a provider, recording (or refusing) what that loses."""
    system = [instructions] if instructions else []
    chat: list[dict] = []
    for item in items:
        if item['role'] in SYSTEM_ROLES:
            if chat:
                check_loss(resolution, policy, 'input', 'system_messages_hoisted',
                           'a system or developer message after the conversation began cannot be placed there '
                           'on this backend')
            system.append(item['text'])
        elif chat and chat[-1]['role'] == item['role']:
            check_loss(resolution, policy, 'input', 'messages_merged',
                       f'two {item["role"]} messages in a row cannot be sent separately on this backend')
            chat[-1] = message(item['role'], chat[-1]['text'] + MERGE_SEPARATOR + item['text'])
        else:
            chat.append(item)
    if not chat or chat[-1]['role'] != 'user':
        raise GatewayError('the conversation must end with a user message', param='input')
    if not chat[-1]['text'].strip():
        raise GatewayError('the last user message is empty; send the user\'s text', param='input')
    if chat[0]['role'] != 'user':
        raise GatewayError('the conversation must start with a user message (after any system messages)',
                           param='input')
    turns = []
    for user, assistant in zip(chat[0:-1:2], chat[1:-1:2]):
        opaque = assistant.get('opaque') or {}
        turns.append(Turn(user=user['text'], assistant=assistant['text'], items=tuple(opaque.get('items') or ()),
                          tag=opaque.get('tag', '')))
    return Conversation(MERGE_SEPARATOR.join(system), tuple(turns), chat[-1]['text'])
