"""This rank's place in the job (torchrun's variables) and the one collective the adapters share."""

from __future__ import annotations

import atexit
import os
import socket
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


def _free_port() -> int:
    """A port no one listens on now (torchrun --standalone picks one alike)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @classmethod
    def from_env(cls) -> "DistContext":
        """Read torchrun's variables; pick this rank's GPU, or the CPU where there is none. A process started
        without them (`offloadlab run` starts one rank alone) sets them for a world of one, with a free port
        for its TCP store: DeepSpeed looks for MPI where RANK is unset."""
        if "RANK" not in os.environ:
            os.environ.update(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()),
            )
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), local_rank, device)

    @property
    def backend(self) -> str:
        # CPU-offloaded FSDP2 gradients are clipped on the CPU, so a GPU run needs gloo beside NCCL.
        return "cuda:nccl,cpu:gloo" if self.device.type == "cuda" else "gloo"


def global_mean(value: float, ctx: DistContext) -> float:
    """The mean over ranks of a per-rank scalar (gloo has no AVG, so sum and divide)."""
    if ctx.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.item() / ctx.world_size


def end_rank(exit_code: int) -> NoReturn:
    """End a rank's process without the interpreter's teardown. A gloo worker thread can still be freeing
    a finished collective whose tensors need the GIL; once teardown has begun, a thread that asks for the
    GIL is ended where it stands, inside a C++ destructor, and the process aborts (std::terminate, SIGABRT:
    about 1 two-rank FSDP2 run in 13 here, after everything was saved, with destroy_process_group called).
    The atexit handlers still run first: multiprocessing joins ZenFlow's and SuperOffload's workers there."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
