"""`tune --verify`: the spec's NVMe strategies trained for two real steps with the tuned fragment
included, so a tune that DeepSpeed cannot use is found before the user's run."""

from __future__ import annotations

import tomllib
from pathlib import Path

from rich.console import Console

from offloadlab.results.store import RunStore
from offloadlab.results.summary import StrategySummary, summarize
from offloadlab.run.runner import Launch, run_spec
from offloadlab.spec import apply_tuned, load_spec, parse_spec


def verify_tuned(
    spec_path: Path, fragment: Path, nvme_path: Path, out_dir: Path, console: Console
) -> tuple[Path, list[StrategySummary]]:
    """Runs into out_dir/verify; returns that run folder and its strategies' summaries."""
    swapping = {s.name for s in load_spec(spec_path).strategy if s.uses_nvme}
    # From the spec's own TOML, not the loaded spec: the fragment is included the way a user's spec would.
    raw = tomllib.loads(spec_path.read_text())
    raw.update(steps=2, verify_checkpoint=False, nvme_path=str(nvme_path.resolve()), name="tune-verify")
    raw["strategy"] = [
        apply_tuned(s | {"tuned": fragment.name}, fragment.parent) for s in raw["strategy"] if s["name"] in swapping
    ]
    run_dir = run_spec(parse_spec(raw, f"{spec_path} (tuned)"), out_dir / "verify", Launch(), console)
    store = RunStore(run_dir)
    try:
        return run_dir, summarize(store)
    finally:
        store.close()
