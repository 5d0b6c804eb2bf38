"""The `offloadlab` command line: one verb per job, each a thin layer over the library."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from offloadlab.results.status import Status
from offloadlab.spec import SpecError, load_spec

# Piped output (logs, CI) gets a wide console instead of rich's 80 columns, so messages stay on one line.
console = Console() if sys.stdout.isatty() else Console(width=180)


def _table_width() -> int:
    """The width compare's and plan's tables lay themselves out for: the terminal's, or piped, the COLUMNS
    the caller set up to the console's 180 (a wider layout printed into it lost its last columns)."""
    if sys.stdout.isatty():
        return console.width
    return min(int(os.environ.get("COLUMNS", console.width)), console.width)


# Errors go to stderr: stdout carries what a command answers (its tables, --json), never a failure.
error_console = Console(stderr=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    """End the command with one line on stderr: exit 2 for input it cannot use, 1 for work that failed."""
    # One line, however long: a hard wrap put a newline at a place that moved with the path's length
    # (and the console's width), inside the very fix the message names; a message of several lines (an
    # OSError's, a library's) is joined.
    error_console.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}", soft_wrap=True)
    sys.exit(code)


@contextlib.contextmanager
def _refusing_bad_input() -> Iterator[None]:
    """Input the command cannot use (a SpecError: the spec, a flag, a path) ends it with one line, exit 2."""
    try:
        yield
    except SpecError as err:
        _fail(str(err))


@contextlib.contextmanager
def _reading_store(run_dir: Path):
    """Anything that is not a readable run store (missing, empty, corrupt, another program's, a tune's)
    ends the command with one line, not a traceback."""
    import sqlite3

    from offloadlab.results.store import StoreError

    try:
        yield
    except (StoreError, LookupError) as err:
        _fail(str(err))
    except sqlite3.DatabaseError as err:
        _fail(f"{run_dir}: the run store cannot be read ({err}): corrupt or truncated")


def _read_summaries(run_dir: Path):
    return _read_run(run_dir)[0]


def _read_run(run_dir: Path):
    """(summaries, state): state says a run that has not finished, and when it last recorded anything."""
    from offloadlab.results.store import RunStore
    from offloadlab.results.summary import summarize
    from offloadlab.results.tables import ago

    with _reading_store(run_dir):
        store = RunStore(run_dir)
        try:
            status = store.run_status()
            state = (
                None if status is Status.DONE else f"{status}, last update {ago(time.time() - store.last_written())}"
            )
            return summarize(store), state
        finally:
            store.close()


def _stdout_for_json_only() -> None:
    """With --json, stdout carries the JSON alone: DeepSpeed's logger (a stdout handler) and our progress go
    to stderr."""
    import logging

    from offloadlab.engines.ops import choose_deepspeed_accelerator

    choose_deepspeed_accelerator()
    from deepspeed.utils import logger

    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stderr)
    console.file = sys.stderr


def _signal_as_interrupt(signum, frame) -> None:
    # A SIGTERM (a scheduler's kill, `timeout`) or a SIGHUP (the terminal closed) cleans up as Ctrl-C does.
    raise KeyboardInterrupt


# The commands that build or load DeepSpeed's ops.
USES_OPS = {"run", "tune", "plan", "doctor"}


