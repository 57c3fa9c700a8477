"""`python -m inferasim.cli ...`: the same command as the `inferasim` console script."""

import sys

from inferasim.cli.main import main

sys.exit(main())
