"""The package's import graph is layered: no module imports a module of a higher floor, and no two
modules import each other, directly or through others (docs/repository.md is the map).

The graph is read from the source (``ast``), so an import inside a function or under
``TYPE_CHECKING`` counts: a lazy import hides a cycle from Python, not from a reader of the code.
A package's ``__init__`` that re-exports its own submodules is its front door, above them; a
module importing its own package front is a cycle like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "packfmt"

#: Floors, lowest first; a module may import modules of its own floor or below (never in a cycle).
#: A module's floor is that of its longest listed prefix.
FLOORS: list[tuple[str, ...]] = [
    # 0. foundation: errors, bytes and schemas, every invariant, pure algorithms; nothing here reads a dataset
    ("errors", "version", "_io", "_resident", "format", "index_format", "checks", "mapped", "images", "tokenize", "fast_tokenizer",
     "chat", "skips", "energon", "packing", "collection.manifest", "collection.unify",
     "collection.layout", "collection.mixture_record", "collection.lengths", "collection.member_table", "collection.member_entry", "collection.versions",
     "collection.member_template", "collection.shard_rows"),
    # 1. where bytes live: local paths or object storage (never opens a dataset)
    ("storage",),
    # 2. one store read or written; its pack indexes; what every dataset is
    ("reader", "writer", "index", "dataset"),
    # 3. many stores read as one (a store is a collection of one)
    ("collection.reader", "collection.member_checks", "collection.arrays", "collection.images", "collection.vmap",
     "collection.lazy_members", "collection.resident"),
    # 4. the door: a path or URL becomes a dataset (a remote collection may stream its members)
    ("opening", "remote"),
    # 5. what is done with a dataset: pack, merge, mix, check, describe, export, build
    ("packindex", "index_writer", "collection", "validation", "validate", "copying", "summary", "render", "inspect", "plot",
     "export_webdataset", "megatron", "sources", "workers", "record_errors", "pipeline", "engines", "build", "report_paths"),
    # 6. frameworks
    ("torch", "ray"),
    # 7. the command line
    ("cli",),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _from_target(node: ast.ImportFrom, package: str) -> str | None:
    """The packfmt module (relative to ``packfmt``) a ``from X import ...`` in ``package`` names; None outside packfmt."""
    if node.level:
        base = package.split(".") if package else []
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else []))
    if (node.module or "").startswith("packfmt"):
        return node.module.removeprefix("packfmt").lstrip(".")
    return None


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = _package(name, path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            if target is None:
                continue
            subs = [f"{target}.{a.name}" if target else a.name for a in node.names]
            hit = [s for s in subs if s in modules]
            found.update(hit if hit else [target])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("packfmt."):
                    found.add(alias.name.removeprefix("packfmt."))
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def floor_of(module: str) -> int | None:
    if module == "":  # packfmt/__init__.py: errors and version eagerly, the rest on first use (PEP 562)
        return 0
    best, floor = -1, None
    for i, names in enumerate(FLOORS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), i
    return floor


def _front_door(importer: str, imported: str) -> bool:
    """A package's __init__ importing its own submodules (its re-exports)."""
    return imported.startswith(importer + ".") if importer else True


def test_every_module_has_a_floor():
    missing = sorted(m for m in _modules() if m and floor_of(m) is None)
    assert not missing, f"modules on no floor of tests/test_import_graph.py FLOORS (add them): {missing}"


def test_no_module_imports_a_higher_floor():
    upward = []
    for importer, targets in _graph().items():
        if not importer:
            continue
        for target in targets:
            if _front_door(importer, target):
                continue
            if floor_of(target) > floor_of(importer):
                upward.append(f"{importer} (floor {floor_of(importer)}) imports {target} (floor {floor_of(target)})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    graph = {m: {t for t in ts if not _front_door(m, t)} for m, ts in _graph().items() if m}
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


#: Rooms ``storage`` never enters: it knows bytes at URLs and the cache's mechanics, never a dataset (``remote`` is the
#: one room that knows both).
STORAGE_NEVER_IMPORTS = ("collection", "reader", "index", "remote", "torch")


def test_storage_knows_bytes_only():
    found = sorted(f"{importer} imports {target}" for importer, targets in _graph().items()
                   if importer == "storage" or importer.startswith("storage.")
                   for target in targets
                   if any(target == room or target.startswith(room + ".") for room in STORAGE_NEVER_IMPORTS))
    assert not found, "storage imports a dataset room (move that code to packfmt/remote):\n" + "\n".join(found)


def test_no_private_name_of_storage_is_imported_from_outside():
    """``storage``'s contract is its public names: nothing outside it imports one spelled private (``_x``)."""
    private = []
    for name, path in _modules().items():
        if name == "storage" or name.startswith("storage."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(node, _package(name, path))
            if target is not None and (target == "storage" or target.startswith("storage.")):
                private += [f"{name} imports {target}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, "private names of storage imported from outside (make them public there):\n" + "\n".join(private)


@pytest.mark.parametrize("importer,imported,allowed", [("collection", "collection.reader", True),
                                                       ("collection.reader", "collection", False)])
def test_front_door_rule(importer, imported, allowed):
    assert _front_door(importer, imported) is allowed


def test_docs_list_the_same_floors():
    """docs/repository.md names every prefix of FLOORS on its floor's line (``a.b`` written ``a/b``)."""
    import re

    section = (PKG.parent / "docs" / "repository.md").read_text(encoding="utf-8")
    floors = dict(re.findall(r"^(\d)\. (\*\*.*?)(?=^\d\. \*\*|^\s*$)", section, re.M | re.S))
    assert sorted(floors) == [str(i) for i in range(len(FLOORS))], f"docs/repository.md floors: {sorted(floors)}"
    missing = [f"{i}: {name}" for i, names in enumerate(FLOORS) for name in names
               if not re.search(rf"`{re.escape(name.replace('.', '/'))}/?`", floors[str(i)])]
    assert not missing, f"docs/repository.md does not list these on their floor (floor: module): {missing}"
