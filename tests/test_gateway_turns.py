"""``llmconn.gateway.turns``: which provider items an earlier tool turn keeps when its conversation is paired.

A turn's natives belong to the tag (provider/model/mode) that made them.
The client's own text after a turn's outputs carries none, so the turn keeps
its natives; natives of two tags in one turn cannot both be true, and the
turn goes plain.
"""

from llmconn import items as canon
from llmconn.gateway import items
from llmconn.gateway.policy import Policy, Resolution
from llmconn.gateway.turns import to_conversation

THINKING = {'type': 'thinking', 'thinking': 'I will call get_order.', 'signature': 'sig'}
TAG = 'claude/claude-sonnet-5-5/enabled'


def answer(call_id: str, tag: str = TAG) -> dict:
    """The gateway's kept answer of one tool round: signed thinking, then the call with its native."""
    call = canon.call(call_id, 'get_order', {'order_id': call_id},
                      native={'type': 'tool_use', 'id': call_id, 'name': 'get_order', 'input': {}})
    return items.message('assistant', '', {'tag': tag, 'items': [canon.reasoning(THINKING), call]})


def pair(conversation: list) -> items.Conversation:
    return to_conversation(conversation, '', Policy(), Resolution())


def test_an_earlier_tool_turn_keeps_its_natives_when_the_clients_text_follows():
    paired = pair([items.message('user', 'first'), answer('call_1'),
                   items.function_output('call_1', 'shipped', 'input[2]'),
                   items.message('assistant', 'tool said: shipped'),         # the client's own, no natives
                   items.message('user', 'second')])
    [turn] = paired.turns
    assert turn.tag == TAG and turn.assistant == 'tool said: shipped'
    assert [s['kind'] for s in turn.items] == ['reasoning', 'call', 'output', 'text']
    assert turn.items[0]['native'] == THINKING and 'native' in turn.items[1]


def test_every_round_of_the_turn_in_progress_keeps_its_natives():
    paired = pair([items.message('user', 'first'), answer('call_1'),
                   items.function_output('call_1', 'call get_order {}', 'input[2]'), answer('call_2'),
                   items.function_output('call_2', 'shipped', 'input[4]')])
    assert paired.tag == TAG and not paired.turns
    assert [s['kind'] for s in paired.items] == ['reasoning', 'call', 'output', 'reasoning', 'call', 'output']


def test_natives_of_two_tags_in_one_turn_make_it_plain():
    other = 'claude/claude-sonnet-5-5/plain'
    paired = pair([items.message('user', 'first'), answer('call_1'),
                   items.function_output('call_1', 'call get_order {}', 'input[2]'), answer('call_2', other),
                   items.function_output('call_2', 'shipped', 'input[4]')])
    assert paired.tag == '' and all('native' not in s for s in paired.items)
    assert [s['kind'] for s in paired.items] == ['call', 'output', 'call', 'output']
