"""The layout's rules, read from the source's imports: no import cycles inside localspec/, and the
llama.cpp door is the only package that imports llama-cpp-python.

Every import counts, wherever it is written (inside a function or under TYPE_CHECKING too): an import
moved into a function hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "localspec"
LLAMA_DOOR = "localspec.engine.llama"


def modules(root: Path) -> dict[str, Path]:
    """Every module under the package directory ``root``, by dotted name."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """The absolute names module ``name`` (at ``path``) imports: modules, or names inside them."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from a import b` takes b from a's __init__, or imports the module a.b
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which of the package's modules each module imports."""
    known = modules(root)
    graph = {}
    for name, path in known.items():
        edges = set()
        for target in imported(name, path):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


def test_no_import_cycles_inside_localspec():
    assert cycles(import_graph(PACKAGE)) == []


def test_a_cycle_made_on_purpose_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "rooms").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rooms" / "__init__.py").write_text("")
    (package / "top.py").write_text("from pkg.rooms.middle import helper\n")
    (package / "rooms" / "middle.py").write_text("from . import bottom\n")
    # The cycle closes inside a function, where Python would not trip over it.
    (package / "rooms" / "bottom.py").write_text("def late():\n    from pkg.rooms.middle import helper\n")
    (package / "alone.py").write_text("import pkg.top\n")
    assert cycles(import_graph(package)) == [["pkg.rooms.bottom", "pkg.rooms.middle"]]


def test_only_the_llama_door_imports_llama_cpp_python():
    outside = {
        name
        for name, path in modules(PACKAGE).items()
        if not (name == LLAMA_DOOR or name.startswith(LLAMA_DOOR + "."))
        and any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in imported(name, path))
    }
    assert outside == set()


def test_the_engine_imports_no_cli_terminal_or_http_library():
    engine = "localspec.engine"
    front_ends = ("typer", "rich", "starlette", "uvicorn", "httpx", "httpx2", "localspec.cli", "localspec.server")
    offending = {
        name: sorted(n for n in imported(name, path) if n.startswith(front_ends))
        for name, path in modules(PACKAGE).items()
        if name.startswith(engine)
    }
    assert {name: found for name, found in offending.items() if found} == {}
