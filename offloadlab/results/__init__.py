"""The run folder, its SQLite store, and everything computed from them: per-step figures, strategy
summaries, the compare table, the HTML report. Imports no torch (a test asserts it): the read side
(`compare`, `report`, the TUI) starts in a fraction of a second.
May import: spec."""
