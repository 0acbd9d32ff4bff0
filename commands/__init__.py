"""The `gpuplan` commands, one module per area; `cli.py` assembles them into the app.

Each module parses options, calls a package and renders (rich table or --json) through `commands.output`;
logic stays in the packages (catalog, planner, scheduler, workers).
"""
