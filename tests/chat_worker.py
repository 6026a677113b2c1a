"""A separate OS process that makes chat calls, for tests of behaviour across servers.

    python tests/chat_worker.py CONFIG_JSON CHAT_ID COUNT LABEL

CONFIG_JSON is what ``Registry.from_dict`` takes; the first connection is
used. Prints one line per saved call, then ``done``.
"""

from __future__ import annotations

import json
import sys

from llmconn import Registry


def main() -> int:
    config, chat_id, count, label = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    registry = Registry.from_dict(config)
    conn = registry[config['llm'][0]['name']]
    for i in range(count):
        reply = conn.chat(f'{label}-{i}', chat_id=chat_id)
        print(reply['text'], flush=True)
    registry.close()
    print('done', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
