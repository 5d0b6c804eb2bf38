"""Rebuild the docs' screenshots from real runs (`make screenshots`), never by hand.

In a temporary folder it runs configs/plan_accuracy_cpu.toml (a small GPT through five placements, its
ZeRO-3 NVMe strategies swapping to the drive; about three minutes on 2 cores) and unpacks the committed
store of an H200's tune, then writes to docs/screenshots/:
- compare.txt: `offloadlab compare` of the run, 80 columns;
- dashboard.svg and tune.svg: the TUI on the run and on the tune, through Textual's own screenshot export;
- report-step-time.png and report-where-the-step-goes.png: two of the report's charts (`report --png`).
Paths are given relative to the temporary folder, so no machine's path lands in a screenshot.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "screenshots"
TUI_SIZE = (80, 36)
REPORT_CHARTS = ("step-time", "where-the-step-goes")
RUN_SPEC = REPO / "configs" / "plan_accuracy_cpu.toml"
TUNE_STORE = REPO / "bench" / "results" / "2026-12-04-h200-s12" / "zero3-nvme-tuned.tar.gz"
TUNE_RUN = Path("zero3-nvme-tuned") / "work" / "tune"  # inside it


def offloadlab(*args: str, cwd: Path, capture: bool = False) -> str:
    """`offloadlab ARGS` in cwd, its progress on this terminal unless captured."""
    command = [sys.executable, "-m", "offloadlab.cli", *args]
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(command, cwd=cwd, env=env, check=True, text=True, capture_output=capture)
    return done.stdout if capture else ""


async def tui_screenshot(run_dir: Path, filename: str, shown) -> None:
    """The TUI on run_dir, saved once shown(app) holds (its data read and drawn)."""
    from offloadlab_tui.app import make_app

    app = make_app(root=Path("."), run_dir=run_dir, poll_s=0.2)
    async with app.run_test(size=TUI_SIZE) as pilot:
        for _ in range(300):
            if shown(app):
                break
            await pilot.pause(0.1)
        else:
            raise SystemExit(f"the TUI did not show {run_dir} within 30 s")
        await pilot.pause(0.5)  # one more poll, so every panel has its figures
        app.save_screenshot(filename=filename, path=str(OUT))


def has_rows(app) -> bool:
    from textual.widgets import DataTable

    return any(table.row_count for table in app.screen.query(DataTable))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="offloadlab-screenshots-") as tmp:
        work = Path(tmp)
        print(f"running {RUN_SPEC.relative_to(REPO)}")
        offloadlab("run", str(RUN_SPEC), "--out", "run", cwd=work)
        table = offloadlab("compare", "run", cwd=work, capture=True)
        (OUT / "compare.txt").write_text("".join(line.rstrip() + "\n" for line in table.splitlines()))
        offloadlab("report", "run", "--png", "charts", cwd=work)
        for chart in REPORT_CHARTS:
            shutil.copyfile(work / "charts" / f"{chart}.png", OUT / f"report-{chart}.png")
        with tarfile.open(TUNE_STORE) as tar:
            tar.extractall(work, filter="data")
        os.chdir(work)
        asyncio.run(tui_screenshot(Path("run"), "dashboard.svg", lambda app: app.screen.query(".panel-title")))
        asyncio.run(tui_screenshot(TUNE_RUN, "tune.svg", has_rows))
        os.chdir(REPO)
    for name in sorted(p.name for p in OUT.iterdir()):
        print(f"docs/screenshots/{name}")


if __name__ == "__main__":
    main()
