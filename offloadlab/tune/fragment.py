"""The fragment `tune` leaves for run specs to include (`tuned = "tuned.toml"`), and its DeepSpeed JSON
twin for hand-written configs. Both hold the best point's `AioSettings` as DeepSpeed's `aio` section."""

from __future__ import annotations

import json
import time
from pathlib import Path

import tomli_w

from offloadlab.engines.deepspeed.buffers import SwapBuffers
from offloadlab.engines.deepspeed.config import tuned_keys
from offloadlab.tune.search import TuneResult

FRAGMENT_TOML = "tuned.toml"
FRAGMENT_JSON = "tuned_deepspeed.json"


def fragment(result: TuneResult, plan: SwapBuffers | None) -> dict:
    best = result.best
    out = {
        "measured": {
            "path": str(result.path),
            "workload": result.workload,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "read_gbps": round(best.read_gbps, 3),
            "write_gbps": round(best.write_gbps, 3),
            "deepspeed_default_read_gbps": round(result.default.read_gbps, 3),
            "deepspeed_default_write_gbps": round(result.default.write_gbps, 3),
        },
        "aio": best.point.model_dump(),
    }
    if plan is not None:
        out["swap_buffers"] = plan.as_strategy_fields()
    return out


def write_fragments(result: TuneResult, plan: SwapBuffers | None, out_dir: Path) -> tuple[Path, Path]:
    toml_path, json_path = out_dir / FRAGMENT_TOML, out_dir / FRAGMENT_JSON
    toml_path.write_text(
        "# Written by offloadlab tune. Include it from a run spec's strategy: tuned = \""
        + FRAGMENT_TOML
        + "\"\n"
        + tomli_w.dumps(fragment(result, plan))
    )
    json_path.write_text(json.dumps(tuned_keys(result.best.point, plan), indent=2) + "\n")
    return toml_path, json_path
