"""The packages import downward only: core at the bottom, traces on it (neither imports torch or
simpy), sim and engine above them (never each other), calibrate above both."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"core": 0, "traces": 1, "sim": 2, "engine": 2, "calibrate": 3}
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


def package_files():
    for package in LAYER:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


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
