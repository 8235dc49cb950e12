import sys

from llmpar.cli.main import main

sys.exit(main())
