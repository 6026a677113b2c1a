"""``/v1/responses``: a request checked and resolved into a provider call, and the Response it makes.

:func:`prepare` does every check before any network call: the key's
models and hosted tools, each field against the capability matrix, the
input, and ``previous_response_id`` (same tenant, a stored mode, a status
that can be continued). It decides the new response's store mode::

    store: false                                   -> none
    the backend keeps state (Responses, state: provider)   -> provider
    retention: zero                                -> none
    otherwise                                      -> gateway (the ledger keeps the items to replay)

``instructions`` belong to one response only: they are hashed into its
record and never carried over, as OpenAI defines.

``include: ["reasoning.encrypted_content"]`` makes the answer's reasoning
item carry the backend's own items, sealed (:mod:`llmconn.gateway.reasoning`),
so a stateless client can continue a turn of function calls; sealed
reasoning items in ``input`` are opened whether or not the request asks
for more.
"""

from __future__ import annotations

import hashlib
import logging
import time as mod_time
from dataclasses import dataclass, field
from typing import Any

from llmconn.errors import GatewayError
from llmconn import items as canon
from llmconn.gateway import backend, call_registry, effective, fallbacks, forget, input_items, items as mod_items
from llmconn.gateway import reasoning
from llmconn.gateway import tools as mod_tools
from llmconn.gateway.capabilities import RESPONSES
from llmconn.gateway.echo import shown, shown_all
from llmconn.gateway.policy import Policy, check_history, resolve
from llmconn.gateway_config import Retention
from llmconn.store.records import StoreMode, new_response_id
from llmconn.gateway.stream import message_item, reasoning_item
from llmconn.gateway.turns import to_conversation

logger = logging.getLogger('llmconn.gateway')

DOWNGRADES_KEY = 'llmconn_downgrades'
MAX_METADATA_KEYS = 16          # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
_CONTINUABLE = ('completed', 'incomplete')


@dataclass
class Call:
    """One checked Responses request, ready to be sent."""

    key: Any
    conn: Any
    model: str
    stream: bool
    store: bool
    mode: StoreMode                 # who keeps its state (see llmconn.store.records)
    instructions: str | None
    metadata: dict
    params: dict
    downgrades: list
    conversation: mod_items.Conversation
    context: list                  # the canonical items the new response continues (gateway mode)
    previous: dict | None
    input: list = field(default_factory=list)      # this request's own input items (canonical)
    provider_previous_id: str = ''
    tools: tuple = ()               # manual llmconn Tools (the client runs them)
    hosted: tuple = ()              # hosted tool definitions the key and the connection allow
    echo_tools: list = field(default_factory=list)      # the Response's ``tools``
    sealer: Any = None              # seals the answer into its reasoning item (include asked for it)
    custom: frozenset = frozenset()     # the names of the request's custom tools
    expiry: float = 30 * 86400     # seconds the record is kept (gateway.response_expiry)
    id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(mod_time.time()))
    settings: dict = field(default_factory=dict)      # what the Response echoes (effective.settings)
    ended_at: int | None = None     # when it ended: one time for the answer and its record alike
    fallbacks: tuple = ()           # the connections that may take it over (llmconn.gateway.fallbacks)
    served: Any = None              # the fallback that answered, once one took the call over
    body: dict = field(default_factory=dict, repr=False)    # the request, for a fallback's settings

    @property
    def answering(self) -> Any:
        """The connection answering: ``conn``, or the fallback the call failed over to."""
        return self.served or self.conn

    def failed_over(self, fallback: Any) -> None:
        """A fallback takes the call over (before any of its events): the Response names it and
        echoes the settings it is sent with."""
        self.served = fallback
        self.metadata = dict(self.metadata, **{fallbacks.SERVED_BY_KEY: fallback.name})
        self.settings = effective.settings(fallback, self.body, self.downgrades)


