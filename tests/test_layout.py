"""The architecture the folders promise, checked on the source: the read side imports no torch, the library
never imports the TUI, strategy types are matched to engines in one place each, lines stay under 120."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

FOLDERS = ("offloadlab", "tui", "tests", "bench", "configs")
SOURCES = sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_read_side_and_the_tui_import_no_torch():
    """compare, report and the TUI start in a fraction of a second because nothing they import pulls torch
    (the report draws with matplotlib, hence numpy; compare and the TUI need neither)."""
    code = (
        "import sys, offloadlab.cli, offloadlab.results.tables, offloadlab_tui.app; "
        "print(sorted(m for m in ('torch', 'deepspeed', 'numpy') if m in sys.modules)); "
        "import offloadlab.results.report; "
        "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["[]", "[]"], proc.stdout


def test_the_library_never_imports_the_tui():
    for path in (REPO / "offloadlab").rglob("*.py"):
        tui = {name for name in _imports(path) if name.split(".")[0] in ("tui", "offloadlab_tui")}
        assert not tui, f"{path.relative_to(REPO)} imports {tui}"


def test_results_import_only_results_and_the_spec():
    """results/ is the bottom of the read side: it may not reach up into the pipelines that write it."""
    for path in (REPO / "offloadlab" / "results").rglob("*.py"):
        ours = {name for name in _imports(path) if name.startswith("offloadlab")}
        assert all(name.startswith("offloadlab.results") or name == "offloadlab.spec" for name in ours), (path, ours)


def test_strategy_types_are_matched_to_engines_only_where_engines_are_modelled():
    """Outside engines/ (the engines) and plan/predict.py (the engines' plan models) nothing asks which type a
    strategy is: it asks the engine or the strategy."""
    allowed = {REPO / "offloadlab" / "engines" / "__init__.py", REPO / "offloadlab" / "plan" / "predict.py"}
    for path in (REPO / "offloadlab").rglob("*.py"):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                assert "Strategy" not in ast.unparse(node.args[1]), f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(node, ast.MatchClass):
                assert "Strategy" not in ast.unparse(node.cls), f"{path.relative_to(REPO)}:{node.lineno}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_lines_stay_under_120_characters(path):
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) >= 120]
    assert not long, f"lines {long}"
