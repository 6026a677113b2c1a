"""Gateway errors quote a client's value cut short and escaped, never whole or raw.

Each hostile value goes to a running gateway in the place an error names
it (model, field name, call id, tool name and type, item and part type,
loss names, response ids in the path); the answer must still say what was
wrong (it starts the value) while staying short and free of raw newlines,
carriage returns, escape sequences and line separators.
"""

import json
from urllib.parse import quote

import pytest
import requests

from gateway_stack import GatewayStack
from llmconn.gateway import echo

HUGE = 'A' * 1_000_000
NASTY = 'evil\nSet-Cookie: x=1\r\n\x1b[31mred\u2028line\x00'
RAW = ('\n', '\r', '\x1b', '\u2028', '\x00')
HEADERS = {'Authorization': 'Bearer sk-gw-tenant-a-secret', 'Content-Type': 'application/json'}
TOOL = {'type': 'function', 'name': 'get_order', 'parameters': {'type': 'object', 'properties': {}}}


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1)
    yield stack
    stack.close()


def check_bounded(answer: requests.Response, status: int | tuple, start: str) -> dict:
    """The error is the expected status, short, starts quoting the value, holds nothing raw."""
    assert answer.status_code in (status if isinstance(status, tuple) else (status,)), answer.text[:500]
    assert len(answer.content) < 3000, len(answer.content)
    error = answer.json()['error']
    text = error['message'] + (error['param'] or '')
    assert not any(c in text for c in RAW), error
    assert start in error['message'], error
    return error


def post(gw, route: str, body: dict) -> requests.Response:
    return requests.post(f'{gw.url()}/{route}', data=json.dumps(body), headers=HEADERS, timeout=30)


@pytest.mark.parametrize('route, extra', [('responses', {'input': 'hi'}),
                                          ('chat/completions', {'messages': [{'role': 'user', 'content': 'hi'}]})])
def test_an_unknown_model_is_quoted_cut_short(gw, route, extra):
    error = check_bounded(post(gw, route, {'model': HUGE, **extra}), 404, "'AAAA")
    assert '…' in error['message'] and '1000000 characters' in error['message']
    error = check_bounded(post(gw, route, {'model': NASTY, **extra}), 404, "'evil\\nSet-Cookie")
    assert error['code'] == 'model_not_found'


def test_an_unknown_field_name_is_quoted_and_its_param_cut(gw):
    error = check_bounded(post(gw, 'responses', {'model': 'Chat', 'input': 'hi', HUGE: 1}), 400, "'AAAA")
    assert error['param'] == 'A' * echo.MAX_ECHO_CHARS + '…'
    error = check_bounded(post(gw, 'responses', {'model': 'Chat', 'input': 'hi', NASTY: 1}), 400, 'evil\\n')
    assert error['param'].startswith('evil\\nSet-Cookie') and error['code'] == 'unknown_field'


@pytest.mark.parametrize('value', [HUGE, NASTY])
def test_values_inside_the_input_are_quoted_cut_short(gw, value):
    start = repr(value)[:5]
    bodies = [
        {'input': [{'type': 'message', 'role': 'user', 'content': [{'type': value, 'text': 'x'}]}]},
        {'input': [{'type': value}]},
        {'input': 'hi', 'tools': [{'type': value}]},
        {'input': 'hi', 'tools': [dict(TOOL, name=value)]},
        {'input': [{'role': 'user', 'content': 'hi'},
                   {'type': 'function_call_output', 'call_id': value[:200], 'output': 'o'}]},
        {'input': 'hi', 'previous_response_id': value},
    ]
    for body in bodies:
        check_bounded(post(gw, 'responses', {'model': 'Chat', **body}), (400, 404), start)
    assert gw.fake.requests == []


def test_unknown_loss_names_are_few_and_cut(gw):
    policy = {'allow_lossy': True, 'allowed_losses': [HUGE[:100_000] + str(i) for i in range(20)]}
    error = check_bounded(post(gw, 'responses', {'model': 'Chat', 'input': 'hi', 'fallback_policy': policy}),
                          400, "'AAAA")
    assert 'and 15 more' in error['message']


