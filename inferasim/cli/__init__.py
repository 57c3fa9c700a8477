"""The `inferasim` command: the only argparse and plotting of the project (`inferasim.cli.main`)."""

from inferasim.cli.main import main

__all__ = ["main"]