def prepare(gw: Any, key: Any, body: Any) -> Call:
    """Check a create request whole, before any network call, and resolve it into a :class:`Call`."""
    if not isinstance(body, dict):
        raise GatewayError('the request body must be a JSON object')
    model = body.get('model')
    conn = gw.connection(key, model)
    check_hosted_tools(key, body.get('tools'))
    tools, hosted = mod_tools.definitions(key, conn, body.get('tools'))
    policy = Policy.parse(body.get('fallback_policy'))
    sealing, include = reasoning.split_include(body.get('include'))
    resolution = resolve(RESPONSES, backend.kind(conn), dict(body, include=include), policy)
    store, stream = _flag(body, 'store', True), _flag(body, 'stream', False)
    instructions = body.get('instructions')
    if instructions is not None:
        mod_items.check_text(instructions, 'instructions')
    new_items, sealer = _new_items(gw, key, body, sealing)
    previous = _previous(gw, key, body.get('previous_response_id'), conn)
    mode = StoreMode.NONE if not store else StoreMode.PROVIDER if conn.provider.keeps_state else \
        StoreMode.NONE if key.retention == Retention.ZERO else StoreMode.GATEWAY
    context, conversation = _conversation(previous, new_items, instructions or '', policy, resolution)
    check_history(RESPONSES, backend.kind(conn), conversation)
    custom = mod_tools.custom_names(hosted)
    mod_tools.check_items(conn, context, custom)
    backend.check_replay(conn, conversation)
    if resolution.downgrades:
        logger.info('Downgrade accepted: tenant=%s key=%s model=%s losses=%s', key.tenant, key.id, model,
                    ','.join(resolution.downgrades))
    call = Call(key=key, conn=conn, model=model, stream=stream, store=store, mode=mode,
                instructions=instructions, metadata=_metadata(body.get('metadata'), resolution.downgrades),
                params=resolution.params, downgrades=resolution.downgrades,
                conversation=conversation, context=context, previous=previous, input=new_items,
                expiry=gw.config.response_expiry,
                provider_previous_id=previous['provider_response_id'] if _provider_kept(previous) else '',
                tools=tools, hosted=hosted, sealer=sealer if sealing else None, custom=custom,
                echo_tools=[_echo(t) for t in tools] + [h for h in hosted if h.get('type') == 'custom'],
                settings=effective.settings(conn, body, resolution.downgrades))
    if mode != StoreMode.PROVIDER and not call.provider_previous_id:      # else only its backend can continue it
        call.fallbacks = fallbacks.usable(conn, lambda fallback: _can_take(key, fallback, body, include, policy,
                                                                           resolution, call))
        call.body = body
    if previous is not None:
        forget.join(gw, key.tenant, previous, call.id)      # so that deleting an ancestor finds it
    return call


def _can_take(key: Any, fallback: Any, body: dict, include: Any, policy: Policy, resolution: Any, call: Call) -> None:
    """Raise unless ``fallback`` can answer ``call`` as its connection would (llmconn.gateway.fallbacks)."""
    fallbacks.same_call(resolution, resolve(RESPONSES, backend.kind(fallback), dict(body, include=include), policy))
    check_history(RESPONSES, backend.kind(fallback), call.conversation)
    mod_tools.check_items(fallback, call.context, call.custom)
    backend.check_replay(fallback, call.conversation)
    if call.hosted and mod_tools.definitions(key, fallback, body.get('tools'))[1] != call.hosted:
        raise GatewayError('it does not run the same hosted tools')


def _new_items(gw: Any, key: Any, body: dict, sealing: bool) -> tuple[list, Any]:
    """The input as gateway items, sealed reasoning opened (or the calls' items found in the tool-call
    registry); and the tenant's sealer, when one is needed."""
    if 'input' not in body:
        raise GatewayError('input is required', param='input')
    items = mod_items.from_responses_input(body['input'])
    sealer = reasoning.sealer(gw, key) if sealing or reasoning.has_sealed(items) else None
    return reasoning.restore(items, sealer, call_registry.of(gw, key)), sealer


def _echo(tool: Any) -> dict:
    return {'type': 'function', 'name': tool.name, 'description': tool.description or None,
            'parameters': tool.parameters, 'strict': bool(tool.strict)}


