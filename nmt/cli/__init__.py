"""The command line: ``main.py`` (the Typer app, one-line usage errors, exit codes) and
``commands/`` (one module per command: parse, build one value, call one function below)."""
