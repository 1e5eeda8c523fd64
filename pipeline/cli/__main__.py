"""`python -m pipeline.cli`: the `nightshift` command."""

import sys

from pipeline.cli.main import main

sys.exit(main())
