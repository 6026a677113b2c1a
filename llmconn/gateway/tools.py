"""Client-defined function tools through the gateway, and the function calls a backend makes.

The gateway never runs a tool: every function tool becomes a manual
:class:`llmconn.tools.Tool` (``function=None``) and goes to the backend
through the library's provider mapping; the backend's calls come back to the
client as ``function_call`` output items (Responses) or ``tool_calls``
(Chat Completions), with the provider's call id (or the one the mapping
synthesized, recorded with the response so it never changes).

The tool-call registry is part of each ledger record: ``tool_calls`` lists
the calls a response made (call_id, name, status ``awaiting_output``), and
the response that answers them lists them in ``tool_outputs`` (call_id,
name, the response id that made the call, status ``answered``).

Hosted tools (``web_search`` and the like) pass only when the key allows
them and the connection lists them in its ``hosted_tools``; otherwise the
request is refused before dispatch.

Custom tools (``{"type": "custom", "name", "description", "format"}``,
free-form input, Responses only) go verbatim to a backend whose provider
has the ``custom_tools`` capability (``openai-responses``); any other is a
400 naming the tool before dispatch. Their calls come back as
``custom_tool_call`` items (``input``: text) and are answered by
``custom_tool_call_output`` items; inside the gateway a custom call is a
call whose arguments are ``{"input": <text>}``.
"""

from __future__ import annotations

import json
from typing import Any

from llmconn import tools as mod_tools
from llmconn.errors import GatewayError, InvalidInput
from llmconn.gateway import offload
from llmconn.gateway.echo import shown
from llmconn.gateway.backend import kind
from llmconn.gateway.items import CUSTOM_TYPES
from llmconn.gateway.stream import arguments_text, item_id  # noqa: F401 - arguments_text: part of this API
from llmconn.providers import PROVIDERS
from llmconn.providers.base import CUSTOM_TOOLS

# Named in errors: the provider kinds that take custom tools.
CUSTOM_BACKENDS = ' or '.join(name for name, cls in PROVIDERS.items() if CUSTOM_TOOLS in cls.capabilities)

FUNCTION_KINDS = (None, 'function')
CUSTOM_KIND = 'custom'
_CUSTOM_FIELDS = ('type', 'name', 'description', 'format')
_GRAMMAR_SYNTAXES = ('lark', 'regex')
# The work of checking a request's tool schemas grows with their size (about 10 µs per byte, uncached):
# its budget, and the size past which the check leaves the hub (a few KB already cost tens of ms).
MAX_TOOL_SCHEMA_BYTES = 256 * 1024
OFF_HUB_SCHEMA_BYTES = 8 * 1024


def definitions(key: Any, conn: Any, raw: Any, chat: bool = False) -> tuple[tuple, tuple]:
    """``tools`` as (manual Tools, hosted definitions); 400 naming the entry for anything wrong."""
    if not raw:
        return (), ()
    if not isinstance(raw, list):
        raise GatewayError('tools must be a list', param='tools')
    functions, hosted = [], []
    for index, tool in enumerate(raw):
        where = f'tools[{index}]'
        if not isinstance(tool, dict):
            raise GatewayError(f'{where} must be an object', param=where)
        kind = tool.get('type')
        if kind in FUNCTION_KINDS:
            functions.append(_function(tool.get('function') if chat else tool, where + ('.function' if chat else '')))
        elif kind == CUSTOM_KIND:
            hosted.append(_custom(conn, tool, where, chat))
        elif kind in key.hosted_tools:
            hosted.append(_hosted(conn, tool, where))
        else:
            raise GatewayError(f'{where}: this key may not use the hosted tool {shown(kind)}', param=f'{where}.type',
                               code='hosted_tool_not_allowed')
    size = _schema_bytes(functions)
    try:
        # The schemas' check is the costly part of a request with large tools: off the hub past a few KB.
        functions = offload.run(mod_tools.prepare, functions) if size > OFF_HUB_SCHEMA_BYTES else \
            mod_tools.prepare(functions)
    except InvalidInput as e:
        raise GatewayError(str(e), param='tools') from None
    names = [t.name for t in functions] + [h['name'] for h in hosted if h.get('type') == CUSTOM_KIND]
    if len(set(names)) != len(names):
        raise GatewayError('tools: two tools have the same name; give each tool its own', param='tools')
    return functions, tuple(hosted)


def _schema_bytes(functions: list) -> int:
    """The serialized size of the function tools' schemas; a 400 once it passes the request's budget."""
    size = 0
    for tool in functions:
        try:
            size += len(json.dumps(tool.parameters, ensure_ascii=False))
        except RecursionError:
            raise GatewayError(f'tools: the parameters of {shown(tool.name)} nest too deeply; flatten the schema',
                               param='tools') from None
        if size > MAX_TOOL_SCHEMA_BYTES:
            raise GatewayError(f'tools: the function schemas are more than {MAX_TOOL_SCHEMA_BYTES} bytes '
                               f'serialized, the limit of one request; send fewer or smaller tools',
                               param='tools', code='tools_too_large')
    return size


