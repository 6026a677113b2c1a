"""The README's Tools example runs as written against the fake provider."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / 'README.md'


def test_the_readme_tools_example_runs_as_written():
    section = README.read_text().split('## Tools\n', 1)[1].split('\n## ', 1)[0]
    [block] = re.findall(r'```python\n(.*?)```', section, re.DOTALL)
    exec(compile(block, 'README.md (Tools)', 'exec'), {})
