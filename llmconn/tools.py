"""Tools the model may call: definitions, the checks made before dispatch, and running them.

A tool is a :class:`Tool` (name, description, JSON Schema ``parameters``,
and a ``function``, or None for a manual tool whose outputs the caller
gives) or a plain Python callable, whose schema pydantic derives from its
type hints and whose description is its docstring.

Everything about the definitions is checked before any network call
(:func:`prepare`): names, uniqueness, a valid draft 2020-12 object schema
within the size and depth limits, and hosted tools only where the
connection lists them. When the model calls a tool, its arguments are
validated against the schema before the function runs; an invalid call or
a function that raises is answered with an error output the model reads,
never an error of the call (:func:`run`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import logging
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import jsonschema
import pydantic
import referencing
import referencing.exceptions

from llmconn.errors import InvalidInput
from llmconn.text import clean

logger = logging.getLogger(__name__)

# \A...\Z, not ^...$: "$" also matches before a final newline, so "get_order\n" passed with .match().
NAME_PATTERN = re.compile(r'\A[a-zA-Z0-9_-]{1,64}\Z')
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 16
MAX_OUTPUT_CHARS = 1_000_000       # one output; as much as one message may carry
REF_KEYWORDS = ('$ref', '$dynamicRef')


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
            if len(_derived_validators) >= MAX_DERIVED_VALIDATORS:
                _derived_validators.clear()
            _derived_validators[id(tool)] = (tool, _validator(json.dumps(tool.parameters, sort_keys=True)))
        return tool

    @classmethod
    def _derive(cls, function: Callable) -> 'Tool':
        name = getattr(function, '__name__', '') or type(function).__name__
        doc = inspect.getdoc(function) or ''
        return cls(name=name, description=doc.strip(), parameters=schema_of(function), function=function)


_from_callable: 'weakref.WeakKeyDictionary[Callable, Tool]' = weakref.WeakKeyDictionary()
# The argument validators of derived tools, by id(tool): their schemas are made here and never
# change, so a call need not serialize one to find its validator. Tools given as llmconn.Tool are
# the caller's and are looked up by their schema's text on every call.
_derived_validators: dict[int, tuple['Tool', Any]] = {}
MAX_DERIVED_VALIDATORS = 1024


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


def check_schema(name: str, schema: Any, label: str = '') -> None:
    """One schema within the limits; ``label`` names it in errors (default: the tool's parameters)."""
    label = label or f'tool "{name}": parameters'
    if not isinstance(schema, dict) or schema.get('type') != 'object':
        raise InvalidInput(f'{label} must be a JSON Schema object with "type": "object"')
    try:
        text = json.dumps(schema, sort_keys=True)
    except RecursionError:
        raise InvalidInput(f'{label} nests deeper than the limit of {MAX_SCHEMA_DEPTH} '
                           f'levels; flatten the schema') from None
    except (TypeError, ValueError) as e:
        raise InvalidInput(f'{label} is not JSON ({e})') from None
    _check_refs(label, schema)
    _check_schema_text(label, text)


def _check_refs(label: str, schema: Any) -> None:
    """Only references inside the schema itself (``#...``): anything else would be a URL to fetch.

    jsonschema retrieves an unknown ``$ref`` over HTTP when it validates, which
    would be a request to anywhere, made while the chat's lock is held.
    """
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in REF_KEYWORDS:
                ref = value.get(key)
                if ref is not None and not (isinstance(ref, str) and ref.startswith('#')):
                    raise InvalidInput(f'{label} has {key} {_short(ref)}, which points outside '
                                       f'the schema; inline it under "$defs" and refer to it as "#/$defs/..."')
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _check_schema_text(label: str, text: str) -> None:
    """The checks of one serialized schema; a schema that passed (or failed) is not checked again."""
    digest = hashlib.sha256(text.encode('utf-8', 'surrogatepass')).digest()
    problem = _schema_problems.get(digest)
    if problem is None:
        problem = _schema_problem(text)
        if len(_schema_problems) >= MAX_CHECKED_SCHEMAS:
            _schema_problems.pop(next(iter(_schema_problems)), None)      # the oldest goes first
        _schema_problems[digest] = problem
    if problem:
        raise InvalidInput(f'{label} {problem}')


# What was found wrong with each schema checked ('' for nothing), by the digest of its text: jsonschema's
# check_schema costs about 10 µs per byte (0.4 s for 40 KB), so a schema is checked once per process,
# whatever tool name or request carries it. Digests keep the cache small however large the schemas.
MAX_CHECKED_SCHEMAS = 4096
_schema_problems: dict[bytes, str] = {}


def _schema_problem(text: str) -> str:
    schema = json.loads(text)
    size = len(text.encode('utf-8', 'surrogatepass'))
    if size > MAX_SCHEMA_BYTES:
        return f'is {size} bytes serialized, more than the limit of {MAX_SCHEMA_BYTES}; simplify the schema'
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        return f'nests {depth} levels deep, more than the limit of {MAX_SCHEMA_DEPTH}; flatten the schema'
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        return f'is not a valid JSON Schema (draft 2020-12): {e.message}'
    return ''


def check_hosted(hosted: Iterable[dict], allowed: Iterable[dict]) -> tuple[dict, ...]:
    """Hosted tools asked for in a call: each must be one the connection lists in hosted_tools."""
    allowed = list(allowed)
    for tool in hosted:
        if tool not in allowed:
            raise InvalidInput(f'hosted tool {_short(tool)} is not listed in this connection\'s hosted_tools; '
                               f'add it there to allow it')
    return tuple(hosted)


def _depth(value: Any, level: int = 1) -> int:
    if isinstance(value, dict):
        return max([level] + [_depth(v, level + 1) for v in value.values()])
    if isinstance(value, list):
        return max([level] + [_depth(v, level + 1) for v in value])
    return level - 1 if level > 1 else level


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


def validation_errors(tool: Tool, arguments: Any) -> str:
    """'' when ``arguments`` validate against the tool's schema, else what is wrong."""
    if not isinstance(arguments, dict):
        return f'arguments must be a JSON object, got {_short(arguments)}'
    derived = _derived_validators.get(id(tool))
    if derived is not None and derived[0] is tool:
        validator = derived[1]
    else:
        validator = _validator(json.dumps(tool.parameters, sort_keys=True))
    try:
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except referencing.exceptions.Unresolvable as e:
        return f'the tool\'s schema refers to {_short(str(e.ref) if hasattr(e, "ref") else str(e))}, which is not in it'
    return '; '.join(f'{"/".join(map(str, e.path)) or "(root)"}: {e.message}' for e in problems[:5])


def _refuse_retrieval(uri: str):
    raise referencing.exceptions.NoSuchResource(ref=uri)


# What a validator may resolve beyond its own schema: the JSON Schema meta-schemas (jsonschema adds
# them), nothing fetched. Its default registry would GET any unknown $ref's URL.
LOCAL_ONLY = referencing.Registry(retrieve=_refuse_retrieval)


@functools.lru_cache(maxsize=1024)
def _validator(text: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(text), registry=LOCAL_ONLY)


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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'