def test_paths_are_quoted_cut_short(gw):
    for path in (f"responses/{'r' * 3000}", f'responses/{quote(NASTY)}', f'models/{quote(NASTY)}',
                 f'responses/{quote(NASTY)}/input_items', f"no-such-route-{'x' * 3000}"):
        answer = requests.get(f'{gw.url()}/{path}', headers=HEADERS, timeout=10)
        check_bounded(answer, 404, "'")


def test_an_unknown_query_parameter_is_quoted_cut_short(gw):
    response = requests.post(f'{gw.url()}/responses', json={'model': 'Chat', 'input': 'hi'}, headers=HEADERS,
                             timeout=10).json()
    answer = requests.get(f'{gw.url()}/responses/{response["id"]}/input_items?{quote(NASTY)}=1', headers=HEADERS,
                          timeout=10)
    error = check_bounded(answer, 400, "'evil\\n")
    assert error['param'].startswith('evil\\n')


# ---- the helpers themselves

def test_shown_escapes_and_cuts_every_kind_of_value():
    assert echo.shown('Suport') == "'Suport'"
    assert echo.shown('a\nb') == "'a\\nb'"
    assert echo.shown('\ud800') == "'\\ud800'"
    assert echo.shown(HUGE).startswith("'" + 'A' * 64 + "'…")
    assert echo.shown(7) == '7' and echo.shown(None) == 'None'
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert echo.shown(deep) == 'a list' and echo.shown({'k': HUGE}) == 'an object'


def test_bounded_is_the_last_guard_on_any_message():
    assert echo.bounded(None) is None
    text = echo.bounded('x\n' * 10_000)
    assert len(text) == echo.MAX_MESSAGE_CHARS + 1 and '\n' not in text and text.endswith('…')
    assert echo.bounded('lone \ud800 surrogate').encode('utf-8') == b'lone \\ud800 surrogate'


@pytest.mark.parametrize('sent, told', [({'Retry-After': '7'}, '7'), ({'retry-after-ms': '2500'}, '3'),
                                        ({'Retry-After': '0'}, '1'), ({'Retry-After': '999999'}, '3600'),
                                        ({'Retry-After': 'inf'}, '3600'),
                                        ({'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '1m30.2s'},
                                         '91')])
def test_a_backends_429_passes_its_retry_after_on_and_nothing_else(gw, sent, told):
    gw.fake.fail(429, headers={**sent, 'x-provider-secret': 'sk-provider-xyz', 'Set-Cookie': 'session=1',
                               'x-ratelimit-remaining-requests': '0'})
    answer = post(gw, 'chat/completions', {'model': 'Chat', 'messages': [{'role': 'user', 'content': 'hi'}]})
    assert answer.status_code == 429 and answer.json()['error']['code'] == 'rate_limit_exceeded', answer.text
    assert answer.headers['Retry-After'] == told
    assert 'retry-after-ms' not in answer.headers and 'x-provider-secret' not in answer.headers
    assert 'Set-Cookie' not in answer.headers and 'sk-provider-xyz' not in str(answer.headers)
    assert 'x-ratelimit-remaining-requests' not in answer.headers      # the provider's counters are not the key's


def test_a_backends_429_without_retry_after_sends_none(gw):
    gw.fake.fail(429)
    answer = post(gw, 'responses', {'model': 'Chat', 'input': 'hi'})
    assert answer.status_code == 429 and 'Retry-After' not in answer.headers


def test_a_streamed_request_and_a_websocket_one_get_the_backends_retry_after_too(gw):
    gw.fake.fail(429, headers={'Retry-After': '9'})
    answer = post(gw, 'responses', {'model': 'Chat', 'input': 'hi', 'stream': True})
    assert answer.status_code == 429 and answer.headers['Retry-After'] == '9'
    gw.fake.fail(429, headers={'Retry-After': '4'})
    with gw.client().responses.connect() as conn:
        conn.response.create(model='Chat', input='hi')
        event = next(iter(conn)).to_dict()
    assert event['type'] == 'error' and event['status'] == 429, event
    assert event['error']['headers'] == {'retry-after': '4'}
