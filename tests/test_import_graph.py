"""No import cycle in llmconn: every ``import`` of every module, function-level ones included.

The graph is read from the source (ast), so an import inside a function
counts as much as one at the top: a cycle that only a lazy import hides is
still a cycle between two modules that each need the other. Imports under
``if TYPE_CHECKING:`` never run and do not count. A package's ``__init__``
that a submodule import runs on the way is not an edge (every module would
then depend on ``llmconn/__init__.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import llmconn

PACKAGE = Path(llmconn.__file__).parent


def module_files() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob('*.py'):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
        files[name] = path
    return files


def _type_checking_only(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
            skipped.update(id(n) for sub in node.body for n in ast.walk(sub))
    return skipped


def _imported(node: ast.AST, module: str, is_package: bool, files: dict) -> list[str]:
    """The llmconn modules ``node`` imports: ``from x import y`` imports module ``x.y`` if there is one, else ``x``."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
            parent = module if is_package else module.rpartition('.')[0]
            for _ in range(node.level - 1):
                parent = parent.rpartition('.')[0]
            base = f'{parent}.{base}' if base else parent
        names = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in files else base for alias in node.names]
    else:
        return []
    found = []
    for name in names:
        while name and name not in files:
            name = name.rpartition('.')[0]
        if name.startswith('llmconn'):
            found.append(name)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of the first such import}."""
    files = module_files()
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding='utf-8'))
        skipped = _type_checking_only(tree)
        edges = graph[module] = {}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            for target in _imported(node, module, path.name == '__init__.py', files):
                if target != module:
                    edges.setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_llmconn_has_no_import_cycle():
    graph = import_graph()
    problems = []
    for component in cycles(graph):
        members = set(component)
        lines = [f'  {m} imports {t} (line {graph[m][t]})' for m in component for t in sorted(graph[m]) if t in members]
        problems.append('\n'.join([' <-> '.join(component), *lines]))
    assert not problems, 'import cycles (move what both need into a module below them):\n' + '\n'.join(problems)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    # The checker itself: a cycle through a lazy import, and one through a relative import, are found.
    package = tmp_path / 'llmconn'
    (package / 'sub').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'a.py').write_text('def f():\n    from llmconn import b\n')
    (package / 'b.py').write_text('from llmconn.a import f\n')
    (package / 'sub' / '__init__.py').write_text('')
    (package / 'sub' / 'c.py').write_text('from . import d\n')
    (package / 'sub' / 'd.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import x\n'
                                          'def g():\n    from .c import y\n')
    (package / 'e.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmconn import a\n')
    monkeypatch.setattr(sys.modules[__name__], 'PACKAGE', package)
    graph = import_graph()
    assert sorted(cycles(graph)) == [['llmconn.a', 'llmconn.b'], ['llmconn.sub.c', 'llmconn.sub.d']]
    assert graph['llmconn.e'] == {}          # TYPE_CHECKING only: never imported at run time


def test_the_core_configuration_loads_no_gateway_module():
    # The gateway: section is validated with the rest of llm.yaml, by llmconn.gateway_config; the
    # gateway's code (routes, mappings, its store) is loaded only by a server that serves /v1/.
    import subprocess
    code = ('import sys, llmconn.config, llmconn.registry; '
            'print(sorted(m for m in sys.modules if m.startswith("llmconn.gateway.") or m == "llmconn.gateway"))')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == '[]'
