"""From an autotune's autotune.json: the fastest no-offload trial and the two fastest offloading ones, each
written as a run spec of 31 steps (its trial's own spec, copied by driver.sh autotune64 into trial_specs/)
for a side-by-side run on one host.

    python picks.py AUTOTUNE_JSON TRIAL_SPECS_DIR OUT_DIR"""

import json
import re
import sys
from pathlib import Path

trials_json, trial_specs, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
trials = [t for t in json.loads(trials_json.read_text())["trials"] if t["status"] == "done"]
trials.sort(key=lambda t: t["times"]["tokens_per_s"], reverse=True)
baseline = [t for t in trials if t["placement"] == "fsdp2"][:1]
offloads = [t for t in trials if t["placement"] != "fsdp2"]
picked = (
    baseline
    + [t for i, t in enumerate(offloads) if t["configuration"] not in {o["configuration"] for o in offloads[:i]}][:2]
)
out.mkdir(parents=True, exist_ok=True)
for i, t in enumerate(picked):
    text = (trial_specs / f"{t['run_dir']}.toml").read_text()
    text = re.sub(r"(?m)^steps = \d+", "steps = 31", text)
    (out / f"{i}-{t['configuration']}.toml").write_text(text)
    print(t["configuration"], f"{t['times']['tokens_per_s']:.0f} tokens/s in the autotune")
