"""The packages import downward only: core at the bottom, traces on it (neither imports torch or
simpy), sim and engine above them (never each other), calibrate above both, modal_app.py and
benchmarks/ on top (nothing below imports them; benchmarks import each other without a cycle)."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"core": 0, "traces": 1, "sim": 2, "engine": 2, "calibrate": 3, "modal_app": 4, "benchmarks": 4}
TORCH_FREE = ("core", "traces")
NEVER_AT_THE_BOTTOM = {"torch", "triton", "simpy", "transformers", "safetensors"}


def imports(path: Path) -> set[str]:
    """Top-level names of every module `path` imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def python_files() -> list[Path]:
    """Every Python file of the project outside tests/ (and hidden or virtual-env directories)."""
    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(part.startswith(".") or part in ("tests", "venv", "build") for part in
                             p.relative_to(ROOT).parts[:-1]))


def layer_of(path: Path) -> str:
    """The layer a file belongs to: its top directory, or its module name at the root."""
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else path.stem


def package_files():
    for path in python_files():
        yield layer_of(path), path


def test_every_python_file_has_a_layer():
    assert {layer_of(p) for p in python_files()} <= set(LAYER), "a Python file outside the known layers"


@pytest.mark.parametrize("package, path", list(package_files()), ids=lambda x: str(x))
def test_a_package_imports_only_itself_and_the_layers_below(package, path):
    for name in imports(path):
        if name in LAYER and name != package:
            assert LAYER[name] < LAYER[package], f"{path.relative_to(ROOT)} imports {name}, not below {package}"
        if package in TORCH_FREE:
            assert name not in NEVER_AT_THE_BOTTOM, f"{path.relative_to(ROOT)} imports {name}"


def test_importing_the_bottom_and_the_simulator_loads_neither_torch_nor_each_other():
    code = ("import sys, pkgutil, importlib, core, traces\n"
            "for pkg in (core, traces):\n"
            "    for m in pkgutil.iter_modules(pkg.__path__):\n"
            "        importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
            "bad = [m for m in ('torch', 'simpy', 'sim', 'engine') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "import sim.__main__, sim.build, sim.sweep\n"
            "assert 'torch' not in sys.modules and 'engine' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def benchmark_imports() -> dict[str, set[str]]:
    """Each benchmarks/ module's imports of other benchmarks/ modules (`benchmarks.x` or, run as a
    script from benchmarks/, plain `x`)."""
    files = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {}
    for stem, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] \
                if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                parts = name.split(".")
                target = parts[1] if parts[0] == "benchmarks" and len(parts) > 1 else parts[0]
                if target in files and target != stem:
                    found.add(target)
        graph[stem] = found
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as its nodes in order (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_none_in_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_benchmarks_import_each_other_without_a_cycle():
    cycle = find_cycle(benchmark_imports())
    assert cycle is None, "benchmarks/ import cycle: " + " -> ".join(cycle)
