"""The package's layers, checked on its import graph (every import statement, including
the ones inside functions).

Lowest first; a module may import from its own layer or a lower one, never a higher one:

    errors < kernels.checks < batch < kernels < sandbox < models < engines < tasks
      < methods < backends < eval < trainer < {pipelines, experiments, integrations}
      < learn < cli

and no two modules import each other at import time (a cycle through module-level
imports). `policylab/__init__.py` imports only batch and errors; the public names
(`policylab.advantages`, ...) resolve lazily.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = (
    ("policylab.errors",),
    ("policylab.kernels.checks",),
    ("policylab.batch",),
    ("policylab.kernels",),
    ("policylab.sandbox",),
    ("policylab.models",),
    ("policylab.engines",),
    ("policylab.tasks",),
    ("policylab.methods",),
    ("policylab.backends",),
    ("policylab.eval",),
    ("policylab.trainer",),
    ("policylab.pipelines", "policylab.experiments", "policylab.integrations"),
    ("policylab.learn",),
    ("policylab.cli",),
)


def modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "policylab").rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(path: Path, *, top_level_only: bool) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import in the file (absolute or relative)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    pkg = ".".join(path.relative_to(SRC).with_suffix("").parts)
    if path.name != "__init__.py":
        pkg = pkg.rpartition(".")[0]
    else:
        pkg = pkg.removesuffix(".__init__")
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.append((base, [a.name for a in node.names]))
    return out


def edges(*, top_level_only: bool) -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for base, names in imports(path, top_level_only=top_level_only):
            targets = [f"{base}.{n}" for n in names] + [base]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                if t in mods and t != name and t.startswith("policylab"):
                    graph[name].add(t)
    return graph


def layer(module: str) -> int:
    best, best_len = None, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")
    return best


def test_every_module_has_a_layer():
    for name in modules():
        if name != "policylab":
            layer(name)


def test_no_import_runs_from_a_lower_layer_up():
    upward = sorted(f"{a} -> {b}" for a, bs in edges(top_level_only=False).items() if a != "policylab"
                    for b in bs if b != "policylab" and layer(b) > layer(a))
    assert upward == [], "imports from a lower layer up:\n" + "\n".join(upward)


def test_the_package_root_imports_only_batch_and_errors():
    assert edges(top_level_only=False)["policylab"] <= {"policylab.batch", "policylab.errors"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    # a -> b -> c -> a is one component of three; d -> a is outside it
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_import_time():
    found = _cycles(edges(top_level_only=True))
    assert found == [], "import cycles (module-level imports):\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("path", sorted((SRC / "policylab").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_name_imported_from_another_module(path):
    bad = [f"from {base} import {n}" for base, names in imports(path, top_level_only=False)
           if base.startswith("policylab") for n in names if n.startswith("_") and not n.startswith("__")]
    assert bad == [], f"{path.relative_to(SRC)} imports private names: {bad}"
