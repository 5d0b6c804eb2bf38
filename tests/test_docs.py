"""The README is a short path in; docs/ is the reference, built by mkdocs with --strict, so a broken link,
a page left out of the nav or a wrong anchor fails here. The run spec page's tables are generated from
spec.py's docstrings and must be what docs/gen_spec.py writes."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys

from conftest import REPO

DOCS = REPO / "docs"
TEXT = (".md", ".py", ".yml", ".yaml", ".txt", ".html")


def test_the_docs_build_with_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner about MkDocs 2.0
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_readme_stays_under_10_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size < 10_000, f"README.md is {size:,} bytes: move the detail into docs/"


def test_no_page_says_session():
    """The pages say what offloadlab does now; the history of how it got there lives in bench/results/."""
    pages = [REPO / "README.md", REPO / "mkdocs.yml"]
    pages += [p for p in DOCS.rglob("*") if p.is_file() and p.suffix in TEXT]
    found = [
        f"{page.relative_to(REPO)}:{n}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"\bsession\b", line, re.I)
    ]
    assert not found, found


def test_the_spec_page_is_what_gen_spec_writes():
    gen = runpy.run_path(str(DOCS / "gen_spec.py"))
    page = (DOCS / "spec.md").read_text()
    assert gen["render"](page) == page, "docs/spec.md is out of date: run python docs/gen_spec.py"


def test_every_spec_key_has_a_docstring():
    gen = runpy.run_path(str(DOCS / "gen_spec.py"))
    models = [model for _, _, model in gen["SECTIONS"]]
    bare = [f"{m.__name__}.{name}" for m in models for name in m.model_fields if name not in gen["field_docs"](m)]
    assert not bare, f"document these in offloadlab/spec.py (a docstring under the field): {bare}"


def test_the_readmes_links_lead_to_files():
    """GitHub renders README.md; its relative links (docs pages, screenshots) must name files that exist."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (REPO / "README.md").read_text())
    missing = [link for link in links if "://" not in link and not (REPO / link).exists()]
    assert not missing, missing
