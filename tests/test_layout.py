"""The architecture the folders promise, checked on the source: every import follows the table in
docs/layout.md, the read side imports no torch, the library never imports the TUI, only the registry and the
spec ask which engine a strategy is, each engine's folder implements the declared interfaces, lines stay under
120."""

from __future__ import annotations

import ast
import inspect
import re
import shutil
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


def _layout_table() -> dict[str, set[str]]:
    """docs/layout.md's table: each part of offloadlab/ and the parts it may import."""
    rows = re.findall(r"^\| `(\w+)(?:/|\.py)` \| .* \| ([^|]*) \|$", (REPO / "docs/layout.md").read_text(), re.M)
    return {name: {part.strip() for part in imports.split(",")} - {"-"} for name, imports in rows}


def _part(path: Path) -> str:
    return path.relative_to(REPO / "offloadlab").parts[0].removesuffix(".py")


def test_every_import_is_one_the_layout_table_allows():
    """Lazy imports too (ast.walk sees imports inside functions)."""
    allowed = _layout_table()
    parts = {_part(p) for p in (REPO / "offloadlab").glob("*") if p.name not in ("__init__.py", "__pycache__")}
    assert set(allowed) == parts
    wrong = []
    for path in (REPO / "offloadlab").rglob("*.py"):
        part = _part(path)
        for name in _imports(path):
            target = name.split(".")[1] if name.startswith("offloadlab.") else part
            if target != part and target not in allowed[part]:
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_each_sub_package_says_what_it_may_import():
    for name, allowed in _layout_table().items():
        init = REPO / "offloadlab" / name / "__init__.py"
        if init.exists():
            said = re.search(r"May import: ([^.]*)\.", ast.get_docstring(ast.parse(init.read_text())) or "")
            assert said, f"{init.relative_to(REPO)} does not say what it may import"
            assert {p.strip() for p in said.group(1).split(",")} == allowed, name


def test_only_the_registry_and_the_spec_ask_which_engine_a_strategy_is():
    """No `.engine ==` or `["engine"] ==` comparisons, no isinstance or match on a strategy type, anywhere in
    the library but the registry (engines/__init__.py) and the spec."""
    allowed = {REPO / "offloadlab" / "engines" / "__init__.py", REPO / "offloadlab" / "spec.py"}
    found = []
    for path in (REPO / "offloadlab").rglob("*.py"):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
                if "Strategy" in ast.unparse(node.args[1]):
                    found.append(where)
            if isinstance(node, ast.MatchClass) and "Strategy" in ast.unparse(node.cls):
                found.append(where)
            if isinstance(node, ast.Compare) and re.search(r"\bengine\W*$", ast.unparse(node.left)):
                found.append(f"{where}: {ast.unparse(node)}")
    assert not found, found


def test_every_engine_implements_the_declared_interfaces():
    from offloadlab.engines import ENGINES
    from offloadlab.engines.base import Engine
    from offloadlab.engines.protocols import EngineExporter, EnginePlacements, EnginePlanner

    for record in ENGINES:
        if record.installed:  # an engine's adapter imports its package (torchao is an extra)
            assert issubclass(record.adapter(), Engine), record.name
        for module, protocol in (
            (record.planner, EnginePlanner),
            (record.placements, EnginePlacements),
            (record.exporter, EngineExporter),
        ):
            for name, declared in inspect.getmembers(protocol, inspect.isfunction):
                if name.startswith("_"):
                    continue
                implemented = getattr(module, name, None)
                assert implemented is not None, f"{module.__name__} lacks {name}"
                expected = [p for p in inspect.signature(declared).parameters if p != "self"]
                assert list(inspect.signature(implemented).parameters) == expected, f"{module.__name__}.{name}"


def test_the_wheel_holds_every_sub_package(tmp_path):
    """pyproject finds the packages: a new folder is in the wheel without a hand-kept list."""
    import zipfile

    source = tmp_path / "source"  # a copy: the build leaves build/ and egg-info beside the sources
    skipped = shutil.ignore_patterns(".*", "runs", "tests", "bench", "docs", "build", "*.egg-info", "__pycache__")
    shutil.copytree(REPO, source, ignore=skipped)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    subprocess.run([*build, str(source)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("offloadlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "offloadlab").rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, missing
    assert {"offloadlab_tui/app.py", "offloadlab_tui/offloadlab.tcss", "offloadlab/examples/tiny_cpu.toml"} <= names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_lines_stay_under_120_characters(path):
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) >= 120]
    assert not long, f"lines {long}"
