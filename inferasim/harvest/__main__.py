"""`python -m inferasim.harvest run --endpoint URL ...` = `inferasim harvest run ...`."""

import sys

from inferasim.cli.harvest import main

sys.exit(main())
