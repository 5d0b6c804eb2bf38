"""`offloadlab plan`: predicted memory per rank and step time for every placement of a model on a
machine, from the same strategy types `run` takes; writes the chosen one as a run spec and DeepSpeed JSON.
May import: checks, engines, measure, results, spec, workload."""
