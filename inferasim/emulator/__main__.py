"""`python -m inferasim.emulator --model M --gpu G ...` = `inferasim emulate ...`."""

import sys

from inferasim.emulator.cli import main

sys.exit(main())