@click.group()
@click.pass_context
def main(ctx: click.Context) -> None:
    """Fit, tune and compare DeepSpeed ZeRO-Infinity and FSDP2 offload on the same model."""
    from offloadlab.checks.host import check_torch_extensions_dir

    signal.signal(signal.SIGTERM, _signal_as_interrupt)
    signal.signal(signal.SIGHUP, _signal_as_interrupt)
    # A shell starts a background job (`offloadlab run ... &`) with SIGINT ignored, and Python then sets no
    # Ctrl-C handler: `kill -INT PID` would be lost instead of stopping the run and cleaning up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if ctx.invoked_subcommand in USES_OPS:
        with _refusing_bad_input():
            check_torch_extensions_dir()  # the user's own: checked before offloadlab sets one (ops.py)


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Run directory (default: runs/<name>-<time>).")
@click.option("--keep-checkpoints", is_flag=True, help="Keep each strategy's checkpoint after it is verified.")
@click.option("--nnodes", default=1, show_default=True, help="Hosts taking part (torchrun rendezvous).")
@click.option("--node-rank", default=0, show_default=True)
@click.option("--master-addr", help="Address of node 0, for several hosts.")
@click.option("--master-port", default=29500, show_default=True)
@click.option(
    "--rdzv-timeout",
    default=300,
    show_default=True,
    help="With several hosts: seconds each waits for the others to join before the run stops.",
)
@click.option("--force", is_flag=True, help="Run even when the plan says no strategy fits this machine.")
@click.option(
    "--gpu-mem",
    type=click.FloatRange(min=0, min_open=True),
    help="Hold every rank to a GPU of this many GiB (the spec's gpu_memory_limit_gib).",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(path_type=Path),
    help="`offloadlab plan SPEC --json` output: show the measured step, memory and PCIe against it.",
)
def run(
    spec_path: Path,
    out: Path | None,
    keep_checkpoints: bool,
    nnodes: int,
    node_rank: int,
    master_addr: str | None,
    master_port: int,
    rdzv_timeout: int,
    force: bool,
    gpu_mem: float | None,
    plan_path: Path | None,
) -> None:
    """Train every strategy of SPEC_PATH side by side, verify checkpoints, and print the comparison."""
    import sqlite3

    from offloadlab.results.tables import compare_table
    from offloadlab.run.runner import Launch, RendezvousError, run_spec

    try:
        launch = Launch(nnodes, node_rank, master_addr, master_port, rdzv_timeout)
        spec = load_spec(spec_path)
        if gpu_mem is not None:
            spec = spec.model_copy(update={"gpu_memory_limit_gib": gpu_mem})
        run_dir = run_spec(spec, out, launch, console, keep_checkpoints, force, plan_path)
    except SpecError as err:
        _fail(str(err))
    except KeyboardInterrupt:
        sys.exit(130)  # the runner said what it stopped and removed
    except RendezvousError as err:  # the runner cleaned up and marked the run interrupted
        _fail(str(err), code=1)
    except sqlite3.OperationalError as err:  # the run store's disk filled: the runner cleaned up first
        _fail(
            f"the run stopped: its store could not be written ({err}); "
            "free space on the run folder's drive (or pass --out on another) and run again",
            code=1,
        )
    summaries = _read_summaries(run_dir)
    console.print(compare_table(run_dir, summaries, _table_width()))
    console.print(Text(f"run store: {run_dir}"))
    # "does not fit" is an answer about the model; a failure or an unverified restore is something to fix.
    broken = [s.name for s in summaries if s.status is Status.FAILED or s.checkpoint_verified is False]
    if broken:
        _fail(f"{', '.join(broken)} failed (reasons above; logs in {run_dir / 'logs'})", code=1)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def compare(run_dir: Path, as_json: bool) -> None:
    """Print a finished or running run's strategies side by side (given a folder of runs, list them)."""
    from offloadlab.results.store import DB_NAME
    from offloadlab.results.tables import compare_table, list_runs, runs_table

    runs = [] if (run_dir / DB_NAME).exists() else list_runs(run_dir)
    if runs:
        if as_json:
            click.echo(json.dumps([{**dataclasses.asdict(r), "path": str(r.path)} for r in runs], indent=2))
        else:
            console.print(runs_table(run_dir, runs), width=_table_width())
        return
    summaries, state = _read_run(run_dir)
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        console.print(compare_table(run_dir, summaries, _table_width(), state))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="The HTML file (default RUN_DIR/report.html).")
@click.option("--png", "png_dir", type=click.Path(path_type=Path), help="Also each chart as a PNG in this folder.")
def report(run_dir: Path, out: Path | None, png_dir: Path | None) -> None:
    """Write a self-contained HTML report with plots of every strategy side by side."""
    from offloadlab.checks.host import check_file_to_write, check_folder_to_write
    from offloadlab.results.report import write_report
    from offloadlab.results.store import RunStore

    out = out or run_dir / "report.html"
    with _reading_store(run_dir), contextlib.closing(RunStore(run_dir)) as store:
        store.run()  # a folder that holds no readable run is refused before anything is made
    with _refusing_bad_input():
        check_file_to_write(out, "report")  # before the plots are drawn
        if png_dir is not None:
            check_folder_to_write(png_dir, "--png")
            try:
                png_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise SpecError(
                    f"--png {png_dir}: cannot be made ({err.strerror}); pass a folder you can write"
                ) from err
    with _reading_store(run_dir):
        written = write_report(run_dir, out, png_dir)
    console.print(Text(f"report: {out}"))
    if png_dir is not None:
        console.print(Text(f"charts: {len(written) - 1} PNG files in {png_dir}"))


