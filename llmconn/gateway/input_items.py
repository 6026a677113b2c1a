"""``GET /v1/responses/{id}/input_items``: the items a response was made from, listed as OpenAI lists them.

What is listed is the ``input`` of the request that created the response,
in the order it was sent, not the items of the responses it continued
(``previous_response_id``): those are listed under their own ids. The list
is rendered once, when the record is written, so a read does no work and
returns the same item ids every time:

    message (user, system, developer)   msg_<digest>   content: its input_image / input_file parts, then
                                                       one input_text part
    message (assistant)                 msg_<digest>   content: one output_text part
    function_call                       fc_<call id>   the id the gateway gave it as an output item
    function_call_output                fco_<digest>

``<digest>`` comes from the response id and the item's place in the input,
so ids are stable and unique within a response without being stored twice
or drawn at random. Only a response stored under standard retention has a
list; the route answers 404 for any other, as ``GET /v1/responses/{id}``
does: nothing of its input was kept, and none is made up.

A page is ``limit`` items (1 to 100, default 20) in ``order`` ``desc``
(newest first, OpenAI's default) or ``asc``, after the item ``after`` and
before the item ``before`` (ids of this list). A bad parameter is a 400
naming it.
"""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qsl

from llmconn.errors import GatewayError
from llmconn.gateway import parts
from llmconn.gateway.echo import param as echo_param, shown
from llmconn.gateway.tools import function_call_item

DEFAULT_LIMIT = 20              # OpenAI's defaults and bounds
MAX_LIMIT = 100
ORDERS = ('asc', 'desc')
MAX_QUERY_FIELDS = 16           # far more than the four parameters; a longer query is refused, not walked
_PARAMS = ('limit', 'order', 'after', 'before', 'include')
_DIGEST_CHARS = 48


def _digest(response_id: str, index: int) -> str:
    return hashlib.sha256(f'{response_id}:{index}'.encode()).hexdigest()[:_DIGEST_CHARS]


def render(response_id: str, items: list[dict]) -> list[dict]:
    """A request's canonical input items as Responses items, each with its derived id."""
    return [_item(response_id, index, item) for index, item in enumerate(items)]


def _item(response_id: str, index: int, item: dict) -> dict:
    kind = item.get('type', 'message')
    if kind == 'function_call':
        return function_call_item(item)
    if kind == 'function_call_output':
        return {'id': 'fco_' + _digest(response_id, index), 'type': 'function_call_output',
                'call_id': item['call_id'], 'output': item['output'], 'status': 'completed'}
    if kind != 'message':
        # An item kind this module does not know yet: listed as recorded, with an id of its own.
        public = {k: v for k, v in item.items() if k not in ('opaque', 'message')}
        return {'id': f'{kind}_' + _digest(response_id, index), **public}
    if item['role'] == 'assistant':
        part = {'type': 'output_text', 'text': item['text'], 'annotations': []}
    else:
        part = {'type': 'input_text', 'text': item['text']}
    content = [parts.listed(kept) for kept in item.get('attachments') or ()]
    content += [part] if item['text'] or not content else []
    return {'id': 'msg_' + _digest(response_id, index), 'type': 'message', 'role': item['role'],
            'status': 'completed', 'content': content}


def parse_query(query_string: str) -> dict:
    """The list parameters of a query string, checked; a 400 naming the first bad one."""
    try:
        pairs = parse_qsl(query_string, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise GatewayError(f'the query has more than {MAX_QUERY_FIELDS} parameters; input_items takes '
                           f'{", ".join(_PARAMS)}') from None
    params: dict = {}
    for name, value in pairs:
        name = 'include' if name == 'include[]' else name      # the SDK's spelling of a list
        if name not in _PARAMS:
            raise GatewayError(f'unknown query parameter {shown(name)} for input_items; the parameters are '
                               f'{", ".join(_PARAMS)}', param=echo_param(name), code='unknown_parameter')
        if name == 'include':
            if value:
                raise GatewayError('include is not supported on input_items: the gateway\'s items have no '
                                   'optional fields to add', param='include', code='unsupported_parameter')
            continue
        if name in params:
            raise GatewayError(f'{name} is given twice; give it once', param=name)
        params[name] = value
    return {'limit': _limit(params.get('limit')), 'order': _order(params.get('order')),
            'after': params.get('after') or None, 'before': params.get('before') or None}


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3 and 1 <= int(raw) <= MAX_LIMIT):
        raise GatewayError(f'limit must be a whole number from 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT})',
                           param='limit')
    return int(raw)


def _order(raw: str | None) -> str:
    if raw is None:
        return 'desc'
    if raw not in ORDERS:
        raise GatewayError('order must be "asc" or "desc" (default "desc", newest first)', param='order')
    return raw


def page(items: list[dict], params: dict) -> dict:
    """One page of ``items`` (in input order) as OpenAI's list object."""
    ordered = items if params['order'] == 'asc' else items[::-1]
    ids = [item['id'] for item in ordered]
    start = _position(ids, params['after'], 'after') + 1 if params['after'] else 0
    end = _position(ids, params['before'], 'before') if params['before'] else len(ordered)
    window = ordered[start:end] if start < end else []
    limit = params['limit']
    if params['before'] and not params['after']:
        data = window[-limit:]          # the page just before the cursor
    else:
        data = window[:limit]
    return {'object': 'list', 'data': data, 'first_id': data[0]['id'] if data else None,
            'last_id': data[-1]['id'] if data else None, 'has_more': len(window) > len(data)}


def _position(ids: list[str], wanted: str, param: str) -> int:
    try:
        return ids.index(wanted)
    except ValueError:
        raise GatewayError(f'{param} must be the id of an item of this response\'s input items (first_id or '
                           f'last_id of a page)', param=param) from None
