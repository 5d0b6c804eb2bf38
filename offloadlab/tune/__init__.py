"""`offloadlab tune`: search DeepSpeed's aio settings for a drive, size the parameter swap buffers, and
write the fragment run specs include (and its DeepSpeed JSON twin).
May import: checks, engines, measure, plan, results, run, spec."""
