"""The code's shape, checked: packages import only downwards along the data flow, no module import
cycle, no file over 400 lines, the package ships the product only: nothing from benchmarks/ or tests/,
no plotting at import (see docs/layout.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "speclm"
MAX_LINES = 400

# Bottom (0) to top: a package may import its own modules and packages of a lower rank only.
LAYERS = [
    ["speclm.sampling_params", "speclm.config", "speclm.data", "speclm.kernels", "speclm.threads"],
    ["speclm.kv"],
    ["speclm.models"],
    ["speclm.tokenizer", "speclm.sample"],
    ["speclm.speculative"],
    ["speclm.engine"],
    ["speclm.llm"],
    ["speclm.server", "speclm.compress"],
    ["speclm.distill", "speclm.deploy"],
    ["speclm.bench"],
    ["speclm.cli"],
    ["speclm.__main__", "speclm"],
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: its subpackage, or the top-level module itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return "speclm"
    candidate = ".".join(parts[:2])
    return candidate if candidate in RANK else "speclm"


def imports() -> dict[str, set[str]]:
    """module -> the speclm modules it imports (at any depth of its code)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            targets |= {t for t in found if t in modules and t != name}
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in graph.items():
        for target in targets:
            a, b = unit_of(source), unit_of(target)
            if a != b and RANK[b] >= RANK[a]:
                bad.append(f"{source} -> {target} ({a} rank {RANK[a]}, {b} rank {RANK[b]})")
    return sorted(bad)


def test_imports_run_down_the_layers_only():
    assert upward_imports(imports()) == []


def test_no_import_cycles():
    assert cycles(imports()) == []


def test_no_file_over_400_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def module_level_imports(tree: ast.AST) -> list[str]:
    """The modules a file imports when it is imported: every import outside function bodies."""
    found: list[str] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        found += module_level_imports(node)
    return found


def all_imports(tree: ast.AST) -> list[str]:
    return [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + [
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0
    ]


def test_the_package_imports_nothing_from_benchmarks_or_tests():
    bad = {
        str(p.relative_to(ROOT.parent)): name
        for p in ROOT.rglob("*.py")
        for name in all_imports(ast.parse(p.read_text()))
        if name.split(".")[0] in ("benchmarks", "tests")
    }
    assert bad == {}


def test_no_package_module_imports_matplotlib_when_imported():
    """matplotlib is the `bench` extra: a module may import it inside the function that plots only."""
    bad = {
        str(p.relative_to(ROOT.parent)): name
        for p in ROOT.rglob("*.py")
        for name in module_level_imports(ast.parse(p.read_text()))
        if name.split(".")[0] == "matplotlib"
    }
    assert bad == {}
    # The check sees the import inside the plotting function, so it would see one at module level.
    assert "matplotlib" in all_imports(ast.parse((ROOT / "bench" / "report.py").read_text()))


def test_importing_speclm_and_its_bench_command_loads_no_plotting_and_no_benchmark_script():
    code = (
        "import sys, speclm, speclm.cli, speclm.cli.bench, speclm.cli.bench_serve, speclm.bench.report; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'benchmarks', 'tests'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, check=True)
    assert out.stdout.strip() == "[]"


def test_runtime_dependencies_leave_plotting_and_peers_to_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]
    runtime = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert not runtime & {"matplotlib", "transformers", "llama-cpp-python"}
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["bench"])
    assert any(d.startswith("llama-cpp-python") for d in extras["peers"])
    assert not any(d.startswith("llama-cpp-python") for d in extras["test"] + extras["bench"])


if __name__ == "__main__":
    g = imports()
    print("\n".join(upward_imports(g)))
    print(cycles(g))