@main.command()
@click.option(
    "--nvme", "nvme_path", required=True, type=click.Path(path_type=Path), help="A folder on the drive to tune."
)
@click.option("--quick", is_flag=True, help="A sweep under a minute (smaller files, fewer repeats).")
@click.option(
    "--workload",
    type=click.Choice(["param", "optimizer", "both"]),
    default="both",
    show_default=True,
    help="What will be offloaded: sets the read/write weight of the objective.",
)
@click.option(
    "--spec", "spec_path", type=click.Path(path_type=Path), help="Also size the swap buffers for this spec's model."
)
@click.option("--verify", is_flag=True, help="With --spec: run its NVMe strategies for 2 real steps with the result.")
@click.option(
    "--out", type=click.Path(path_type=Path), help="Where to write the fragment and store (default runs/tune-<time>)."
)
@click.option("--force", is_flag=True, help="Overwrite fragments (tuned.toml, tuned_deepspeed.json) --out holds.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(
    nvme_path: Path,
    quick: bool,
    workload: str,
    spec_path: Path | None,
    verify: bool,
    out: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Measure DeepSpeed aio settings on NVME and write the fastest as a config fragment."""
    from offloadlab.engines.ops import announce_on
    from offloadlab.tune.session import TuneInterrupted, TuneRequest, tune_drive

    if as_json:
        _stdout_for_json_only()
    if verify and spec_path is None:
        _fail("--verify needs --spec SPEC: the spec whose NVMe strategies are run with the tuned settings")
    out = out or Path("runs") / f"tune-{time.strftime('%Y%m%d-%H%M%S')}"
    request = TuneRequest(nvme_path, workload, quick, out, force, spec_path)
    try:
        with _refusing_bad_input(), _progress_bar("sweeping") as show:
            outcome = tune_drive(
                request,
                lambda stage, point, done, expected: show(f"{stage:<9} {point.point.label()}", done, expected),
                announce_on(console),
            )
    except TuneInterrupted as err:
        left = " (the folder it made stays: it holds files the tune did not write)" if err.folder_kept else ""
        console.print(
            f"[yellow]interrupted: the tuning files and what the tune wrote to its output folder were removed{left}[/]"
        )
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(outcome.as_json(), indent=2))
    else:
        _print_tune(outcome)
    if verify:
        _print_verify(outcome, spec_path, nvme_path)


@main.command()
@click.argument("spec_path", type=click.Path(path_type=Path))
@click.option("--budget", default="20m", show_default=True, help="Time for the whole search: 20m, 90s, 1h30m.")
@click.option("--steps", default=6, show_default=True, help="Steps each configuration is measured in the screen.")
@click.option("--only", help="Comma-separated placements to try (as 'offloadlab plan SPEC' names them).")
@click.option(
    "--out", type=click.Path(path_type=Path), help="The tune's folder (default runs/autotune-<name>-<time>)."
)
def autotune(spec_path: Path, budget: str, steps: int, only: str | None, out: Path | None) -> None:
    """Find the fastest configuration of SPEC's model and batch on this machine by training each for a few
    steps: the fastest exact AdamW, and the fastest overall."""
    from offloadlab.autotune.output import ranked_table, trial_line
    from offloadlab.autotune.session import BUDGET_GONE, AutotuneRequest, autotune_spec

    with _refusing_bad_input():
        name = load_spec(spec_path).name
    out = out or Path("runs") / f"autotune-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    names = frozenset(n.strip() for n in (only or "").split(",") if n.strip())
    request = AutotuneRequest(spec_path, budget, steps, out, names)
    try:
        with _refusing_bad_input():
            outcome = autotune_spec(request, console, lambda r, trial: console.print(Text(trial_line(r, trial))))
    except KeyboardInterrupt:
        console.print(Text(f"interrupted: the running trial was stopped and cleaned up; finished ones stay in {out}"))
        sys.exit(130)
    search = outcome.search
    if not (search.screened or search.confirmed):
        _fail(BUDGET_GONE)
    console.print(ranked_table(search))
    if search.not_tried:
        console.print(Text(f"not tried within the budget: {', '.join(c.name for c in search.not_tried)}"))
    confirmed = {t.candidate.name for t in search.confirmed}
    for what, files in outcome.written.items():
        console.print(Text(f"{what}: {', '.join(str(f) for f in files)}"))
        pick = search.best(exact_only=what == "best-exact")
        if pick is not None and pick.candidate.name not in confirmed:
            console.print(
                Text(f"  measured in its {steps}-step screen only: the budget left no room to run it longer")
            )
    if not outcome.written:
        _fail(f"no configuration finished its steps: see the trials' logs under {out}", code=1)


@contextlib.contextmanager
def _progress_bar(description: str):
    """A progress bar on the terminal (transient when piped); yields show(description, done, expected)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=not sys.stdout.isatty()) as progress:
        task = progress.add_task(description, total=None)
        yield lambda text, done, expected: progress.update(task, description=text, completed=done, total=expected)


