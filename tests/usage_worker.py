"""A separate OS process making mixed calls, for the usage ledger's tests.

    python tests/usage_worker.py CONFIG_JSON LABEL ROUNDS [close|return|exit]

CONFIG_JSON is what ``Registry.from_dict`` takes: its first connection
answers, its second always fails (HTTP 404). Each round makes a chat call,
an invoke, a streamed chat, a streamed invoke and a failing call. Prints one
JSON line: the sums of the ``usage`` of every reply it got, and its calls and
errors. Then it closes the registry (which writes what it counted in process),
or with ``return`` or ``exit`` ends without closing it (returning from main,
or ``sys.exit(0)`` mid-function): the ledger must still write at exit.
"""

from __future__ import annotations

import json
import sys

from llmconn import LLMError, Registry


def main() -> int:
    config, label, rounds = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    ending = sys.argv[4] if len(sys.argv) > 4 else 'close'
    registry = Registry.from_dict(config)
    good, bad = registry[config['llm'][0]['name']], registry[config['llm'][1]['name']]
    sums = {'calls': 0, 'errors': 0, 'input_tokens': 0, 'output_tokens': 0}

    def count(result: dict) -> None:
        sums['calls'] += 1
        sums['input_tokens'] += result['usage']['input_tokens']
        sums['output_tokens'] += result['usage']['output_tokens']

    for i in range(rounds):
        count(good.chat(f'{label} chat {i}', chat_id=f'{label}-a'))
        count(good.invoke(f'{label} invoke {i} ' + 'x' * i))
        count(_done(good.stream(f'{label} stream {i}', chat_id=f'{label}-b')))
        count(_done(good.stream(f'{label} stream invoke {i}')))
        try:
            bad.invoke(f'{label} fails {i}')
        except LLMError:
            sums['calls'] += 1
            sums['errors'] += 1
    print(json.dumps(sums), flush=True)
    if ending == 'close':
        registry.close()
    elif ending == 'exit':
        sys.exit(0)
    return 0


def _done(events) -> dict:
    return [event.result for event in events if event.type == 'done'][0]


if __name__ == '__main__':
    sys.exit(main())
