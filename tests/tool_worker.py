"""A separate OS process that runs tool loops on one chat, for tests across processes.

    python tests/tool_worker.py CONFIG_JSON CHAT_ID COUNT LABEL [crash]

Each of COUNT turns is a three-round loop: ``first`` asks for ``second``,
whose output the model answers. With ``crash`` the process kills itself
inside ``second`` (mid-loop, lock held). Prints one line per saved turn, then ``done``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from llmconn import Registry


def main() -> int:
    config, chat_id, count, label = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    crash = sys.argv[5:] == ['crash']

    def first(n: int) -> str:
        """Round one: asks for round two."""
        return f'call second {{"n": {n}}}'

    def second(n: int) -> str:
        """Round two: its output is the answer."""
        if crash:
            print('crashing', flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return f'{label}-{n} finished'

    registry = Registry.from_dict(config)
    conn = registry[config['llm'][0]['name']]
    for i in range(count):
        reply = conn.chat(f'call first {{"n": {i}}}', chat_id=chat_id, tools=[first, second])
        print(json.dumps({'label': label, 'i': i, 'text': reply['text'], 'rounds': reply['rounds']}), flush=True)
    registry.close()
    print('done', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
