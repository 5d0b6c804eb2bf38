"""What this machine allows, checked before any work (folders, O_DIRECT, free disk, page-locked memory,
aio events), and `offloadlab doctor`, which reports all of it.
May import: engines, spec, telemetry."""
