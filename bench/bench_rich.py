"""What rich turns cost a call (SPEC §16): structured output's parse and validate, a stored attachment.

Structured output: a call with ``schema=`` (a pydantic model) against the
same call without, on the fake provider. What ``schema=`` adds beyond the
provider call - the schema looked up, the answer parsed and validated - is
timed with the provider call replaced by the answer it gave (so both calls
run the whole pipeline on the same answers, minus the network, whose noise
on a shared machine is larger than the figure). Timed call by call,
interleaved (``common.interleaved``). Target: <= 0.1 ms. The whole calls,
provider included, are shown beside it.

Attachments in chat memory: a chat call on a throwaway ``redis-server``
whose window holds a turn with a 1 MB image, and which attaches the same
image again (so Redis is sent no bytes: the chat holds them), against the
same call made by a caller that keeps the conversation itself (``history``
given, the image bytes sent to the provider, nothing stored, no Redis): the
provider gets the same body. Target: <= 1.2 x.

    .venv/bin/python bench/bench_rich.py [--quick]
"""

from __future__ import annotations

import argparse
import sys

import pydantic

from common import interleaved, start_redis
from llmconn import Attachment, Registry
from llmconn.types import CallSpec, Turn
from llmconn.testing.fake_server import FakeProviderServer

STRUCTURED_TARGET_S = 0.1e-3
STORED_TARGET = 1.2
# A 1 MB image: a PNG signature and filler (what the checks read; the fake reads no further).
IMAGE = b'\x89PNG\r\n\x1a\n' + b'\0' * (1024 * 1024 - 8)


class Line(pydantic.BaseModel):
    sku: str
    quantity: int
    price: float


class Invoice(pydantic.BaseModel):
    number: str
    vendor: str
    lines: list[Line]
    total: float


def drain(events) -> None:
    for _ in events:
        pass


def bench_structured(conn, scale: float) -> list:
    answers = {}        # each call's provider answer, as the pipeline got it
    original = conn._call

    def recording(request):
        reply = yield from original(request)
        answers[request.schema is not None] = reply
        return reply
    conn._call = recording
    try:
        conn.invoke('Read the invoice', schema=Invoice)
        conn.invoke('Read the invoice')
    finally:
        del conn._call
    n, rounds = int(300 * scale) or 20, 7
    whole = interleaved({'schema': lambda i: conn.invoke('Read the invoice', schema=Invoice),
                         'plain': lambda i: conn.invoke('Read the invoice')}, n, rounds)

    def answered(request):
        return answers[request.schema is not None]
        yield       # a generator, as Connection._call is
    conn._call = answered       # the provider call taken out: what is left is the pipeline's own work
    try:
        alone = interleaved({'schema': lambda i: conn.invoke('Read the invoice', schema=Invoice),
                             'plain': lambda i: conn.invoke('Read the invoice')}, n * 10, rounds)
    finally:
        del conn._call
    added = alone['schema'] - alone['plain']
    return [('schema= beyond the provider call (its pipeline against a plain invoke\'s, same answers)',
             f'{added * 1e6:.1f} µs', f'pipeline {alone["schema"] * 1e6:.0f} µs, plain {alone["plain"] * 1e6:.0f} µs',
             '≤ 100 µs', added <= STRUCTURED_TARGET_S),
            ('invoke with schema= against a plain invoke, provider call included',
             f'{whole["schema"] * 1e6:.0f} µs', f'plain {whole["plain"] * 1e6:.0f} µs', '(the fake\'s answer '
             'differs: shown, not a target)', None)]


def bench_stored_attachment(conn, scale: float) -> list:
    image = Attachment.from_bytes(IMAGE, 'image/png', 'scan.png')
    conn.chat('look', chat_id='stored', attachments=[image])
    kept = (Turn('look', 'seen', attachments=(image,)),)

    def stored(i):
        conn.chat('look', chat_id='stored', attachments=[image])

    def given(i):
        for _ in conn.run(CallSpec('look', history=kept, attachments=[image])):
            pass
    n, rounds = int(30 * scale) or 5, 5
    times = interleaved({'stored': stored, 'given': given}, n, rounds)
    ratio = times['stored'] / times['given']
    return [('chat call whose window holds a 1 MB image, against the same body with the image given, not stored',
             f'{times["stored"] * 1e3:.2f} ms = {ratio:.2f} ×', f'not stored {times["given"] * 1e3:.2f} ms',
             f'≤ {STORED_TARGET} ×', ratio <= STORED_TARGET)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='fewer calls: a smoke run, not a measurement')
    scale = 0.1 if parser.parse_args().quick else 1.0
    redis_server, redis_url = start_redis()
    try:
        with FakeProviderServer() as provider:
            registry = Registry.from_dict({'redis': {'url': redis_url}, 'llm': [
                {'name': 'bench', 'provider': 'openai', 'model': 'gpt-4o-mini', 'address': provider.url + '/v1',
                 'max_retries': 0},
                {'name': 'window', 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': provider.url,
                 'max_retries': 0, 'max_history_turns': 2}]})
            try:
                rows = bench_structured(registry['bench'], scale)
                rows += bench_stored_attachment(registry['window'], scale)
            finally:
                registry.close()
    finally:
        redis_server.kill()
    print('\nllmconn rich turns — fake provider on loopback\n')
    for figure, ours, theirs, target, met in rows:
        verdict = '' if met is None else (': yes' if met else ': NO')
        print(f'{figure}: {ours} ({theirs}); target {target}{verdict}')
    return 0 if all(row[-1] is not False for row in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
