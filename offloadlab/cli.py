"""The `offloadlab` command line: one verb per job, each a thin layer over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from offloadlab.spec import SpecError, load_spec

# Piped output (logs, CI) gets a wide console instead of rich's 80 columns, so tables stay readable.
console = Console() if sys.stdout.isatty() else Console(width=150)


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    sys.exit(2)


@click.group()
def main() -> None:
    """Fit, tune and compare DeepSpeed ZeRO-Infinity and FSDP2 offload on the same model."""


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (default: runs/<name>-<time>).")
@click.option("--keep-checkpoints", is_flag=True, help="Keep each strategy's checkpoint after it is verified.")
@click.option("--nnodes", default=1, show_default=True, help="Hosts taking part (torchrun rendezvous).")
@click.option("--node-rank", default=0, show_default=True)
@click.option("--master-addr", help="Address of node 0, for several hosts.")
@click.option("--master-port", default=29500, show_default=True)
def run(spec_path: Path, out: Path | None, keep_checkpoints: bool, nnodes: int, node_rank: int,
        master_addr: str | None, master_port: int) -> None:
    """Train every strategy of SPEC_PATH side by side, verify checkpoints, and print the comparison."""
    from offloadlab.compare import compare_table, summarize
    from offloadlab.runner import Launch, run_spec
    from offloadlab.store import RunStore

    try:
        spec = load_spec(spec_path)
        run_dir = run_spec(spec, out, Launch(nnodes, node_rank, master_addr, master_port), console, keep_checkpoints)
    except SpecError as err:
        _fail(str(err))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopped the running strategy and removed its NVMe and checkpoint folders[/]")
        sys.exit(130)
    store = RunStore(run_dir)
    console.print(compare_table(run_dir, summarize(store)))
    console.print(f"run store: {run_dir}")


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def compare(run_dir: Path, as_json: bool) -> None:
    """Print a finished or running run's strategies side by side."""
    from offloadlab.compare import compare_table, summarize
    from offloadlab.store import RunStore

    try:
        summaries = summarize(RunStore(run_dir))
    except (FileNotFoundError, LookupError) as err:
        _fail(str(err))
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        console.print(compare_table(run_dir, summaries))


if __name__ == "__main__":
    main()