def _print_tune(outcome) -> None:
    from offloadlab.tune.sweep_tables import points_table, summary_table, swap_buffers_table

    console.print(points_table(outcome.result))
    console.print(summary_table(outcome.result))
    if outcome.buffers:
        console.print(
            swap_buffers_table(outcome.spec, outcome.nvme_strategy, outcome.buffers, outcome.result.best.point)
        )
    fragments = f"fragment: {outcome.fragment_toml} (DeepSpeed JSON: {outcome.fragment_json})"
    console.print(Text(f"{fragments}; run store: {outcome.out_dir}"))


def _print_verify(outcome, spec_path: Path, nvme_path: Path) -> None:
    from offloadlab.results.tables import compare_table, human_bytes
    from offloadlab.tune.verify import verify_tuned

    run_dir, summaries = verify_tuned(spec_path, outcome.fragment_toml, nvme_path, outcome.out_dir, console)
    console.print(compare_table(run_dir, summaries, _table_width()))
    planned = outcome.pinned_swap_bytes
    for s in summaries:
        if s.pinned_swap_bytes is not None and planned is not None:
            console.print(
                f"{s.name}: DeepSpeed pinned {human_bytes(s.pinned_swap_bytes)} for its NVMe swap buffers; "
                f"the tune planned {human_bytes(planned)}"
            )
    if any(s.status is not Status.DONE for s in summaries):
        _fail("the tuned settings did not train: see the table above", code=1)


