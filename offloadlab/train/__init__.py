"""One rank of a strategy (started by `offloadlab run`): build the engine, run the steps, save and verify the
checkpoint, meter the collectives and the NVMe swaps, and write each step to the run store.
May import: engines, results, spec, telemetry, workload."""