def _provider_kept(previous: dict | None) -> bool:
    return previous is not None and previous['store_mode'] == StoreMode.PROVIDER


def _conversation(previous: dict | None, new_items: list, instructions: str, policy: Policy,
                  resolution: Any) -> tuple[list, mod_items.Conversation]:
    """The items the new response continues, and what the provider is sent of them.

    A chain the backend keeps gets only the new input; otherwise the stored items are replayed.
    """
    if _provider_kept(previous) and any(i['type'] in mod_items.OUTPUT_TYPES for i in new_items):
        return list(new_items), _provider_outputs(previous, new_items)
    if _provider_kept(previous):
        conversation = to_conversation(new_items, instructions, policy, resolution)
        if conversation.turns:
            raise GatewayError('input may hold only new user messages when previous_response_id continues a '
                               'response the backend keeps', param='input')
        return list(new_items), conversation
    context = list(previous.get('context') or ()) + new_items if previous else list(new_items)
    return context, to_conversation(context, instructions, policy, resolution)


def _provider_outputs(previous: dict, new_items: list) -> mod_items.Conversation:
    """Outputs continuing a chain the backend keeps: joined to the previous response's calls, all of them."""
    waiting = {c['call_id']: c['name'] for c in previous.get('tool_calls') or ()}
    outputs = []
    for item in new_items:
        if item['type'] not in mod_items.OUTPUT_TYPES:
            raise GatewayError('input may hold only function_call_output items when it answers the calls of a '
                               'response the backend keeps', param='input')
        if item['call_id'] not in waiting or item['call_id'] in {o['call_id'] for o in outputs}:
            raise GatewayError(f'{item["type"]} for call_id {shown(item["call_id"])} answers no function call '
                               f'of the response it continues (unknown or already answered call id)',
                               param='input', code='unknown_call_id')
        outputs.append(canon.output(item['call_id'], item['output'], name=waiting[item['call_id']]))
    missing = [c for c in waiting if c not in {o['call_id'] for o in outputs}]
    if missing:
        raise GatewayError(f'the function calls {shown_all(missing)} have no function_call_output; answer each '
                           f'call (its call_id and output) before the conversation goes on', param='input',
                           code='unanswered_function_call')
    return mod_items.Conversation('', (), '', items=tuple(outputs), tag='')


def check_hosted_tools(key: Any, tools: Any) -> None:
    """Hosted tools the key does not allow are refused first, before anything else is looked at."""
    if not tools:
        return
    if not isinstance(tools, list):
        raise GatewayError('tools must be a list', param='tools')
    for index, tool in enumerate(tools):
        kind = tool.get('type') if isinstance(tool, dict) else None
        if kind not in (None, 'function', 'custom') and kind not in key.hosted_tools:
            raise GatewayError(f'tools[{index}]: this key may not use the hosted tool {shown(kind)}',
                               param=f'tools[{index}].type', code='hosted_tool_not_allowed')


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise GatewayError(f'{name} must be true or false', param=name)
    return value


def _metadata(raw: Any, downgrades: list) -> dict:
    metadata = {} if raw is None else raw
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY_CHARS
            and len(v) <= MAX_METADATA_VALUE_CHARS for k, v in metadata.items()):
        raise GatewayError(f'metadata must map at most {MAX_METADATA_KEYS} keys (up to {MAX_METADATA_KEY_CHARS} '
                           f'characters) to strings (up to {MAX_METADATA_VALUE_CHARS})', param='metadata')
    if downgrades:
        metadata = dict(metadata, **{DOWNGRADES_KEY: ','.join(downgrades)})
    return metadata


