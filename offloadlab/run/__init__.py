"""The parent process of `offloadlab run`: preflight of the spec, a job per strategy, its
result, and cleanup of what the run made. Starts ranks (train/) but never trains itself.
May import: checks, engines, plan, results, spec, train, workload."""