def _custom(conn: Any, tool: dict, where: str, chat: bool) -> dict:
    """A custom tool's definition, checked, for an openai-responses backend only."""
    if chat:
        raise GatewayError(f'{where}: custom tools are offered on /v1/responses only', param=f'{where}.type',
                           code='unsupported_field')
    if CUSTOM_TOOLS not in conn.provider.capabilities:
        raise GatewayError(f'{where}: custom tools (type "custom", free-form input) need an {CUSTOM_BACKENDS} '
                           f'backend; model {conn.name!r} is a {kind(conn)} backend. Declare a function tool '
                           f'instead', param=f'{where}.type', code='unsupported_field')
    extra = sorted(set(tool) - set(_CUSTOM_FIELDS))
    if extra:
        raise GatewayError(f'{where}.{extra[0]} is not supported through the gateway', param=f'{where}.{extra[0]}',
                           code='unsupported_field')
    if not isinstance(tool.get('name'), str) or not mod_tools.NAME_PATTERN.match(tool['name']):
        raise GatewayError(f'{where}.name is required: letters, digits, _ and -, at most 64 characters',
                           param=f'{where}.name')
    if not isinstance(tool.get('description') or '', str):
        raise GatewayError(f'{where}.description must be a string', param=f'{where}.description')
    _check_format(tool.get('format'), f'{where}.format')
    return {k: tool[k] for k in _CUSTOM_FIELDS if tool.get(k) is not None}


def _check_format(fmt: Any, where: str) -> None:
    if fmt is None or fmt == {'type': 'text'}:
        return
    if not isinstance(fmt, dict) or fmt.get('type') != 'grammar' or set(fmt) - {'type', 'syntax', 'definition'} \
            or fmt.get('syntax') not in _GRAMMAR_SYNTAXES or not isinstance(fmt.get('definition'), str):
        raise GatewayError(f'{where} must be {{"type": "text"}} or {{"type": "grammar", "syntax": "lark" | "regex", '
                           f'"definition": str}}', param=where)


def check_items(conn: Any, context: list, custom: frozenset) -> None:
    """Custom tool items only to a backend that has custom tools, and only for the custom tools declared."""
    item = next((i for i in context if i['type'] in CUSTOM_TYPES), None)
    if item is not None and CUSTOM_TOOLS not in conn.provider.capabilities:
        raise GatewayError(f'input: {item["type"]} items need an {CUSTOM_BACKENDS} backend; model {conn.name!r} is a '
                           f'{kind(conn)} backend', param='input', code='unsupported_field')
    undeclared = sorted({i['name'] for i in context if i['type'] == 'custom_tool_call'} - custom)
    if undeclared:
        raise GatewayError(f'input: custom_tool_call items of {", ".join(undeclared)}, which tools does not declare; '
                           f'declare each custom tool on every request (as type "custom")', param='tools')


def custom_names(hosted: Any) -> frozenset:
    """The names of the custom tools among a request's hosted definitions."""
    return frozenset(h['name'] for h in hosted if h.get('type') == CUSTOM_KIND)


def _function(spec: Any, where: str) -> mod_tools.Tool:
    if not isinstance(spec, dict) or not isinstance(spec.get('name'), str):
        raise GatewayError(f'{where}.name is required (a string)', param=f'{where}.name')
    if not mod_tools.NAME_PATTERN.fullmatch(spec["name"]):      # checked here so the refusal quotes it cut short
        raise GatewayError(f'{where}.name {shown(spec["name"])} is invalid: use 1 to 64 letters, digits, "_" or "-"',
                           param=f'{where}.name')
    description = spec.get('description') or ''
    parameters = spec.get('parameters')
    if parameters is None:
        parameters = {'type': 'object', 'properties': {}}
    if not isinstance(description, str):
        raise GatewayError(f'{where}.description must be a string', param=f'{where}.description')
    strict = spec.get('strict')
    if strict is not None and not isinstance(strict, bool):
        raise GatewayError(f'{where}.strict must be true, false or null', param=f'{where}.strict')
    return mod_tools.Tool(name=spec['name'], description=description, parameters=parameters, function=None,
                          strict=strict)


def _hosted(conn: Any, tool: dict, where: str) -> dict:
    try:
        return mod_tools.check_hosted([tool], conn.conf.hosted_tools)[0]
    except InvalidInput as e:
        raise GatewayError(f'{where}: the backend of this model does not run it ({e})', param='tools',
                           code='hosted_tool_not_allowed') from None


def function_call_item(call: dict, status: str = 'completed') -> dict:
    """A Responses ``function_call`` output item (``openai.types.responses.ResponseFunctionToolCall``)."""
    return {'type': 'function_call', 'id': 'fc_' + call['call_id'].removeprefix('call_').removeprefix('toolu_'),
            'call_id': call['call_id'], 'name': call['name'], 'arguments': arguments_text(call['arguments']),
            'status': status}


def custom_call_item(call: dict) -> dict:
    """A Responses ``custom_tool_call`` output item (``openai.types.responses.ResponseCustomToolCall``)."""
    arguments = call['arguments']
    text = arguments.get('input') if isinstance(arguments, dict) else arguments
    return {'type': 'custom_tool_call', 'id': 'ctc_' + call['call_id'].removeprefix('call_'),
            'call_id': call['call_id'], 'name': call['name'], 'input': text if isinstance(text, str) else ''}


def call_item(call: dict, custom: frozenset = frozenset()) -> dict:
    """A call as its Responses output item: a custom tool's or a function's."""
    return custom_call_item(call) if call['name'] in custom else function_call_item(call)


def chat_tool_call(call: dict, index: int | None = None) -> dict:
    """A Chat Completions ``tool_calls`` entry."""
    entry = {'id': call['call_id'], 'type': 'function',
             'function': {'name': call['name'], 'arguments': arguments_text(call['arguments'])}}
    return entry if index is None else dict(entry, index=index)


def with_ids(calls: list[dict]) -> list[dict]:
    """Calls with a call id each (a backend that gave none gets one, made once here)."""
    return [c if c.get('call_id') else dict(c, call_id=item_id('call')) for c in calls]


def registry(calls: list[dict]) -> list[dict]:
    """The calls a response made, as its record lists them."""
    return [{'call_id': c['call_id'], 'name': c['name'], 'status': 'awaiting_output'} for c in calls]