def _previous(gw: Any, key: Any, previous_id: Any, conn: Any) -> dict | None:
    """The record ``previous_response_id`` names, if this key may continue it; else 404 or 400."""
    if previous_id is None:
        return None
    record = gw.ledger.get(key.tenant, previous_id) if isinstance(previous_id, str) else None
    if record is None or not key.may_use(record['model']):
        raise GatewayError(f'Previous response with id {shown(previous_id)} not found.', 404,
                           param='previous_response_id', code='previous_response_not_found')
    if record['status'] not in _CONTINUABLE:
        raise GatewayError(f'previous response {previous_id} is {record["status"]}; only a completed response '
                           f'can be continued', param='previous_response_id')
    mode = StoreMode(record['store_mode'])
    if mode == StoreMode.NONE:
        raise GatewayError(f'previous response {previous_id} was not stored (store: false or a zero-retention '
                           f'key), so there is nothing to continue from', param='previous_response_id',
                           code='previous_response_not_stored')
    if mode == StoreMode.PROVIDER and record['model'] != conn.name:
        raise GatewayError(f'previous response {previous_id} is kept by the backend of model {record["model"]!r}; '
                           f'continue it with that model', param='previous_response_id')
    if mode == StoreMode.GATEWAY and key.retention == Retention.ZERO:
        raise GatewayError('a zero-retention key cannot continue a response the gateway keeps; the replay would '
                           'reuse retained conversation text', param='previous_response_id')
    forget.check(gw, key.tenant, record)
    return record


def instructions_hash(instructions: str | None) -> str:
    return 'sha256:' + hashlib.sha256(instructions.encode('utf-8')).hexdigest() if instructions else ''


def usage_object(input_tokens: int, output_tokens: int, estimated: bool = False, *, cache_read_tokens: int = 0,
                 cache_write_tokens: int = 0, reasoning_tokens: int = 0) -> dict:
    """A Response's usage; ``usage_object(**reply.usage)`` carries a reply's cache and reasoning counts."""
    usage = {'input_tokens': input_tokens,
             'input_tokens_details': {'cached_tokens': cache_read_tokens, 'cache_write_tokens': cache_write_tokens},
             'output_tokens': output_tokens, 'output_tokens_details': {'reasoning_tokens': reasoning_tokens},
             'total_tokens': input_tokens + output_tokens}
    if estimated:
        usage['estimated'] = True
    return usage


def response_object(call: Call, status: str, output: list, usage: dict | None, *, reason: str = '',
                    error: dict | None = None) -> dict:
    """A Response as the Open Responses specification and ``openai.types.responses.Response`` shape it."""
    return _resource(id=call.id, created_at=call.created_at, completed_at=_completed_at(call, status), status=status,
                     model=call.model, output=output, instructions=call.instructions, metadata=call.metadata,
                     previous_response_id=call.previous['id'] if call.previous else None, usage=usage,
                     error=error, incomplete_details={'reason': reason} if reason else None,
                     tools=call.echo_tools, store=call.store, settings=call.settings)


def _resource(*, settings: dict, **fields: Any) -> dict:
    """Every field the specification requires, in its order; ``settings`` as :mod:`effective` made them."""
    return {'id': fields['id'], 'object': 'response', 'created_at': int(fields['created_at']),
            'completed_at': fields['completed_at'], 'status': fields['status'],
            'incomplete_details': fields['incomplete_details'], 'model': fields['model'],
            'previous_response_id': fields['previous_response_id'], 'instructions': fields['instructions'],
            'output': fields['output'], 'error': fields['error'], 'tools': fields['tools'], 'tool_choice': 'auto',
            'parallel_tool_calls': True, 'background': False, 'store': fields['store'],
            'metadata': fields['metadata'], 'usage': fields['usage'],
            **(settings or effective.stored_defaults())}


def _completed_at(call: Call, status: str) -> int | None:
    """When the response ended; only a completed one has a completion time (as OpenAI reports it)."""
    return _ended_at(call, status) if status == 'completed' else None


def _ended_at(call: Call, status: str) -> int | None:
    """The time ``call`` ended, taken once (the answer and the record, written a moment apart, agree)."""
    if status == 'in_progress':
        return None
    if call.ended_at is None:
        call.ended_at = int(mod_time.time())
    return call.ended_at


