"""Argument types shared by the `inferasim` subcommands: errors name the option and the value."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive integer, got {value}")
        return value

    return parse


def positive_float(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--{name} must be a positive number, got {text!r}") from None
        if not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"--{name} must be a positive number, got {text}")
        return value

    return parse
