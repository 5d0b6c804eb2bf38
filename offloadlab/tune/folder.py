"""The folder a tune writes (`--out`): its store and fragments, made only as the tune gets there and
removed again if it fails or is stopped. A folder the user made, or files of theirs in it, stay."""

from __future__ import annotations

import contextlib
from pathlib import Path

from offloadlab.checks.host import check_folder_to_write, check_new_files
from offloadlab.results.rundir import DB_NAME, RunDir, RunDirError
from offloadlab.results.store import RunStore
from offloadlab.tune.fragment import FRAGMENT_JSON, FRAGMENT_TOML


class TuneFolder:
    def __init__(self, out_dir: RunDir):
        self.out_dir = out_dir
        self.made: list[Path] = []
        """What this tune created, in the order it did: removed in reverse on failure."""
        self.store: RunStore | None = None

    def check(self, force: bool) -> None:
        """Before anything is measured: the folder can take a tune, and its files (an earlier tune's
        fragments too: they are the user's now) are overwritten only with force; a store never is."""
        root = self.out_dir.root
        check_folder_to_write(root, "--out")
        if self.out_dir.store_path.exists():
            raise RunDirError(f"--out {root} holds a run store already: pass another folder")
        check_new_files(root, [DB_NAME, FRAGMENT_TOML, FRAGMENT_JSON], force)

    def open(self) -> tuple[RunStore, int]:
        """Make the folder (if new), take its lock for this process's life and start the tune's store;
        points go to the store as they are measured, so `offloadlab tui` shows the sweep live."""
        root = self.out_dir.root
        if not root.exists():
            root.mkdir(parents=True)
            self.made.append(root)
        self.out_dir.lock()  # its descriptor stays open: the folder is this tune's until the process exits
        self.made += [self.out_dir.store_path, *(root / f"{DB_NAME}-{s}" for s in ("wal", "shm"))]
        self.store = RunStore(root, create_schema=True)
        return self.store, self.store.add_run("tune", "")

    def remove(self) -> bool:
        """Remove what this tune made; returns whether the folder it made stays (it holds other files)."""
        if self.store is not None:
            self.store.close()
        for path in reversed(self.made):
            with contextlib.suppress(OSError):  # a folder that holds the user's files stays
                if path == self.out_dir.root:
                    path.rmdir()
                else:
                    path.unlink(missing_ok=True)
        return self.out_dir.root in self.made and self.out_dir.root.exists()
