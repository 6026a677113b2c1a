"""The argument checks every call makes before any network or Redis round trip.

One implementation, used by :class:`~llmconn.connection.Connection` and by
the test double :class:`~llmconn.testing.fake.FakeConnection`, so a service
tested against the fake meets exactly the refusals it will meet for real.
Each check raises :class:`~llmconn.errors.InvalidInput` saying what to send.
"""

from __future__ import annotations

import json
from typing import Any

from llmconn.errors import InvalidInput
from llmconn.providers.base import check_reserved
from llmconn.text import has_surrogate

MAX_TEXT_CHARS = 1_000_000      # one message; providers' context windows end well before this
MAX_CHAT_ID_CHARS = 256
MAX_TOOL_OUTPUT_CHARS = MAX_TEXT_CHARS          # one tool output carries at most what one message may
MAX_TOOL_OUTPUTS_CHARS = 2 * MAX_TEXT_CHARS     # all the outputs one tool_outputs= answers with


def check_text(text: Any) -> None:
    """The user's message: a non-empty str of valid Unicode, within the size limit."""
    if not isinstance(text, str):
        raise InvalidInput(f'text must be a str, got {type(text).__name__}')
    if not text.strip():
        raise InvalidInput('text is empty; send the user\'s message as a non-empty str')
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidInput(f'text has {len(text)} characters, more than the limit of {MAX_TEXT_CHARS}; '
                           f'split or shorten it')
    if has_surrogate(text):
        raise InvalidInput('text holds a lone surrogate (half of a UTF-16 pair), which is not valid '
                           'Unicode; decode the input properly or replace it with U+FFFD')


def check_chat_id(chat_id: Any, required: bool) -> None:
    """A chat id: a str of 1 to MAX_CHAT_ID_CHARS characters ('' means no chat when not required)."""
    if not isinstance(chat_id, str):
        raise InvalidInput(f'chat_id must be a str, got {type(chat_id).__name__}; '
                           f'convert ids with str() first')
    if len(chat_id) > MAX_CHAT_ID_CHARS or (required and not chat_id):
        raise InvalidInput(f'chat_id must have 1 to {MAX_CHAT_ID_CHARS} characters, got {len(chat_id)}')


def check_skill(skill: Any) -> None:
    """A skill is named by a str ('' for none); the name itself is checked by the skill cache."""
    if not isinstance(skill, str):
        raise InvalidInput(f'skill must be a str naming a skill, got {type(skill).__name__}')


def params_problem(params: Any) -> str:
    """Why ``params`` cannot go into a JSON body ('' when they can): not JSON, NaN/Infinity, bad text."""
    try:
        encoded = json.dumps(params, allow_nan=False, ensure_ascii=False)
    except ValueError as e:
        if 'not JSON compliant' in str(e):
            return 'NaN and Infinity are not JSON numbers, so no provider can read them; send finite numbers'
        return f'{e}; pass plain str, numbers, lists, dicts'
    except TypeError as e:
        return f'{e}; pass plain str, numbers, lists, dicts'
    if has_surrogate(encoded):
        return 'a string holds a lone surrogate, which is not valid Unicode; fix its decoding'
    return ''


def check_params(params: dict, reserved: frozenset[str] = frozenset()) -> None:
    """Per-call params: JSON values only, none of the keys the provider mapping sets itself."""
    if not params:
        return
    check_reserved(reserved, params, InvalidInput)
    problem = params_problem(params)
    if problem:
        raise InvalidInput(f'call parameters must be JSON values: {problem}')


def tool_output_text(value: Any) -> str:
    """A tool output as the text that goes to the model: a str as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def check_tool_outputs(outputs: dict) -> None:
    """The caller's ``tool_outputs``: each a str or JSON value of valid Unicode, within the size limits.

    They are the caller's text, as much as ``text`` is, so they are refused (not cleaned) the same way.
    """
    total = 0
    for call_id, value in outputs.items():
        try:
            text = tool_output_text(value)
        except (TypeError, ValueError):
            raise InvalidInput(f'tool_outputs[{call_id[:64]!r}] must be a str or a JSON value') from None
        if len(text) > MAX_TOOL_OUTPUT_CHARS:
            raise InvalidInput(f'tool_outputs[{call_id[:64]!r}] has {len(text)} characters, more than the limit '
                               f'of {MAX_TOOL_OUTPUT_CHARS} for one output; shorten it (the model reads it all)')
        total += len(text)
        if total > MAX_TOOL_OUTPUTS_CHARS:
            raise InvalidInput(f'tool_outputs hold more than {MAX_TOOL_OUTPUTS_CHARS} characters in all outputs '
                               f'together, over the limit; shorten them')
        if has_surrogate(text):
            raise InvalidInput(f'tool_outputs[{call_id[:64]!r}] holds a lone surrogate (half of a UTF-16 pair), '
                               f'which is not valid Unicode; decode the output properly or replace it with U+FFFD')
