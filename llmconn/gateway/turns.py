"""A list of canonical gateway items paired into what a provider is sent: system, turns, the turn in progress.

System and developer messages join the system prompt; the conversation
becomes user/assistant turns, each assistant side a list of canonical
:mod:`llmconn.items` (text, reasoning, calls, outputs) tagged with whose
natives it holds. The request ends either with a user message (a new turn)
or with the outputs of the last assistant's calls (the turn goes on: the
backend is sent its own calls back with their outputs, as native tool
results).

A turn's natives all belong to one tag: the client's own items (its text
after a turn's outputs, calls it made up) carry none and join a turn of any
tag, so every earlier tool turn keeps the provider items it was made with;
natives of two tags in one turn cannot both be sent, and the turn goes plain.

Strict joins, before any network call: an output must answer a call of
the assistant just before it (else a 400 naming its call id), and every
call must be answered before the conversation goes on (else a 400 naming
the unanswered ids). What the pairing cannot express otherwise is a named
loss (``system_messages_hoisted``, ``messages_merged``) or a 400.
"""

from __future__ import annotations

from llmconn import items as canon
from llmconn.errors import GatewayError
from llmconn.gateway import parts
from llmconn.gateway.echo import shown, shown_all
from llmconn.gateway.items import CALL_TYPES, MERGE_SEPARATOR, OUTPUT_TYPES, SYSTEM_ROLES, Conversation
from llmconn.gateway.policy import Policy, Resolution, check_loss
from llmconn.types import Turn


def to_conversation(items: list[dict], instructions: str, policy: Policy, resolution: Resolution) -> Conversation:
    """Pair ``items`` into turns for a provider, recording (or refusing) what that loses."""
    system = [instructions] if instructions else []
    chat: list[dict] = []       # {'role': 'user', 'text'} | {'role': 'assistant', 'steps': [...], 'tag'}
    for item in items:
        kind = item.get('type', 'message')
        if kind == 'message' and item['role'] in SYSTEM_ROLES:
            if chat:
                check_loss(resolution, policy, 'input', 'system_messages_hoisted',
                           'a system or developer message after the conversation began cannot be placed there '
                           'on this backend')
            system.append(item['text'])
        elif kind in CALL_TYPES:
            _new_call(chat, item['call_id'])
            _assistant_steps(chat, [canon.call(item['call_id'], item['name'], item['arguments'])], '', policy,
                             resolution, merge=False)
        elif kind in OUTPUT_TYPES:
            _answer(chat, item)
        elif item['role'] == 'assistant':
            _assistant_steps(chat, *_said(item), policy, resolution, merge=True)
        else:
            _user(chat, item['text'], item.get('attachments') or [], policy, resolution)
    return _conversation(MERGE_SEPARATOR.join(system), chat)


def _said(item: dict) -> tuple[list, str]:
    opaque = item.get('opaque') or {}
    if opaque:
        return canon.canonical(opaque.get('items') or (), item['text']), opaque.get('tag', '')
    return [canon.text(item['text'])], ''


def _unanswered(entry: dict) -> None:
    pending = canon.pending_calls(entry['steps'])
    if pending:
        ids = shown_all(c['call_id'] for c in pending)
        raise GatewayError(f'the function calls {ids} have no function_call_output; answer each call (its '
                           f'call_id and output) before the conversation goes on', param='input',
                           code='unanswered_function_call')


def _assistant_steps(chat: list, steps: list, tag: str, policy: Policy, resolution: Resolution,
                     merge: bool) -> None:
    if not chat or chat[-1]['role'] != 'assistant':
        chat.append({'role': 'assistant', 'steps': list(steps), 'tag': tag})
        return
    last = chat[-1]
    answered = last['steps'][-1]['kind'] == canon.OUTPUT
    if merge:
        _unanswered(last)
        if not answered:
            check_loss(resolution, policy, 'input', 'messages_merged',
                       'two assistant messages in a row cannot be sent separately on this backend')
    # A turn's natives all belong to one tag. Items without natives (the client's own text after the
    # calls) join a turn of any tag, so an earlier tool turn keeps its provider items; natives of two
    # tags cannot be sent together, and the turn goes plain.
    theirs, ours = _natives(steps), _natives(last['steps'])
    if theirs and ours and tag != last['tag']:
        last['steps'], steps, last['tag'] = canon.plain(last['steps']), canon.plain(steps), ''
    elif theirs or not ours:
        last['tag'] = tag if theirs else last['tag'] or tag
    last['steps'] += steps


def _natives(steps: list) -> bool:
    return any('native' in s for s in steps)


def _new_call(chat: list, call_id: str) -> None:
    made = {c['call_id'] for entry in chat if entry['role'] == 'assistant' for c in canon.calls(entry['steps'])}
    if call_id in made:
        raise GatewayError(f'the function call {shown(call_id)} is in the conversation twice (with '
                           f'previous_response_id, send only the function_call_output items)', param='input',
                           code='duplicate_call_id')


def _answer(chat: list, item: dict) -> None:
    last = chat[-1] if chat and chat[-1]['role'] == 'assistant' else None
    waiting = {c['call_id']: c['name'] for c in canon.pending_calls(last['steps'])} if last else {}
    if item['call_id'] not in waiting:
        raise GatewayError(f'{item["type"]} for call_id {shown(item["call_id"])} answers no function call of the '
                           f'response it continues (unknown or already answered call id)', param='input',
                           code='unknown_call_id')
    last['steps'].append(canon.output(item['call_id'], item['output'], name=waiting[item['call_id']]))


def _user(chat: list, text: str, attached: list, policy: Policy, resolution: Resolution) -> None:
    if chat and chat[-1]['role'] == 'assistant':
        _unanswered(chat[-1])
    if chat and chat[-1]['role'] == 'user':
        check_loss(resolution, policy, 'input', 'messages_merged',
                   'two user messages in a row cannot be sent separately on this backend')
        chat[-1] = {'role': 'user', 'text': chat[-1]['text'] + MERGE_SEPARATOR + text,
                    'attachments': chat[-1]['attachments'] + attached}
    else:
        chat.append({'role': 'user', 'text': text, 'attachments': list(attached)})


def _conversation(system: str, chat: list) -> Conversation:
    if not chat:
        raise GatewayError('the conversation must end with a user message', param='input')
    if chat[0]['role'] != 'user':
        raise GatewayError('the conversation must start with a user message (after any system messages)',
                           param='input')
    items, tag = (), ''
    if chat[-1]['role'] == 'assistant':
        last = chat.pop()
        _unanswered(last)
        if last['steps'][-1]['kind'] != canon.OUTPUT:
            raise GatewayError('the conversation must end with a user message or with function_call_output '
                               'items', param='input')
        items, tag = tuple(last['steps']), last['tag']
    elif not chat[-1]['text'].strip():
        raise GatewayError('the last user message is empty; send the user\'s text', param='input')
    turns = tuple(_turn(user, assistant) for user, assistant in zip(chat[0:-1:2], chat[1:-1:2]))
    return Conversation(system, turns, chat[-1]['text'], items=items, tag=tag, attachments=_attachments(chat[-1]))


def _attachments(user: dict) -> tuple:
    return tuple(parts.attachment(kept) for kept in user.get('attachments') or ())


def _turn(user: dict, assistant: dict) -> Turn:
    steps = assistant['steps']
    text = canon.final_text(steps)
    plain = len(steps) == 1 and steps[0]['kind'] == canon.TEXT and 'native' not in steps[0]
    return Turn(user=user['text'], assistant=text, items=() if plain else tuple(steps),
                tag=assistant['tag'] if not plain else '', attachments=_attachments(user))
