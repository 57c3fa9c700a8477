"""`python -m inferasim.emulator --model M --gpu G ...` = `inferasim emulate ...`."""

import sys

from inferasim.cli.emulate import main

sys.exit(main())