@main.command()
@click.argument("spec_path", required=False, type=click.Path(path_type=Path))
@click.option("--model", "preset", help="A GPT preset (without SPEC), e.g. gpt-1.4b.")
@click.option("--seq-len", default=1024, show_default=True)
@click.option("--micro-batch", default=4, show_default=True)
@click.option("--grad-accum", default=1, show_default=True)
@click.option("--precision", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True)
@click.option("--gpus", type=int, help="GPUs (ranks) on this host; default: detected (or the spec's nproc).")
@click.option(
    "--gpu-mem",
    type=float,
    help="GiB per GPU; default: the spec's gpu_memory_limit_gib, else detected. 0 means no GPU. "
    "--write holds the written spec to it.",
)
@click.option("--host-mem", type=float, help="GiB of RAM to plan with; default: available now.")
@click.option(
    "--nvme", "nvme_path", type=click.Path(path_type=Path), help="NVMe folder; default: the spec's nvme_path."
)
@click.option(
    "--tflops",
    type=float,
    help="Model TFLOP/s a step's forward and backward reach on the GPU planned for; default: one block measured now.",
)
@click.option("--pcie", type=float, help="Pinned host<->GPU GB/s of the machine planned for; default: measured now.")
@click.option(
    "--tuned",
    "tuned_dir",
    type=click.Path(path_type=Path),
    help="An `offloadlab tune` output folder to take NVMe speeds (and aio settings) from.",
)
@click.option(
    "--write",
    "write_dir",
    type=click.Path(path_type=Path),
    help="Write the winner (or --strategy) as a run spec, DeepSpeed JSON and Accelerate config here.",
)
@click.option("--strategy", "chosen", help="With --write: the placement to write instead of the winner.")
@click.option("--force", is_flag=True, help="With --write: overwrite files of the names it writes.")
@click.option("--largest", is_flag=True, help="Find the largest GPT some placement fits on this machine, and plan it.")
@click.option("--json", "as_json", is_flag=True)
def plan(
    spec_path,
    preset,
    seq_len,
    micro_batch,
    grad_accum,
    precision,
    gpus,
    gpu_mem,
    host_mem,
    nvme_path,
    tflops,
    pcie,
    tuned_dir,
    write_dir,
    chosen,
    force,
    largest,
    as_json,
) -> None:
    """Predict memory and the step time of every placement on this machine, rank what fits."""
    from offloadlab.checks.host import check_folder_to_write
    from offloadlab.plan.inputs import PlanRequest
    from offloadlab.plan.outcome import placement_to_write, plan_request
    from offloadlab.plan.output import breakdown_table, write_plan

    if as_json:
        _stdout_for_json_only()
    if largest and (spec_path or preset):
        _fail("--largest searches the model size itself: give neither SPEC nor --model")
    if chosen and not write_dir:
        _fail(f"--strategy picks the placement --write writes: add --write DIR to write {chosen}")
    request = PlanRequest(
        spec_path=spec_path,
        preset="tiny" if largest else preset,
        seq_len=seq_len,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        precision=precision,
        gpus=gpus,
        gpu_mem_gib=gpu_mem,
        host_mem_gib=host_mem,
        nvme_path=nvme_path,
        tuned_dir=tuned_dir,
        tflops=tflops,
        pcie_gbps=pcie,
    )
    with _refusing_bad_input():
        if write_dir:
            check_folder_to_write(write_dir, "--write")  # before the measurements, not after
        outcome = plan_request(request, console, largest)
    if as_json:
        click.echo(json.dumps(_plan_json(outcome), indent=2))
    else:
        _print_plan(outcome)
    if write_dir:  # after the tables: "nothing fits" is explained above it
        with _refusing_bad_input():
            pick = placement_to_write(outcome.predictions, chosen)
            if not as_json:
                console.print(breakdown_table(pick))
            inputs = outcome.inputs
            written = write_plan(pick, inputs.spec, write_dir, inputs.tuned_fragment, inputs.buffers, force)
        for path in written:
            console.print(f"wrote {path}")


def _plan_json(outcome) -> dict:
    from offloadlab.plan.output import bindings_json, plan_json

    result = plan_json(outcome.inputs, outcome.predictions)
    if outcome.past_largest:
        past_shape, past = outcome.past_largest
        result["one_more_layer"] = {"shape": dataclasses.asdict(past_shape), **bindings_json(past)}
    return result


