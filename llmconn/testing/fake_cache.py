"""The fake providers' prompt caches, billed as the real APIs bill them.

Tokens are whitespace-separated words, as every fake counts them, so a
test or the bench reads billed tokens from the usage the fake reports.

Claude (explicit caching, ``cache_control`` breakpoints): the prompt is the
sequence of its blocks in the API's order - each tool definition, the
system blocks, each message's content blocks (a string content is one
block). A top-level ``cache_control`` marks the last block. More than
:data:`CLAUDE_MAX_BREAKPOINTS` breakpoints is a 400, as the real API says.
For each breakpoint the cache looks for an entry at that block and at the
:data:`CLAUDE_LOOKBACK` - 1 blocks before it; the longest prefix found is
read (and its lifetime restarts). Entries are written at the breakpoints
whose prefix holds at least :data:`MIN_CACHEABLE_TOKENS`; what lies between
the prefix read and the last such breakpoint is billed as written, under
the lifetime (``5m`` or ``1h``) of the breakpoint that ends its stretch.

OpenAI (Chat Completions and Responses, automatic): a prompt of at least
:data:`MIN_CACHEABLE_TOKENS` tokens is cached in steps of
:data:`OPENAI_STEP` tokens; the longest step seen before (same model,
``prompt_cache_key`` and tools) within :data:`OPENAI_TTL` is read. Writes
are free and not reported. Gemini (implicit) is the same at step 1,
reported as ``cachedContentTokenCount``.

The clock is :attr:`PromptCache.clock`, so a test can move it past a lifetime.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time as mod_time
from dataclasses import dataclass
from typing import Any, Iterable

MIN_CACHEABLE_TOKENS = 1024     # Claude's minimum cacheable prefix (Sonnet, Opus); OpenAI's too
CLAUDE_LOOKBACK = 20            # blocks a breakpoint looks back for an earlier entry
CLAUDE_MAX_BREAKPOINTS = 4
CLAUDE_TTLS = {'5m': 300.0, '1h': 3600.0}
OPENAI_STEP = 128               # cached_tokens grow in steps of 128 past the first 1,024
OPENAI_TTL = 600.0              # OpenAI keeps a prefix 5-10 minutes after its last use
GEMINI_TTL = 300.0
MAX_ENTRIES = 100_000           # past this, expired entries are dropped


class CacheRefused(ValueError):
    """A request the real API refuses for its cache settings (Claude: too many breakpoints)."""


@dataclass(frozen=True)
class Billed:
    """What one request read from and wrote to the cache; ``total`` is its whole input."""

    total: int
    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    @property
    def written(self) -> int:
        return self.written_5m + self.written_1h


class PromptCache:
    """Prefix digests and when they expire; one per fake server, shared by its APIs."""

    def __init__(self, clock=mod_time.monotonic) -> None:
        self.clock = clock
        self._entries: dict[bytes, tuple[float, float]] = {}    # digest -> (expires, lifetime)
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def read(self, digests: Iterable[bytes]) -> bytes | None:
        """The first of ``digests`` still cached, its lifetime restarted; None when none is."""
        now = self.clock()
        with self._lock:
            for digest in digests:
                entry = self._entries.get(digest)
                if entry is not None and entry[0] > now:
                    self._entries[digest] = (now + entry[1], entry[1])
                    return digest
        return None

    def write(self, digest: bytes, lifetime: float) -> None:
        now = self.clock()
        with self._lock:
            old = self._entries.get(digest)
            if old is None or old[0] < now + lifetime:
                self._entries[digest] = (now + lifetime, lifetime)
            if len(self._entries) > MAX_ENTRIES:
                for key in [k for k, (expires, _) in self._entries.items() if expires <= now]:
                    del self._entries[key]

    # -- Claude ------------------------------------------------------------------------------

    def bill_claude(self, body: dict) -> Billed:
        blocks = claude_blocks(body)
        marks = [i for i, (_, _, mark) in enumerate(blocks) if mark is not None]
        if len(marks) > CLAUDE_MAX_BREAKPOINTS:
            raise CacheRefused(f'A maximum of {CLAUDE_MAX_BREAKPOINTS} blocks with cache_control may be '
                               f'provided. Found {len(marks)}.')
        digests, ends = _chained((body.get('model'),), ((b, n) for b, n, _ in blocks))
        total = ends[-1] if ends else 0
        read = 0
        for mark in marks:
            window = range(mark, max(-1, mark - CLAUDE_LOOKBACK), -1)
            hit = self.read(digests[i] for i in window)
            if hit is not None:
                read = max(read, ends[digests.index(hit)])
        written = {'5m': 0, '1h': 0}
        start = read
        for mark in marks:
            ttl = blocks[mark][2]
            if ends[mark] >= MIN_CACHEABLE_TOKENS:
                self.write(digests[mark], CLAUDE_TTLS[ttl])
                written[ttl] += max(0, ends[mark] - start)
                start = max(start, ends[mark])
        return Billed(total, read, written['5m'], written['1h'])

    # -- OpenAI and Gemini -------------------------------------------------------------------

    def bill_prefix(self, namespace: tuple, words: list[str], step: int, lifetime: float) -> Billed:
        """Automatic prefix caching: the longest cached step of ``words`` is read; every step is kept."""
        total = len(words)
        if total < MIN_CACHEABLE_TOKENS:
            return Billed(total)
        cuts = list(range(MIN_CACHEABLE_TOKENS, total + 1, step))
        h = hashlib.sha256(json.dumps(namespace, sort_keys=True, default=str).encode())
        digests, done = [], 0
        for cut in cuts:
            for word in words[done:cut]:
                h.update(word.encode('utf-8', 'surrogatepass') + b'\0')
            done = cut
            digests.append(h.copy().digest())
        hit = self.read(reversed(digests))
        for digest in digests:
            self.write(digest, lifetime)
        return Billed(total, cuts[digests.index(hit)] if hit is not None else 0)


def claude_blocks(body: dict) -> list[tuple[Any, int, str | None]]:
    """(the block as hashed, its tokens, its breakpoint's ttl or None), in the order Claude reads them."""
    blocks: list[tuple[Any, int, str | None]] = []
    for tool in body.get('tools') or ():
        if isinstance(tool, dict):
            blocks.append(_block('tool', tool))
    system = body.get('system')
    for block in ([{'type': 'text', 'text': system}] if isinstance(system, str) and system else system or ()):
        if isinstance(block, dict):
            blocks.append(_block('system', block))
    for message in body.get('messages') or ():
        content = message.get('content') if isinstance(message, dict) else None
        role = message.get('role') if isinstance(message, dict) else None
        for block in [{'type': 'text', 'text': content}] if isinstance(content, str) else content or ():
            if isinstance(block, dict):
                blocks.append(_block(role, block))
    automatic = body.get('cache_control')
    if isinstance(automatic, dict) and blocks and blocks[-1][2] is None:
        blocks[-1] = (blocks[-1][0], blocks[-1][1], _ttl(automatic))
    return blocks


def _block(where: Any, block: dict) -> tuple[Any, int, str | None]:
    bare = {k: v for k, v in block.items() if k != 'cache_control'}
    mark = block.get('cache_control')
    return (where, bare), block_tokens(bare), _ttl(mark) if isinstance(mark, dict) else None


def _ttl(mark: dict) -> str:
    ttl = mark.get('ttl') or '5m'
    if mark.get('type') != 'ephemeral' or ttl not in CLAUDE_TTLS:
        raise CacheRefused(f'cache_control: type must be "ephemeral" and ttl one of {", ".join(CLAUDE_TTLS)}, '
                           f'got {json.dumps(mark)}')
    return ttl


def block_tokens(block: dict) -> int:
    """A Claude block's words: its text, a tool result's text, a call's input, a tool's definition."""
    kind = block.get('type')
    if kind == 'text':
        return len(str(block.get('text') or '').split())
    if kind == 'tool_result':
        content = block.get('content')
        if isinstance(content, list):
            return sum(block_tokens(b) for b in content if isinstance(b, dict))
        return len(str(content or '').split())
    if kind == 'thinking':
        return len(str(block.get('thinking') or '').split())
    if kind == 'tool_use':
        return len(json.dumps(block.get('input') or {}).split())
    if kind is None and 'name' in block:            # a tool definition
        return len(json.dumps(block, sort_keys=True).split())
    return 0


def _chained(namespace: tuple, blocks: Iterable[tuple[Any, int]]) -> tuple[list[bytes], list[int]]:
    """Each block's prefix digest (of every block up to it) and the tokens of that prefix."""
    h = hashlib.sha256(json.dumps(namespace, default=str).encode())
    digests, ends, total = [], [], 0
    for block, tokens in blocks:
        h.update(json.dumps(block, sort_keys=True, default=str).encode('utf-8', 'surrogatepass') + b'\0')
        digests.append(h.copy().digest())
        total += tokens
        ends.append(total)
    return digests, ends


# -- the usage objects each fake API reports ------------------------------------------------------


def claude_usage(cache: PromptCache, body: dict) -> dict:
    """Claude's usage fields for ``body``: ``input_tokens`` is what lies past the cache."""
    billed = cache.bill_claude(body)
    return {'input_tokens': billed.total - billed.read - billed.written,
            'cache_creation_input_tokens': billed.written, 'cache_read_input_tokens': billed.read,
            'cache_creation': {'ephemeral_5m_input_tokens': billed.written_5m,
                               'ephemeral_1h_input_tokens': billed.written_1h}}


def openai_cached(cache: PromptCache, body: dict, texts: Iterable[str]) -> Billed:
    """What a Chat Completions or Responses request of these input texts reads from the cache."""
    namespace = ('openai', body.get('model'), body.get('prompt_cache_key'), body.get('tools'))
    return cache.bill_prefix(namespace, words_of(texts), OPENAI_STEP, OPENAI_TTL)


def gemini_cached(cache: PromptCache, model: str, body: dict, texts: Iterable[str]) -> Billed:
    namespace = ('gemini', model, body.get('tools'))
    return cache.bill_prefix(namespace, words_of(texts), 1, GEMINI_TTL)


def words_of(texts: Iterable[str]) -> list[str]:
    return [word for text in texts if text for word in text.split()]
