"""`python -m inferasim.harvest run --endpoint URL ...` = `inferasim harvest run ...`."""

import sys

from inferasim.harvest.cli import main

sys.exit(main())
