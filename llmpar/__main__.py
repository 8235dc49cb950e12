"""`python -m llmpar`: the `llmpar` command."""

import sys

from llmpar.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