def _print_plan(outcome) -> None:
    from offloadlab.plan.output import machine_table, not_planned_text, past_the_largest, plan_table
    from offloadlab.plan.predict import why_winner

    inputs, predictions, width = outcome.inputs, outcome.predictions, _table_width()
    console.print(machine_table(inputs.machine, inputs.links), width=width)
    console.print(plan_table(predictions, f"offloadlab plan: {inputs.title}", inputs.machine), width=width)
    console.print(why_winner(predictions), width=width)
    skipped = not_planned_text(inputs)
    if skipped:
        console.print(skipped, width=width, highlight=False, markup=False)
    if outcome.past_largest:
        console.print(past_the_largest(*outcome.past_largest, predictions), width=width)


@main.command()
@click.option("--nvme", "nvme_path", type=click.Path(path_type=Path), help="Also check this NVMe folder.")
@click.option("--build", is_flag=True, help="Build DeepSpeed's ops that are not built yet (what make setup runs).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(nvme_path: Path | None, build: bool, as_json: bool) -> None:
    """Versions, DeepSpeed's ops, libaio, locked-memory limits, GPUs, RAM and disk: paste it into bug reports."""
    from offloadlab.checks.doctor import as_json as findings_json
    from offloadlab.checks.doctor import diagnose, findings_table
    from offloadlab.engines.ops import announce_on

    if as_json:
        _stdout_for_json_only()
    findings = diagnose(nvme_path, build, announce_on(console))
    if as_json:
        click.echo(json.dumps(findings_json(findings), indent=2))
    else:
        console.print(findings_table(findings))
    if build and any(f.check.startswith("op ") and f.ok is False for f in findings):
        sys.exit(1)


@main.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite example specs of the same names FOLDER holds.")
def init(folder: Path, force: bool) -> None:
    """Write the example run specs into FOLDER (made if missing), to edit and run."""
    from importlib.resources import files

    from offloadlab.checks.host import check_folder_to_write, check_new_files

    examples = sorted(
        (f for f in files("offloadlab.examples").iterdir() if f.name.endswith(".toml")), key=lambda f: f.name
    )
    with _refusing_bad_input():
        check_folder_to_write(folder, "init folder")
        check_new_files(folder, [f.name for f in examples], force)
    folder.mkdir(parents=True, exist_ok=True)
    for example in examples:
        (folder / example.name).write_text(example.read_text())
    console.print(
        Text(
            f"wrote {len(examples)} example specs to {folder}: {', '.join(f.name for f in examples)} "
            f"(each says what it is for in its first lines)\ntry: offloadlab run {folder / 'tiny_cpu.toml'}"
        )
    )


@main.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--root",
    type=click.Path(path_type=Path),
    help="Where run directories live (default: the folder RUN_DIR is in, else ./runs); without RUN_DIR the "
    "newest is followed.",
)
@click.option(
    "--poll",
    metavar="SECONDS",
    help="Seconds between reads of the run store (default 2, as nvitop and btop refresh; the TUI checks it).",
)
def tui(run_dir: Path | None, root: Path | None, poll: str | None) -> None:
    """Open the live dashboard (runs, tuning, runs browser) in this terminal."""
    from importlib.metadata import entry_points

    # The TUI is a package of its own that reads run stores; offloadlab never imports it, it calls the
    # entry point the TUI installs.
    found = entry_points(group="console_scripts", name="offloadlab-tui")
    if not found:
        _fail("the TUI is not installed (no offloadlab-tui entry point): reinstall offloadlab")
    # The TUI picks the root itself when none is given: beside RUN_DIR, so `r` lists the runs next to it.
    options = [*(["--root", str(root)] if root else []), *(["--poll", poll] if poll is not None else [])]
    next(iter(found)).load()([*options, *([str(run_dir)] if run_dir else [])])


if __name__ == "__main__":
    main()
