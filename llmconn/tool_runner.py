"""Running one tool call the model made: validated arguments, a deadline, an output the model reads.

:func:`run` never raises for the tool's own failures: an unknown tool,
arguments that do not validate against its schema
(:func:`llmconn.tool_schema.validation_errors`), a function that raises or
overruns the connection's ``tool_timeout`` are each answered with an error
output, as the model expects, and the output is cleaned and cut to
:data:`MAX_OUTPUT_CHARS`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

import pydantic

from llmconn.text import clean
from llmconn.tool_schema import validation_errors

if TYPE_CHECKING:
    from llmconn.tools import Tool

logger = logging.getLogger('llmconn.tools')      # the logger tools have always logged to

MAX_OUTPUT_CHARS = 1_000_000       # one output; as much as one message may carry


def run(tool: Tool | None, name: str, arguments: Any, timeout: float | None = None) -> tuple[str, bool]:
    """Run one call: ``(output, is_error)``; never raises for the tool's own failures.

    With ``timeout`` (the connection's ``tool_timeout``) a function still running after that many
    seconds is abandoned and answered with an error output, so a hung tool cannot hold its chat's
    lock for as long as it hangs; see :func:`_call_within`.
    """
    if tool is None:
        return f'error: there is no tool named "{name}"', True
    errors = validation_errors(tool, arguments)
    if errors:
        return f'error: invalid arguments for {name}: {errors}', True
    try:
        result = tool.function(**arguments) if timeout is None else _call_within(tool.function, arguments, timeout)
    except Exception as e:      # the tool's failure is the model's to read, not the caller's
        return clean(f'error: {type(e).__name__}: {e}'), True
    if result is ABANDONED:
        logger.warning('tool %r did not return within tool_timeout (%g s); its output is an error and the '
                       'function was left to finish on its own', name, timeout)
        return (f'error: the tool did not return within {timeout:g} s (tool_timeout) and was abandoned; '
                f'try again or do without it'), True
    return _as_output(result), False


ABANDONED = object()    # what _call_within returns for a function still running at its deadline


def _call_within(function: Callable, arguments: dict, timeout: float) -> Any:
    """``function(**arguments)`` in a thread of its own, waited for at most ``timeout`` seconds
    (:data:`ABANDONED` when it did not return by then).

    A Python thread cannot be stopped, so one that overruns is left running (a daemon) and its
    result is dropped. Under gevent the thread is a greenlet, which the wait can only leave when
    the tool yields (any patched I/O or sleep does); a tool that spins the CPU without yielding
    holds the whole process, deadline or not. The caller's context variables go with the call.
    """
    outcome: list = []

    def target() -> None:
        try:
            outcome.append((True, function(**arguments)))
        except BaseException as e:      # noqa: B036 - handed to the caller's thread, which decides
            outcome.append((False, e))

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(target,), name='llmconn-tool', daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return ABANDONED
    done, value = outcome[0]
    if done:
        return value
    raise value


def _as_output(result: Any) -> str:
    if isinstance(result, str):
        text = result
    elif isinstance(result, pydantic.BaseModel):
        text = result.model_dump_json()
    else:
        try:
            text = json.dumps(result, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = str(result)
    # A tool is not the caller: a lone surrogate in what it returns is cleaned, not refused, so it
    # never reaches Redis or a client. Cleaned first, so the cut cannot split a pair.
    return clean(text)[:MAX_OUTPUT_CHARS]
