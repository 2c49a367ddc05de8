"""Every kernel launch names its device, so the code runs unchanged on CUDA, where Warp's
default device (cuda:0) may differ from the run's device (cpu, cuda:1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("harness/*.py"), *ROOT.glob("envs/*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_every_wp_launch_passes_a_device(path):
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "launch":
            if isinstance(node.func.value, ast.Name) and node.func.value.id == "wp":
                if not any(k.arg == "device" for k in node.keywords):
                    missing.append(node.lineno)
    assert not missing, f"{path.name}: wp.launch without device= at lines {missing}"
