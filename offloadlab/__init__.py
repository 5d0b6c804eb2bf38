"""offloadlab: fit, compare and tune offloaded training (DeepSpeed ZeRO-Infinity and FSDP2) on one machine.

Data flows spec -> plan -> engine -> trainer -> telemetry -> results, and the sub-packages are those steps:

    spec.py     the typed run spec (TOML), read once at the top; every other package takes its types
    cli.py      the `offloadlab` commands: read the spec, call one pipeline, print its tables
    workload/   the model and its token data (torch)
    engines/    DeepSpeed and FSDP2 behind one `Engine` interface, and DeepSpeed's compiled ops
    run/        the parent of a run: preflight, one job per strategy (torchrun for several ranks), cleanup
    train/      one rank: the worker entry point, the step loop, checkpoints, the collectives meter
    telemetry/  the NVML/psutil/diskstats sampler (its own process) and the ranks' torch probes
    results/    the run folder, its SQLite store and everything read from it: summaries, tables, report
                (imports no torch, so `compare`, `report` and the TUI start fast)
    measure/    probes shared by tune and plan: the aio handle bench, PCIe, Adam and compute rates
    tune/       `offloadlab tune`: the aio search and the fragment run specs include
    plan/       `offloadlab plan`: memory and step-time predictions for every placement
    checks/     what the machine allows (folders, O_DIRECT, pinned memory, aio events) and `doctor`
    examples/   the example specs `offloadlab init` writes (the repo's configs/, shipped in the wheel)
"""
