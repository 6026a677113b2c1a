"""Reasoning a stateless client carries: the backend's own items, sealed into a reasoning item's ``encrypted_content``.

With ``store: false`` the gateway keeps nothing, yet Claude wants its signed
thinking blocks back before the ``tool_use`` it continues, Gemini each
``functionCall`` part with its ``thoughtSignature``, and a Responses backend
its reasoning items with their ``encrypted_content``. OpenAI's answer is
``include: ["reasoning.encrypted_content"]``: the reasoning item carries
what the next request needs, and the client sends it back. The gateway does
the same for every backend: the answer's canonical assistant item (its
text, its calls and their natives, tagged provider/model/mode, exactly
what gateway mode keeps in the ledger) is sealed into the reasoning item::

    llmconn.r1.<base64url(zlib(JSON))>.<base64url(HMAC-SHA256)>

The MAC covers the format, the key's tenant and the payload, under a
random secret the gateway keeps in Redis (``llmconn:gw:reasoning-secret``,
made once by whichever process needs it first, shared by all of them, and
read again by each request that seals or opens, so that after Redis
restarts empty every process agrees on the secret stored anew). A
client cannot alter a sealed item, forge one, or use another tenant's: each
is a 400 naming the item. The content is signed, not encrypted: it holds
nothing the client was not shown (the thinking as its summary, the text,
the calls), only the signatures that prove it to the backend.

Gemini's signature sits on the ``functionCall`` part, and OpenAI's
``function_call`` item has no field of the gateway's own, so the reasoning
item is the carrier there too (with an empty summary when the answer had
no thinking to show).

On the way back (:func:`restore`), a run of assistant-side input items (the
reasoning, message and call items of one response, up to the next output
or user message) with one sealed reasoning item becomes that answer again,
when its calls and text are the ones the client sent; a client that changed
them gets its own items sent, as plain canonical items. The replay rules
then apply as for any stored turn: natives only to the provider, model and
mode of the tag, else the turn's opaque items dropped whole. Reasoning
items without ``encrypted_content`` carry only a summary and are left out,
and so is an assistant message that is nothing but thinking in tags
(``<think>…</think>``): the same summary, written as text by a client that
sends reasoning back no other way (pydantic-ai's Responses model, for a
model it does not know as an OpenAI reasoning model);
a response's items sent back without a sealed one (no ``include`` asked
for) are found in the tool-call registry by the calls the gateway issued
(:mod:`llmconn.gateway.call_registry`), as the sealed item would have them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import weakref
import zlib
from typing import TYPE_CHECKING, Any

from llmconn import items as canon
from llmconn.errors import GatewayError

if TYPE_CHECKING:
    from llmconn.gateway.call_registry import Registry

ENCRYPTED_REASONING = 'reasoning.encrypted_content'
FORMAT = 'llmconn.r1'
SECRET_KEY = 'llmconn:gw:reasoning-secret'
SECRET_BYTES = 32
MAX_SEALED_BYTES = 8 * 1024 * 1024      # a sealed answer, unpacked; more is not one of ours
_ASSISTANT_SIDE = ('reasoning', 'function_call', 'custom_tool_call')
# An assistant message that only replays reasoning as text: one or more <think>…</think> (or <thinking>) blocks.
_THINKING_ONLY = re.compile(r'(\s*<(think|thinking)>.*?</\2>)+\s*', re.DOTALL)
_secrets: 'weakref.WeakKeyDictionary[Any, bytes]' = weakref.WeakKeyDictionary()


class Sealer:
    """Seals and opens answers for one tenant under the gateway's secret."""

    def __init__(self, secret: bytes, tenant: str) -> None:
        self._secret = secret
        self._tenant = tenant

    def __repr__(self) -> str:
        return 'Sealer(<secret>)'

    def _mac(self, payload: str) -> str:
        message = f'{FORMAT}\n{self._tenant}\n{payload}'.encode('utf-8', 'surrogatepass')
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def seal(self, answer: dict) -> str:
        """``answer`` (a canonical assistant message item) as ``encrypted_content``."""
        packed = zlib.compress(json.dumps(answer, ensure_ascii=False, separators=(',', ':')).encode('utf-8'))
        payload = _b64(packed)
        return f'{FORMAT}.{payload}.{self._mac(payload)}'

    def unseal(self, content: Any, where: str) -> dict:
        """The answer sealed in ``content``; a 400 naming ``where`` for anything this gateway did not seal."""
        prefix, _, rest = content.rpartition('.') if isinstance(content, str) else ('', '', '')
        head, _, payload = prefix.rpartition('.')
        if head != FORMAT or not payload or not hmac.compare_digest(self._mac(payload), rest):
            raise _invalid(where, 'was not made by this gateway for this tenant, or was altered')
        try:
            unpacker = zlib.decompressobj()
            raw = unpacker.decompress(base64.urlsafe_b64decode(payload + '=' * (-len(payload) % 4)),
                                      MAX_SEALED_BYTES)
            answer = json.loads(raw) if not unpacker.unconsumed_tail else None
        except (ValueError, zlib.error):
            answer = None
        if not _well_formed(answer):
            raise _invalid(where, 'does not hold an answer this gateway can read')
        return answer


def sealed_answer(sealer: Sealer | None, answer: dict) -> str:
    """The ``encrypted_content`` of an answer's reasoning item: '' unless asked for and there are natives."""
    opaque = answer.get('opaque')
    if sealer is None or not opaque:
        return ''
    if not any('native' in i or 'kind' not in i for i in opaque['items']):
        return ''       # nothing but canonical items: the client's own output items say it all
    return sealer.seal(answer)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b'=').decode('ascii')


