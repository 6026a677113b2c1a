"""Skills: ``skills_dir/<name>/SKILL.md`` files sent as the system prompt.

A skill file has YAML front matter (``name``, ``description``) and a body,
the instructions. Files are parsed once and cached; a cheap ``stat`` on each
use notices an edited file and re-reads it, so admins can change a skill
without a restart. Only bare names are accepted: a skill name can never
reach outside the skills directory.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmconn.errors import InvalidInput

SKILL_FILE_NAME = 'SKILL.md'
_bare_name = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$')
_front_matter = re.compile(r'\A---\s*\n(.*?)\n---\s*(?:\n|\Z)', re.S)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    instructions: str


class SkillCache:
    """Skills of one directory, parsed once and re-read when their file changes."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self._cache: dict[str, tuple[tuple[int, int], Skill]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Skill:
        """The skill of that name; InvalidInput if the name is not bare or has no file."""
        if not isinstance(name, str) or not _bare_name.match(name) or '..' in name:
            raise InvalidInput(f'skill name {name!r} is not valid; use a bare directory name under '
                               f'{self.directory} such as "support-agent"')
        path = self.directory / name / SKILL_FILE_NAME
        try:
            stat = path.stat()
        except OSError:
            raise InvalidInput(f'skill "{name}" not found: create {path}') from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(name)
        if cached and cached[0] == stamp:
            return cached[1]
        skill = self._parse(name, path)
        with self._lock:
            self._cache[name] = (stamp, skill)
        return skill

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.parent.name for p in self.directory.glob(f'*/{SKILL_FILE_NAME}'))

    @staticmethod
    def _parse(name: str, path: Path) -> Skill:
        text = path.read_text(encoding='utf-8')
        meta: dict = {}
        match = _front_matter.match(text)
        if match:
            try:
                meta = yaml.safe_load(match.group(1)) or {}
            except yaml.YAMLError as e:
                raise InvalidInput(f'skill "{name}": the front matter of {path} is not valid YAML: {e}') from None
            if not isinstance(meta, dict):
                raise InvalidInput(f'skill "{name}": the front matter of {path} must be a mapping')
            text = text[match.end():]
        instructions = text.strip()
        if not instructions:
            raise InvalidInput(f'skill "{name}": {path} has no instructions after its front matter')
        return Skill(name=str(meta.get('name') or name), description=str(meta.get('description') or ''),
                     instructions=instructions)
