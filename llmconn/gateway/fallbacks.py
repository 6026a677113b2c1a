"""Which fallbacks of a gateway request's connection could answer it, and naming the one that did.

Failover itself is the library's (:mod:`llmconn.failover`, inside
``Connection.run``). The gateway adds what only it knows: a fallback may
take a request over only if the capability matrix resolves the request on
the fallback's provider kind into the very call it makes on the primary's
(the same params, the same losses accepted), and if the fallback's
provider can continue the conversation as it stands (its history, replayed
items and hosted tools). Those are found before dispatch, and the call is
given exactly them (``CallSpec.fallbacks``); a fallback that cannot is left
out, as if it were not configured. A response whose state the primary's
provider keeps (``previous_response_id`` on a stateful backend) never fails
over: no other backend can continue it.

Who answered is in the answer: ``metadata["llmconn_served_by"]`` (set only
when a fallback answered: otherwise ``model`` already names it), and on
both routes the ``x-llmconn-served-by`` header (always; percent-encoded, as
connection names may hold any character).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable
from urllib.parse import quote

from llmconn import failover
from llmconn.errors import GatewayError, InvalidInput

logger = logging.getLogger('llmconn.gateway')

SERVED_BY_KEY = 'llmconn_served_by'
SERVED_BY_HEADER = 'x-llmconn-served-by'


def usable(conn: Any, can_take: Callable[[Any], None]) -> tuple[str, ...]:
    """The names of ``conn``'s fallbacks (its whole plan, in order) for which ``can_take(fallback)`` does
    not raise (a GatewayError or InvalidInput saying why it cannot take the request over)."""
    if not conn.conf.fallbacks:
        return ()
    peers = conn.peers
    names = failover.plan(conn.name, lambda name: peers[name].conf.fallbacks if name in peers else ())
    out = []
    for name in names:
        fallback = peers.get(name)
        if fallback is None or not fallback.conf.is_active:
            continue
        try:
            can_take(fallback)
        except (GatewayError, InvalidInput) as e:
            logger.debug('Fallback "%s" of "%s" cannot take this request: %s', name, conn.name, e)
            continue
        out.append(name)
    return tuple(out)


def same_call(primary: Any, other: Any) -> None:
    """Refuse a fallback whose resolution of the request differs from the primary's."""
    if other.params != primary.params or other.downgrades != primary.downgrades:
        raise GatewayError('the capability matrix resolves the request differently on this backend')


def header(conn: Any) -> tuple[str, str]:
    """The ``x-llmconn-served-by`` header naming ``conn``."""
    return _served_by(conn.name)


@functools.lru_cache(maxsize=256)
def _served_by(name: str) -> tuple[str, str]:
    # Quoted once per name (a configured one): urllib's quote is a dozen calls for every answer.
    return SERVED_BY_HEADER, quote(name, safe=" !#$&'()*+,/:;=?@[]~")
