"""`python -m inferasim ...`: the same command as the `inferasim` console script."""

import sys

from inferasim.cli import main

sys.exit(main())
