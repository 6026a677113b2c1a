"""The README's five lines of the ``openai`` SDK run as written against the demo configuration."""

import contextlib
import io
import os
import re
from pathlib import Path

from conftest import free_port
from llmconn.demo import start_server, stop
from llmconn.server import DEFAULT_PORT
from llmconn.testing.fake_server import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent


def readme_snippet() -> str:
    section = (ROOT / 'README.md').read_text().split('## The OpenAI API', 1)[1]
    return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_the_readme_openai_snippet_runs_against_the_demo_configuration(tmp_path):
    snippet = readme_snippet()
    assert len(snippet.strip().splitlines()) == 5
    expected = snippet.rsplit('# ', 1)[1].strip()
    port = free_port()
    env = dict(os.environ)
    for name in ('REDIS_URL', 'LLMCONN_API_KEY', 'LLMCONN_GATEWAY_KEY', 'ANTHROPIC_API_KEY'):
        env.pop(name, None)
    with FakeProviderServer() as fake:
        env['LLMCONN_PROVIDER_ADDRESS'] = fake.url
        proc = start_server(ROOT / 'etc' / 'embedded.yaml', ROOT / 'services', port, env=env)
        try:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(snippet.replace(f':{DEFAULT_PORT}/', f':{port}/'), {})
        finally:
            stop(proc)
    assert out.getvalue().strip() == expected
