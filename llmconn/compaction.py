"""Compaction (SPEC §17): the turns the window leaves behind, summarized and sent after the skill.

With ``compaction: {connection, instructions}``, a chat call whose window's
start has just moved (its window holds ``max_history_turns - window_step``
turns: the fewest it ever holds) asks the summarizing connection, under the
chat's lock and before its own provider call, to fold the turns it left
behind into the previous summary. So it costs one summarizing call per
``window_step`` calls, no more; the other calls of a step send the summary
they find. The summary is kept on the turn that call saves (``Turn.summary``,
so it expires with the chat) and found again as the newest one in the window
- or, when the window is empty at a move, among the turns it left behind.

Reading what was left behind takes one more read of the chat's turns, made
only on the calls that compact. The summarizing call is an ``invoke`` of its
connection, counted in the ledger there; its usage is also the result's
``usage['compaction']``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from llmconn.errors import ConfigError
from llmconn.types import Turn

SUMMARY_HEADER = 'Summary of the conversation so far (older messages are not shown):'
SEPARATOR = '\n\n'              # between the skill and the summary, when both are sent as one text


@dataclass
class Compacted:
    """The summary a call sends, and whether this call made it (then it is saved with its turn)."""

    summary: dict = field(default_factory=dict)
    made: bool = False
    usage: dict | None = None


def latest(turns: list[Turn]) -> dict:
    """The newest summary carried by ``turns`` (oldest first), or {}."""
    return next((dict(t.summary) for t in reversed(turns) if t.summary), {})


def summary_block(summary: dict) -> str:
    """The text a summary is sent as ('' for none)."""
    return f'{SUMMARY_HEADER}\n{summary["text"]}' if summary.get('text') else ''


def system_with(system: str, summary: dict) -> str:
    """The system prompt with the summary right after the skill."""
    block = summary_block(summary)
    if not block:
        return system
    return f'{system}{SEPARATOR}{block}' if system else block


def compact(conf: Any, window: list[Turn], read_all: Callable[[], list[Turn]], summarizer: Any) -> Compacted:
    """What ``conf``'s chat call sends as its summary, summarizing now if its window just moved.

    ``read_all`` reads every stored turn of the chat; ``summarizer`` is the
    summarizing Connection (its ``invoke`` is called at most once).
    """
    found = latest(window)
    fewest = max(conf.max_history_turns - conf.window_step, 0)
    if len(window) != fewest:
        return Compacted(found)         # the start did not move on this call
    stored = read_all()
    before = stored[:len(stored) - len(window)]
    found = found or latest(before)
    left = [t for t in before[-conf.window_step:] if t.ts > found.get('through', 0)]
    if not left:
        return Compacted(found)         # a young chat, or a later call of the step found it summarized
    result = summarizer.invoke(_prompt(conf.compaction.instructions, found.get('text', ''), left))
    summary = {'text': result['text'], 'through': left[-1].ts}
    return Compacted(summary, True, result.get('usage'))


def summarizer_of(conf: Any, peers: dict) -> Any:
    try:
        return peers[conf.compaction.connection]
    except KeyError:
        raise ConfigError(f'{conf.name}: compaction.connection {conf.compaction.connection!r} is not a connection '
                          f'of this registry; name one of {", ".join(sorted(peers))}') from None


def _prompt(instructions: str, previous: str, turns: list[Turn]) -> str:
    lines = [instructions, '']
    if previous:
        lines += ['Summary so far:', previous, '']
    lines.append('Conversation to add to it:')
    for turn in turns:
        lines += [f'User: {turn.user}', f'Assistant: {turn.assistant}']
    return '\n'.join(lines)
