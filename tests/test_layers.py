"""The package's layering: no import cycle, no upward import -- checked statically on every module's imports.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING`` (a cycle cannot hide in a function).
"""

from __future__ import annotations

import ast
from pathlib import Path

import lightning_lmdb

#: The stages, lowest first. A module may import from its own stage and from stages before it, never after.
LAYERS = (
    "errors",
    "_moved",
    "deprecated",
    "jsonfields",
    "pathtable",
    "remote",
    "codec",
    "targets",
    "sources",
    "options",
    "store",
    "build",
    "read",
    "tools",
    "datamodule",
    "experiment",
)
PACKAGE = Path(lightning_lmdb.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The lightning_lmdb modules ``name`` imports, resolved to modules (``from pkg import sub`` is ``pkg.sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target.split(".")[0] == "lightning_lmdb")
    found.discard(name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index("_moved") if len(parts) == 1 else LAYERS.index(parts[1])  # the root imports only _moved


def test_every_module_sits_in_a_declared_layer() -> None:
    unknown = sorted(name for name in MODULES if len(name.split(".")) > 1 and name.split(".")[1] not in LAYERS)
    assert not unknown, f"add these to LAYERS (lowest first) in {__file__}: {unknown}"


def test_no_module_imports_a_later_layer() -> None:
    upward = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if target in MODULES and _layer(target) > _layer(name)
    )
    assert not upward, "upward imports:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert _cycles(GRAPH) == []


def test_the_check_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    probe = tmp_path / "probe.py"
    probe.write_text("if True:\n    def late():\n        from lightning_lmdb.store import format\n        from ..read import dataset\n")
    assert _imports("lightning_lmdb.tools.probe", probe) == {"lightning_lmdb.store.format", "lightning_lmdb.read.dataset"}
