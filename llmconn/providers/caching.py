"""Provider prompt caching with ``cache: auto`` (SPEC §17): Claude's breakpoints, OpenAI's cache key.

Claude caches a prompt only up to a block marked ``cache_control``, and a
later request reads it when one of its own breakpoints sits on the same
block or at most 19 blocks after it. llmconn marks, in this order of worth:

1. the end of the stable prefix - the skill's system block, or the last tool
   when there is no skill: the same on every call of every chat using them;
2. the last block of the request: the next call of the chat finds it one
   turn back, so this turn is written to the cache once now (1.25 x input)
   rather than sent uncached now and written next time;
3. the end of the window's history: while the window's start stays put
   (``window_step`` calls), the history is a prefix of the next call's, so
   it still hits when a tool loop pushed the last block out of the lookback.

A prefix of fewer than :data:`MIN_PREFIX_BYTES` UTF-8 bytes cannot hold
Claude's minimum cacheable 1,024 tokens (a token is at least a byte), so it
gets no mark: short chats keep their plain bodies. Marks the body already
carries (a caller's, a top-level ``cache_control`` in params) count against
the API's limit of :data:`MAX_BREAKPOINTS`, which is never exceeded.

OpenAI (Chat Completions and Responses) caches automatically; routing a
chat's calls to the same cache takes ``prompt_cache_key``, a hash of the
connection and chat id (:func:`chat_cache_key`), never the id's text.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

MIN_PREFIX_BYTES = 1024
MAX_BREAKPOINTS = 4                 # Claude refuses a request with more blocks marked
_unmarkable = ('thinking', 'redacted_thinking')     # Claude refuses cache_control on these


@functools.lru_cache(maxsize=1024)      # a chat's calls each need it; a hash per call was most of its cost
def chat_cache_key(connection: str, chat_id: str) -> str:
    """A chat's stable ``prompt_cache_key``: reveals neither the chat id nor the connection."""
    if not chat_id:
        return ''
    return 'llmconn-' + hashlib.sha256(f'{connection}\0{chat_id}'.encode('utf-8', 'surrogatepass')).hexdigest()[:32]


def system_blocks(system: str, summary: str) -> str | list:
    """Claude's ``system``: the text, or with a compaction summary at its end, the skill and the
    summary as two blocks, so that a changed summary leaves the skill's cached block as it was."""
    if not summary or not system.endswith(summary) or len(system) == len(summary):
        return system
    skill = system[:-len(summary)].rstrip('\n')
    return [{'type': 'text', 'text': skill}, {'type': 'text', 'text': summary}]


def place_breakpoints(body: dict[str, Any], history_messages: int, ttl: str, summary: bool = False) -> None:
    """Mark ``body`` (a Claude Messages body built for this call) where caching pays; see the module doc.

    ``history_messages``: how many of ``body['messages']`` come from the window's history;
    ``summary``: the system's last block is a compaction summary, which is not part of the stable prefix.
    """
    mark = {'type': 'ephemeral'} if ttl == '5m' else {'type': 'ephemeral', 'ttl': ttl}
    room = MAX_BREAKPOINTS - _marks(body)
    messages = body.get('messages') or []
    system = body.get('system')
    summarized = summary and isinstance(system, list) and len(system) == 2
    stable = _size(body.get('tools')) + _size(system[0] if summarized else system)
    history = (stable + (_size(system[1]) if summarized else 0)
               + sum(_size(m.get('content')) for m in messages[:history_messages]))
    whole = history + sum(_size(m.get('content')) for m in messages[history_messages:])
    slots = [(stable, _mark_skill if summarized else _mark_stable),
             (whole, lambda b, m: _mark_message(b, len(messages) - 1, m))]
    if 0 < history_messages < len(messages):
        slots.append((history, lambda b, m: _mark_message(b, history_messages - 1, m)))
    for size, place in slots:
        if room > 0 and size >= MIN_PREFIX_BYTES and place(body, mark):
            room -= 1


def _mark_stable(body: dict, mark: dict) -> bool:
    system = body.get('system')
    if isinstance(system, str) and system:
        body['system'] = [{'type': 'text', 'text': system, 'cache_control': mark}]
        return True
    if isinstance(system, list) and system:
        return _mark_last(system, mark, lambda blocks: body.__setitem__('system', blocks))
    tools = body.get('tools')
    if tools:
        return _mark_last(tools, mark, lambda blocks: body.__setitem__('tools', blocks), any_type=True)
    return False


def _mark_skill(body: dict, mark: dict) -> bool:
    """The skill's block, the first of a system with a summary after it."""
    body['system'] = [dict(body['system'][0], cache_control=mark), body['system'][1]]
    return True


def _mark_message(body: dict, index: int, mark: dict) -> bool:
    if index < 0:
        return False
    message = body['messages'][index]
    content = message.get('content')
    if isinstance(content, str):
        blocks = [{'type': 'text', 'text': content}]
    elif isinstance(content, list) and content:
        blocks = content
    else:
        return False

    def put(new: list) -> None:
        body['messages'][index] = dict(message, content=new)
    return _mark_last(blocks, mark, put)


def _mark_last(blocks: list, mark: dict, put, any_type: bool = False) -> bool:
    """Mark the last markable block of ``blocks`` on a copy (they may be a stored turn's natives)."""
    for i in range(len(blocks) - 1, -1, -1):
        block = blocks[i]
        if not isinstance(block, dict) or (not any_type and block.get('type') in _unmarkable):
            continue
        if 'cache_control' in block:
            return False        # marked already (and counted)
        put(blocks[:i] + [dict(block, cache_control=mark)] + blocks[i + 1:])
        return True
    return False


def _marks(body: dict) -> int:
    """The breakpoints ``body`` carries already."""
    count = 1 if body.get('cache_control') else 0
    system = body.get('system')
    lists = [body.get('tools') or [], system if isinstance(system, list) else []]
    lists += [m.get('content') for m in body.get('messages') or () if isinstance(m.get('content'), list)]
    return count + sum(1 for blocks in lists for b in blocks if isinstance(b, dict) and b.get('cache_control'))


def _size(value: Any) -> int:
    if not value:
        return 0
    if isinstance(value, str):
        return len(value.encode('utf-8', 'surrogatepass'))
    return len(json.dumps(value, ensure_ascii=False).encode('utf-8', 'surrogatepass'))