def output_items(thinking: str, text: str, status: str, calls: list | None = None, sealed: str = '',
                 custom: frozenset = frozenset()) -> list:
    """The Response's output: reasoning (carrying ``sealed``), the message (unless the answer is only calls),
    the calls (a custom tool's as ``custom_tool_call``)."""
    out = [reasoning_item(thinking, sealed=sealed)] if thinking or sealed else []
    if text or not calls:
        out.append(message_item(text, 'incomplete' if status == 'incomplete' else 'completed'))
    return out + [mod_tools.call_item(c, custom) for c in calls or ()]



def record(call: Call, status: str, usage: dict | None, output: list, *, provider_id: str = '',
           answer: dict | None = None, reason: str = '', error: dict | None = None, calls: list | None = None) -> dict:
    """The ledger record of ``call``; prompt and answer text only when stored under standard retention.

    ``answer`` is the canonical assistant item the response added to the conversation (gateway mode).
    """
    ttl = call.expiry
    rec = {'id': call.id, 'tenant': call.key.tenant, 'key_id': call.key.id, 'model': call.model,
           'provider_kind': backend.kind(call.answering), 'store_mode': call.mode, 'retention': call.key.retention,
           'previous_response_id': call.previous['id'] if call.previous else None,
           'chain': forget.chain_of(call.previous) if call.previous else call.id,
           'lineage': forget.lineage(call.previous),
           'provider_response_id': provider_id if call.mode == StoreMode.PROVIDER else '',
           'created_at': call.created_at, 'expires_at': call.created_at + ttl,
           'completed_at': _ended_at(call, status),
           'status': status, 'usage': usage or {}, 'downgrades': call.downgrades,
           'counts': {'input_items': len(call.context), 'output_items': len(output),
                      'function_calls': len(calls or ())}}
    keep_text = call.store and call.key.retention == Retention.STANDARD
    if keep_text:
        rec.update(instructions_hash=instructions_hash(call.instructions), instructions=call.instructions,
                   metadata=call.metadata, output=output, input_items=input_items.render(call.id, call.input),
                   settings=call.settings, tools=call.echo_tools)
    if calls:
        rec['tool_calls'] = mod_tools.registry(calls)
    answered = _answered(call)
    if answered:
        rec['tool_outputs'] = answered
    if reason:
        rec['incomplete_details'] = {'reason': reason}
    if error:
        # A provider's message may quote the prompt (a 400 naming the bad input): without retention
        # only its code is kept.
        rec['error'] = error if keep_text else {'code': error.get('code') or 'server_error'}
    if call.mode == StoreMode.GATEWAY and keep_text and status in _CONTINUABLE and answer is not None:
        rec['context'] = call.context + [answer]
    return rec


def _answered(call: Call) -> list:
    """The registry entries of the calls this request answers (joined to the response that made them)."""
    items = call.conversation.items
    if not items or call.previous is None:
        return []
    names = {c['call_id']: c['name'] for c in call.previous.get('tool_calls') or ()}
    return [{'call_id': i['call_id'], 'name': names.get(i['call_id'], ''), 'response_id': call.previous['id'],
             'status': 'answered'} for i in items if i['kind'] == canon.OUTPUT]


def _stored_usage(usage: dict | None) -> dict | None:
    """A record's usage as a Response carries it (a cancelled response's estimate has no details)."""
    if not usage:
        return None
    if 'input_tokens_details' in usage:
        return {k: v for k, v in usage.items() if k != 'estimated'}
    return usage_object(usage.get('input_tokens') or 0, usage.get('output_tokens') or 0)


def from_record(rec: dict) -> dict:
    """The Response a stored record describes (GET /v1/responses/{id})."""
    usage = rec.get('usage')
    return _resource(id=rec['id'], created_at=rec['created_at'],
                     completed_at=int(rec['completed_at']) if rec['status'] == 'completed' and rec.get('completed_at')
                     else None,
                     status=rec['status'], model=rec['model'], output=rec.get('output') or [],
                     instructions=rec.get('instructions'), metadata=rec.get('metadata') or {},
                     previous_response_id=rec.get('previous_response_id'),
                     usage=_stored_usage(usage),
                     error=rec.get('error'), incomplete_details=rec.get('incomplete_details'), tools=rec.get('tools') or [],
                     store=True, settings=rec.get('settings') or {})
