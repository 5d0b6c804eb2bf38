"""python -m tui [RUN_DIR] [--root runs]: what `offloadlab tui` starts."""

from __future__ import annotations

import argparse
from pathlib import Path

from tui.app import OffloadlabApp


def main() -> None:
    parser = argparse.ArgumentParser(prog="offloadlab tui")
    parser.add_argument("run_dir", nargs="?", type=Path, help="A run or tune directory (default: follow the newest under --root)")
    parser.add_argument("--root", type=Path, default=Path("runs"), help="Where run directories live")
    parser.add_argument("--poll", type=float, default=1.0, help="Seconds between reads of the run store")
    args = parser.parse_args()
    OffloadlabApp(root=args.root, run_dir=args.run_dir, poll_s=args.poll).run()


if __name__ == "__main__":
    main()
