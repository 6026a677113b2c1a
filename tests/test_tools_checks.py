"""Everything about tools that is refused before any network call, and the stored item model."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmconn import InvalidInput, Tool
from llmconn.types import Turn
from tests.tools_helpers import add, connection_config, get_order


@pytest.fixture
def conn(redis_url, provider, unique, open_registry):
    hosted = [{'type': 'web_search'}]
    return open_registry(connection_config(redis_url, provider.url, unique, 'openai-responses',
                                           hosted_tools=hosted))[unique]


def schema(**properties):
    return {'type': 'object', 'properties': properties}


def nested(depth: int) -> dict:
    inner: dict = {'type': 'string'}
    for _ in range(depth):
        inner = {'type': 'object', 'properties': {'x': inner}}
    return inner


REFUSED = {
    'bad name': [Tool('get order', '', schema())],
    'empty name': [Tool('', '', schema())],
    'long name': [Tool('x' * 65, '', schema())],
    'duplicate': [get_order, Tool('get_order', '', schema())],
    'not an object schema': [Tool('t', '', {'type': 'string'})],
    'invalid schema': [Tool('t', '', {'type': 'object', 'properties': {'a': {'type': 'no-such-type'}}})],
    'too big': [Tool('t', '', schema(**{f'p{i}': {'type': 'string', 'description': 'x' * 100} for i in range(700)}))],
    'too deep': [Tool('t', '', nested(9))],
    'far too deep': [Tool('t', '', nested(5000))],
    'not JSON': [Tool('t', '', {'type': 'object', 'default': object()})],
    'not callable': [Tool('t', '', schema(), function='nope')],
    'a string': ['get_order'],
    'unlisted hosted tool': [{'type': 'code_interpreter'}],
}


@pytest.mark.parametrize('case', REFUSED)
def test_bad_tools_are_refused_before_any_request(conn, provider, case):
    with pytest.raises(InvalidInput):
        conn.chat('hi', chat_id='c', tools=REFUSED[case])
    with pytest.raises(InvalidInput):
        conn.invoke('hi', tools=REFUSED[case])
    assert provider.requests == []


def test_tools_must_be_a_list(conn, provider):
    with pytest.raises(InvalidInput, match='list'):
        conn.invoke('hi', tools=get_order)
    assert provider.requests == []


def test_a_listed_hosted_tool_is_sent_verbatim(conn, provider):
    conn.invoke('hi', tools=[add, {'type': 'web_search'}])
    assert provider.requests[0]['body']['tools'][1] == {'type': 'web_search'}


def test_schema_depth_limit_counts_levels():
    from llmconn.tools import check_schema
    check_schema('ok', nested(7))
    with pytest.raises(InvalidInput, match='16'):
        check_schema('deep', nested(8))


def test_an_old_stored_turn_loads_with_its_natives_and_chain():
    thinking = {'type': 'thinking', 'thinking': 'hm', 'signature': 's'}
    turn = Turn.from_dict({'u': 'q', 'a': 'a', 'i': [thinking], 't': 'claude/m/enabled', 'r': 'resp_1', 'c': 3,
                           'ts': 1.0})
    assert turn.state == {'response_id': 'resp_1', 'chain': 3}
    assert turn.steps() == [{'kind': 'reasoning', 'native': thinking}, {'kind': 'text', 'text': 'a'}]
    assert not turn.pending
    assert Turn.from_dict(turn.to_dict()) == turn


def test_a_pending_turn_knows_its_waiting_calls():
    call = {'kind': 'call', 'call_id': 'c1', 'name': 'n', 'arguments': {}}
    turn = Turn('q', '', items=(call,), tag='x')
    assert turn.pending == [call] and turn.steps() == [call]


def test_tools_on_a_provider_without_them_are_refused_before_any_request(redis_url, provider, unique, open_registry):
    templates = Path(__file__).resolve().parent.parent / 'etc' / 'templates'
    conn = open_registry({'redis': {'url': redis_url}, 'llm': [{
        'name': unique, 'provider': 'template', 'model': 'gpt-5-mini', 'address': provider.url + '/v1/responses',
        'request_template_file': str(templates / 'openai-responses.request.j2'),
        'response_template_file': str(templates / 'openai-responses.response.j2')}]})[unique]
    with pytest.raises(InvalidInput, match='"tools"'):
        conn.chat('hi', chat_id='c', tools=[add])
    assert provider.requests == []


def test_a_list_of_functions_is_checked_once_and_its_tools_reused():
    from llmconn import tools as mod_tools

    def lookup(order_id: str) -> dict:
        """Look an order up."""
        return {}

    first = mod_tools.prepare([lookup, add])
    assert mod_tools.prepare([lookup, add]) is first, 'the same functions are not checked again'
    assert mod_tools.prepare(iter([lookup, add])) is first, 'an iterator of them is read once, then found'
    assert [t.name for t in mod_tools.prepare((f for f in (add,)))] == ['add']


def test_a_tool_objects_schema_is_checked_on_every_call_since_the_caller_may_change_it():
    from llmconn import tools as mod_tools

    tool = Tool('t', '', schema(a={'type': 'string'}))
    assert mod_tools.prepare([tool]) == (tool,)
    tool.parameters['properties']['a'] = {'type': 'no-such-type'}
    with pytest.raises(InvalidInput, match='not a valid JSON Schema'):
        mod_tools.prepare([tool])


def test_a_duplicate_among_functions_is_refused_every_time():
    from llmconn import tools as mod_tools

    for _ in range(2):
        with pytest.raises(InvalidInput, match='given twice'):
            mod_tools.prepare([add, add])