def _invalid(where: str, why: str) -> GatewayError:
    return GatewayError(f'{where}.encrypted_content {why}; send the reasoning items of a response back unchanged '
                        f'(or leave them out)', param=f'{where}.encrypted_content', code='invalid_encrypted_content')


def _well_formed(answer: Any) -> bool:
    if not isinstance(answer, dict) or answer.get('type') != 'message' or answer.get('role') != 'assistant':
        return False
    opaque = answer.get('opaque')
    return isinstance(answer.get('text'), str) and isinstance(opaque, dict) and isinstance(opaque.get('tag'), str) \
        and isinstance(opaque.get('items'), list) and all(isinstance(i, dict) for i in opaque['items'])


def sealer(gw: Any, key: Any) -> Sealer:
    """The sealer of ``key``'s tenant, under the secret the store holds now (one read per request)."""
    return Sealer(_agreed(gw), key.tenant)


def _agreed(gw: Any) -> bytes:
    """The gateway's secret as the store holds it, made there first if absent.

    Read at every request that seals or opens, never only cached: after Redis restarts empty, every
    process must move to the one secret stored again, or each would sign with its own. Whichever
    process needs it first stores it (SET NX, then read back, so concurrent ones agree), and it offers
    the secret it knew before, so items sealed before the restart stay valid when that process is first.
    """
    stored = gw.ledger.value(SECRET_KEY)
    if stored is None:
        known = _secrets.get(gw)
        gw.ledger.put_new(SECRET_KEY, known.hex() if known is not None else secrets.token_hex(SECRET_BYTES))
        stored = gw.ledger.value(SECRET_KEY)
    secret = _secrets[gw] = bytes.fromhex(stored)
    return secret


def split_include(raw: Any) -> tuple[bool, list]:
    """``include`` as (sealed reasoning asked for, the other values for the capability matrix)."""
    if raw is None:
        return False, []
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise GatewayError('include must be a list of strings', param='include')
    return ENCRYPTED_REASONING in raw, [v for v in raw if v != ENCRYPTED_REASONING]


def has_sealed(items: list[dict]) -> bool:
    return any(i['type'] == 'reasoning' and i.get('encrypted_content') is not None for i in items)


def restore(items: list[dict], opener: Sealer | None, registry: 'Registry | None' = None) -> list[dict]:
    """``items`` with each response's sealed reasoning made its answer again, and bare reasoning items left out.

    The runs without a sealed reasoning item are looked up in the tool-call ``registry`` by the calls
    the gateway issued, all in one round trip, when one is given.
    """
    runs = _runs(items)
    bare = [i for i, run in enumerate(runs) if run['assistant'] and not _sealed(run['items'])]
    found = registry.answers([_theirs(runs[i]['items']) for i in bare]) if registry is not None and bare else []
    registered = {i: answer for i, answer in zip(bare, found) if answer}
    out: list[dict] = []
    for index, run in enumerate(runs):
        if index in registered:
            out.append(registered[index])
        elif run['assistant']:
            out += _answer(run['items'], opener)
        else:
            out += run['items']
    return out


def _runs(items: list[dict]) -> list[dict]:
    """``items`` cut into runs of one response's assistant-side items, and the other items one by one."""
    runs: list[dict] = []
    for item in items:
        assistant = item['type'] in _ASSISTANT_SIDE or (item['type'] == 'message' and item['role'] == 'assistant')
        if assistant and runs and runs[-1]['assistant']:
            runs[-1]['items'].append(item)
        else:
            runs.append({'assistant': assistant, 'items': [item]})
    return runs


def _sealed(run: list[dict]) -> list[dict]:
    return [i for i in run if i['type'] == 'reasoning' and i.get('encrypted_content') is not None]


def _theirs(run: list[dict]) -> list[dict]:
    """A response's items as the client sent them, less its reasoning (as items, or as text in tags)."""
    return [i for i in run if i['type'] != 'reasoning' and not _thinking_only(i)]


def _thinking_only(item: dict) -> bool:
    return item['type'] == 'message' and not item.get('attachments') and not item.get('opaque') \
        and _THINKING_ONLY.fullmatch(item['text']) is not None


def _answer(run: list[dict], opener: Sealer | None) -> list[dict]:
    """One response's items as the client sent them: its sealed answer if they are that answer's, else theirs."""
    sealed, theirs = _sealed(run), _theirs(run)
    if not sealed:
        return theirs
    if len(sealed) > 1:
        raise GatewayError(f'{sealed[1]["where"]}: a second reasoning item with encrypted_content in one '
                           f'response\'s items; send the items of each response as it returned them',
                           param=sealed[1]['where'])
    answer = opener.unseal(sealed[0]['encrypted_content'], sealed[0]['where'])
    steps = canon.canonical(answer['opaque']['items'], answer['text'])
    made = [(c['call_id'], c['name'], c['arguments']) for c in canon.calls(steps)]
    sent = [(i['call_id'], i['name'], i['arguments']) for i in theirs if i['type'] != 'message']
    texts = [i['text'] for i in theirs if i['type'] == 'message']
    if made != sent or (texts and ''.join(texts) != answer['text']):
        return theirs       # not that answer's calls and text as they were made: the client's own are sent
    return [answer]
