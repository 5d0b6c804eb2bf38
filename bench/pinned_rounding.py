"""What pinning a buffer costs in resident host RAM, with torch's default pinned allocator and with the
setting `offloadlab run` gives its workers (exact sizes above 64 MiB). Needs a CUDA GPU.

    python bench/pinned_rounding.py [--bytes N ...]

Default sizes: the 1.42B GPT's ZeRO-3 NVMe run (48 parameter buffers of 103,022,592 bf16 elements, one
tensor; a 1.01e9-element fp32 optimizer sub-group buffer; the 16-bit gradient partition).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from offloadlab.checks.host import PINNED_EXACT_ABOVE

CHILD = """
import json, sys, psutil, torch
before = psutil.Process().memory_info().rss
tensors = [torch.empty(int(n), dtype=torch.uint8).pin_memory() for n in json.loads(sys.argv[1])]
print(json.dumps(psutil.Process().memory_info().rss - before))
"""


def resident_after_pinning(sizes: list[int], alloc_conf: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    if alloc_conf:
        env["PYTORCH_ALLOC_CONF"] = alloc_conf
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(sizes)], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--bytes", type=int, nargs="+", default=[48 * 103_022_592 * 2, 1_011_566_592 * 4, 1_416_744_960 * 2]
    )
    args = parser.parse_args()
    asked = sum(args.bytes)
    for label, conf in (("torch default", None), (PINNED_EXACT_ABOVE, PINNED_EXACT_ABOVE)):
        resident = resident_after_pinning(args.bytes, conf)
        print(
            f"{label:<40} asked {asked / 2**30:6.2f} GiB, "
            f"resident +{resident / 2**30:6.2f} GiB ({resident / asked:.2f}x)"
        )


if __name__ == "__main__":
    main()
