"""The `llmpar` command: one module per subcommand, each with `add_parser` and `run`."""

from llmpar.cli.main import main

__all__ = ["main"]
