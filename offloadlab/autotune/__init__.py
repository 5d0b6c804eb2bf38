"""`offloadlab autotune`: the fastest configuration of a spec's model and batch on this machine, measured.

    space.py    the configurations the planner says fit (placement, split of the batch, the inexact options)
    trials.py   one configuration trained for a few real steps as its own run, and its figures
    search.py   the order, the budget, the early stops and the second round
    output.py   the table, the record and the winners' files (run spec, DeepSpeed JSON, Accelerate config)

Each trial is an ordinary run folder under the tune's folder, so `offloadlab tui --root FOLDER` follows
the search live and `compare` reads any trial.
May import: engines, plan, results, run, spec.
"""
