"""Tools the model may call: definitions, and the checks made before dispatch.

A tool is a :class:`Tool` (name, description, JSON Schema ``parameters``,
and a ``function``, or None for a manual tool whose outputs the caller
gives) or a plain Python callable, whose schema pydantic derives from its
type hints and whose description is its docstring.

Everything about the definitions is checked before any network call
(:func:`prepare`): names, uniqueness, a valid draft 2020-12 object schema
within the size and depth limits (:mod:`llmconn.tool_schema`), and hosted
tools only where the connection lists them. When the model calls a tool,
:func:`run` (:mod:`llmconn.tool_runner`) validates its arguments against the
schema before the function runs; an invalid call or a function that raises
is answered with an error output the model reads, never an error of the call.
"""

from __future__ import annotations

import inspect
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pydantic

from llmconn.errors import InvalidInput
from llmconn.tool_runner import ABANDONED, MAX_OUTPUT_CHARS, run  # noqa: F401  (llmconn.tools.run as before)
from llmconn.tool_schema import (LOCAL_ONLY, MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, check_schema,  # noqa: F401
                                 remember_validator, validation_errors)
from llmconn.tool_schema import short as _short

# \A...\Z, not ^...$: "$" also matches before a final newline, so "get_order\n" passed with .match().
NAME_PATTERN = re.compile(r'\A[a-zA-Z0-9_-]{1,64}\Z')


@dataclass(frozen=True)
class Tool:
    """A function the model may call; ``function=None`` makes it manual (the caller answers)."""

    name: str
    description: str = ''
    parameters: dict = field(default_factory=lambda: {'type': 'object', 'properties': {}})
    function: Callable | None = None
    # Strict schema adherence of the model's arguments, where the provider offers it (OpenAI's
    # ``strict``, Claude's ``strict``); None leaves the provider's default. Gemini has none: refused there.
    strict: bool | None = None

    def __repr__(self) -> str:
        return f'<Tool {self.name!r}{" manual" if self.function is None else ""}>'

    @classmethod
    def from_callable(cls, function: Callable) -> 'Tool':
        """A tool from a Python callable: its name, its docstring, its type hints as the schema.

        Deriving the schema takes pydantic a while, so each function's tool is made once,
        checked once, and shared by every call that passes the function: read it, do not
        change its ``parameters`` (wrap the function in a :class:`Tool` of your own for that).
        """
        try:
            return _from_callable[function]
        except (KeyError, TypeError):
            pass
        tool = cls._derive(function)
        try:
            _from_callable[function] = tool
        except TypeError:
            pass        # not weakly referable (a builtin): derived on every call
        else:
            remember_validator(tool)
        return tool

    @classmethod
    def _derive(cls, function: Callable) -> 'Tool':
        name = getattr(function, '__name__', '') or type(function).__name__
        doc = inspect.getdoc(function) or ''
        return cls(name=name, description=doc.strip(), parameters=schema_of(function), function=function)


_from_callable: 'weakref.WeakKeyDictionary[Callable, Tool]' = weakref.WeakKeyDictionary()


def schema_of(function: Callable) -> dict:
    """The JSON Schema of a callable's parameters, from its type hints (pydantic)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f'tool {function!r}: cannot read its signature ({e}); wrap it in llmconn.Tool '
                           f'with an explicit parameters schema') from None
    fields: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = Any if param.annotation is param.empty else param.annotation
        default = ... if param.default is param.empty else param.default
        fields[name] = (annotation, default)
    try:
        model = pydantic.create_model(f'{getattr(function, "__name__", "tool")}_args', **fields)
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError, NameError) as e:
        raise InvalidInput(f'tool {function!r}: its type hints do not make a JSON Schema ({e}); use '
                           f'JSON-able hints (str, int, float, bool, list, dict, pydantic models) or '
                           f'llmconn.Tool with an explicit schema') from None
    schema.pop('title', None)
    for prop in schema.get('properties', {}).values():
        prop.pop('title', None)
    return schema


# tools= lists of plain callables already checked, as tuples of them: a service passes the same
# functions on every call. Their tools are derived here, so nothing can change what was checked.
# A call that gives llmconn.Tool objects is checked every time (their schemas are the caller's dicts).
_prepared: dict[tuple, tuple[Tool, ...]] = {}
MAX_PREPARED = 256


def prepare(tools: Any) -> tuple[Tool, ...]:
    """``tools=`` as checked :class:`Tool` objects, or :class:`InvalidInput` saying what is wrong."""
    if tools is None:
        return ()
    if isinstance(tools, (Tool, str, bytes, dict)) or callable(tools) and not isinstance(tools, (list, tuple)):
        raise InvalidInput('tools must be a list of callables or llmconn.Tool objects, e.g. tools=[get_order]')
    key = tuple(tools)
    try:
        return _prepared[key]
    except (KeyError, TypeError):       # not seen, or an unhashable entry
        pass
    prepared = _checked(key)
    if all(callable(t) and not isinstance(t, Tool) for t in key):
        try:
            if len(_prepared) >= MAX_PREPARED:
                _prepared.clear()
            _prepared[key] = prepared
        except TypeError:
            pass
    return prepared


def _checked(tools: tuple) -> tuple[Tool, ...]:
    prepared = []
    for tool in tools:
        if isinstance(tool, Tool):
            prepared.append(tool)
        elif isinstance(tool, dict):
            raise InvalidInput(f'tools: {_short(tool)} is a dict; provider-native (hosted) tools are declared '
                               f'in the connection\'s hosted_tools, functions as callables or llmconn.Tool')
        elif callable(tool):
            prepared.append(Tool.from_callable(tool))
        else:
            raise InvalidInput(f'tools: {_short(tool)} is neither a callable nor an llmconn.Tool')
    seen: set[str] = set()
    for tool in prepared:
        check(tool)
        if tool.name in seen:
            raise InvalidInput(f'tools: the name "{tool.name}" is given twice; tool names must be unique')
        seen.add(tool.name)
    return tuple(prepared)


def check(tool: Tool) -> None:
    """Name, description and schema of one tool, as the providers will demand them."""
    if not isinstance(tool.name, str) or not NAME_PATTERN.fullmatch(tool.name):
        raise InvalidInput(f'tool name {tool.name!r} is invalid: use 1 to 64 letters, digits, "_" or "-"')
    if not isinstance(tool.description, str):
        raise InvalidInput(f'tool "{tool.name}": description must be a str')
    if tool.function is not None and not callable(tool.function):
        raise InvalidInput(f'tool "{tool.name}": function must be callable, or None for a manual tool')
    check_schema(tool.name, tool.parameters)


def check_hosted(hosted: Iterable[dict], allowed: Iterable[dict]) -> tuple[dict, ...]:
    """Hosted tools asked for in a call: each must be one the connection lists in hosted_tools."""
    allowed = list(allowed)
    for tool in hosted:
        if tool not in allowed:
            raise InvalidInput(f'hosted tool {_short(tool)} is not listed in this connection\'s hosted_tools; '
                               f'add it there to allow it')
    return tuple(hosted)
