"""The `inferasim` command.

Every user error (unknown model, GPU, engine, bad layout, unreadable file) ends with a one-line
message that names the field and what is accepted, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

EXIT_USAGE = 2

# Every command: the module that defines it (`add_cli`) and its one-line help, in the order
# `inferasim --help` lists them. Only the module of the command being run is imported, so that
# `inferasim --help` starts without numpy, pydantic, httpx or the emulator, and `inferasim tune`
# without the emulator or the harvester (tests/unit/test_cli_startup.py holds this table to the
# modules' own help).
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("catalog", "list known models, or `models show NAME`"),
    "gpus": ("catalog", "GPU catalog"),
    "memory": ("memory", "weights, workspace and KV capacity per GPU for a layout"),
    "render": ("render", "the Kubernetes manifests of one configuration (Deployment, Service, "
                         "PodDisruptionBudget; with --pd the P/D router and both pools)"),
    "predict": ("predict", "TTFT, TPOT and throughput of one deployment"),
    "validate": ("validate", "score the predictor on measured runs (DESIGN.md section 7)"),
    "anchors": ("anchors", "list, show, check shipped anchors; build anchors from a CSV; fit one from live traffic "
                           "(fit-live); prediction error of a live deployment (drift)"),
    "tune": ("tune", "search deployments for a spec (the ServingTuning spec fields)"),
    "advise": ("advise", "batching advisor: batch limit for a latency target, KV to give back"),
    "mix": ("mix", "mix planner: models x latency tiers under one GPU budget"),
    "observe": ("observe", "the live workload of a deployment, read from Prometheus"),
    "emulate": ("emulate", "serve an OpenAI-compatible API whose timing follows the step-time model"),
    "harvest": ("harvest", "measure an engine's OpenAI endpoint and write an anchor"),
    "simulate": ("simulate", "replay a trace or a workload against a deployment, request by request"),
    "demo": ("demo", "run the main job on the bundled example"),
}


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


class _VersionAction(argparse.Action):
    """`--version`, worked out when asked for (the step-time model's revision imports numpy)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser._print_message(f"{parser.prog} {_version()}\n", sys.stdout)
        parser.exit()


def _command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` runs: its first word that is not an option (the top level takes no
    option with a value)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the command it runs gets its options (and its module
    imported), the others are listed by name and help."""
    parser = argparse.ArgumentParser(
        prog="inferasim",
        description="Predict LLM serving performance from anchors, simulate traffic, search deployments.")
    parser.add_argument("--version", action=_VersionAction, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if argv is None else COMMANDS.get(_command_in(argv) or "", ("", ""))[0]
    added: set[str] = set()
    for name, (module, text) in COMMANDS.items():
        if wanted is None or module == wanted:
            if module not in added:
                added.add(module)
                importlib.import_module(f"inferasim.cli.{module}").add_cli(sub)
        else:
            sub.add_parser(name, help=text)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors that are the user's (a one-line message, exit 2): imported when one is raised."""
    from inferasim.catalog.engines import UnknownEngineError
    from inferasim.catalog.gpus import UnknownGPUError
    from inferasim.catalog.models import ModelConfigError, UnknownModelError
    from inferasim.cli.usage import UsageError
    from inferasim.core.layout import LayoutError
    from inferasim.core.spec import SpecError
    from inferasim.model.anchor_store import NoCompatibleAnchor
    from inferasim.model.anchors import AnchorFileError

    return (UsageError, UnknownModelError, ModelConfigError, UnknownGPUError, UnknownEngineError, LayoutError,
            FileNotFoundError, AnchorFileError, NoCompatibleAnchor, SpecError)


def _library_errors() -> tuple[type[Exception], ...]:
    from inferasim.errors import CannotPredict

    return ValueError, CannotPredict


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    # The except clauses' classes are looked up only when an exception is raised.
    except _user_errors() as exc:
        print(f"inferasim {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _library_errors() as exc:
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
