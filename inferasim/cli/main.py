"""The `inferasim` command.

Every user error (unknown model, GPU, engine, bad layout, unreadable file) ends with a one-line
message that names the field and what is accepted, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from inferasim.catalog.engines import UnknownEngineError
from inferasim.catalog.gpus import UnknownGPUError
from inferasim.catalog.models import ModelConfigError, UnknownModelError
from inferasim.cli import (
    advise,
    anchors,
    catalog,
    demo,
    emulate,
    harvest,
    memory,
    mix,
    observe,
    predict,
    render,
    simulate,
    tune,
    validate,
)
from inferasim.cli.usage import UsageError
from inferasim.core.layout import LayoutError
from inferasim.core.spec import SpecError
from inferasim.errors import CannotPredict
from inferasim.model.anchor_store import NoCompatibleAnchor
from inferasim.model.anchors import AnchorFileError

EXIT_USAGE = 2


# ---- entry point -------------------------------------------------------------------------------

def _version() -> str:
    """The installed distribution's version, and the step-time model revision anchors record."""
    from importlib.metadata import PackageNotFoundError, version

    from inferasim.model.steptime import STEP_MODEL_REVISION

    try:
        release = version("inferasim")
    except PackageNotFoundError:  # run from a checkout without installing
        release = "unknown (not installed)"
    return f"{release} (step-time model {STEP_MODEL_REVISION})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferasim",
        description="Predict LLM serving performance from anchors, simulate traffic, search deployments.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (catalog, memory, render, predict, validate, anchors, tune, advise, mix, observe, emulate,
                    harvest, simulate, demo):
        command.add_cli(sub)
    return parser


USER_ERRORS: tuple[type[Exception], ...] = (
    UsageError, UnknownModelError, ModelConfigError, UnknownGPUError, UnknownEngineError, LayoutError,
    FileNotFoundError, AnchorFileError, NoCompatibleAnchor, SpecError,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, CannotPredict) as exc:
        # Library validation errors (precision, dtype, ranges) name the field in their message;
        # CannotPredict says why an anchor cannot price a deployment (its kernel set unknown here).
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except OSError as exc:
        # A file the command writes (a full disk, a folder where a file goes) or stdout itself.
        where = f" {exc.filename}:" if exc.filename else ""
        print(f"inferasim {args.command}: error:{where} {exc.strerror or exc}", file=sys.stderr)
        return 1



if __name__ == "__main__":
    sys.exit(main())
