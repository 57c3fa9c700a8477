"""`inferasim emulate`: register with `add_cli(subparsers)`; `python -m inferasim.emulator` runs it alone."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferasim.cli.args import positive_float, positive_int
from inferasim.emulator.config import DEFAULT_NATURAL_OUTPUT_MEAN, EmulatorConfig
from inferasim.errors import InferasimError
from inferasim.model.steptime import StepParams


def add_layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp", type=positive_int("tp"), default=1, help="tensor-parallel width")
    p.add_argument("--ep", type=positive_int("ep"), default=1, help="expert-parallel width of MoE layers")
    p.add_argument("--pp", type=positive_int("pp"), default=1, help="pipeline stages")
    p.add_argument("--dp", type=positive_int("dp"), default=1, help="attention data-parallel ranks")


def add_cli(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `emulate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "emulate", help="serve an OpenAI-compatible API whose timing follows the step-time model",
        description="An emulated vLLM or SGLang server: /v1/models, /v1/completions, /v1/chat/completions "
                    "(streamed or not), /health and /metrics with the engine's real metric names. Token timing "
                    "follows the step-time model of the model, GPU, engine and layout; --speedup X runs X times "
                    "faster than real (histograms still record emulated seconds).")
    p.add_argument("--model", required=True, help="Hugging Face id or config.json path (see `inferasim models`)")
    p.add_argument("--gpu", required=True, help="GPU name (see `inferasim gpus`)")
    p.add_argument("--engine", default="vllm", help="vllm or sglang (metric names and scheduler follow it)")
    add_layout_args(p)
    p.add_argument("--port", type=int, default=None,
                   help="TCP port (default: the engine's, 8000 for vLLM, 30000 for SGLang; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--speedup", type=positive_float("speedup"), default=1.0,
                   help="run X times faster than the emulated engine (every sleep is divided by X)")
    # --time-scale was an alias of --speedup here, where it meant the inverse of simulate's
    # --time-scale (which multiplies times): one name, one meaning, so it is refused here.
    p.add_argument("--time-scale", dest="time_scale_given", default=None, help=argparse.SUPPRESS)
    p.add_argument("--anchor", type=Path, help="anchor JSON whose fitted step-time parameters to use")
    p.add_argument("--params-json", help="explicit step-time parameters as JSON, e.g. '{\"t_fixed\": 0.005}' "
                                         "(unset fields keep the defaults); overrides --anchor")
    p.add_argument("--precision", default="auto", help="weight precision (auto = the checkpoint's)")
    p.add_argument("--kv-cache-dtype", default=None, help="KV-cache dtype (default: fp8 for fp8/fp4 weights)")
    p.add_argument("--engine-version", default="", help="engine version the emulated server claims")
    p.add_argument("--served-model-name", default=None, help="model name clients must send (default: --model)")
    p.add_argument("--max-num-seqs", type=positive_int("max-num-seqs"), default=None,
                   help="running requests (default: the engine's)")
    p.add_argument("--max-num-batched-tokens", type=positive_int("max-num-batched-tokens"), default=None,
                   help="tokens per engine step (default: the engine's)")
    p.add_argument("--max-model-len", type=positive_int("max-model-len"), default=None,
                   help="longest prompt + output accepted (default: the model's context)")
    p.add_argument("--natural-output-mean", type=positive_int("natural-output-mean"),
                   default=DEFAULT_NATURAL_OUTPUT_MEAN,
                   help="mean output length of requests without ignore_eos (geometric, seeded)")
    p.add_argument("--stream-interval-ms", type=float, default=None,
                   help="real ms between writes of a stream's intermediate tokens (first and last tokens "
                        "are written at once); default: 20 + 1 per open request; 0 = every engine step")
    p.add_argument("--seed", type=int, default=0, help="seed of output lengths and token text")
    p.add_argument("--stall-at-batch", type=positive_int("stall-at-batch"), default=None,
                   help="fault injection: the first step whose batch holds this many sequences stalls "
                        "--stall-s emulated seconds, once (a kernel compiled at a new shape's first use)")
    p.add_argument("--stall-s", type=positive_float("stall-s"), default=0.0,
                   help="emulated seconds of the --stall-at-batch stall")
    p.set_defaults(func=cmd_emulate)


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    from inferasim.catalog.engines import default_port, normalize_engine

    if getattr(args, "time_scale_given", None) is not None:
        from inferasim.cli.usage import UsageError

        raise UsageError(f"emulate has no --time-scale (in simulate it multiplies arrival times); to run "
                         f"{args.time_scale_given} times faster than the engine, pass --speedup "
                         f"{args.time_scale_given}")
    engine = normalize_engine(args.engine)
    params = None
    if args.params_json:
        try:
            values = json.loads(args.params_json)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--params-json is not valid JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("--params-json must be a JSON object of step-time parameters")
        from inferasim.emulator.api import ApiError, merge_params

        try:
            # The same checks as POST /_inferasim/params: known names, finite numbers, efficiencies
            # within (0, 1], nothing negative.
            params = merge_params(StepParams(), values)
        except ApiError as exc:
            raise ValueError(f"--params-json: {exc.message}") from None
    port = args.port if args.port is not None else default_port(engine)
    interval = None
    if args.stream_interval_ms is not None:
        if not args.stream_interval_ms >= 0:
            raise ValueError(f"--stream-interval-ms must be >= 0, got {args.stream_interval_ms}")
        interval = args.stream_interval_ms / 1e3
    return EmulatorConfig(
        model=args.model, gpu=args.gpu, engine=engine, tp=args.tp, ep=args.ep, pp=args.pp, dp=args.dp,
        host=args.host, port=port, speedup=args.speedup, precision=args.precision, kv_dtype=args.kv_cache_dtype,
        engine_version=args.engine_version, anchor=args.anchor, params=params, seed=args.seed,
        served_model_name=args.served_model_name, max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        natural_output_mean=args.natural_output_mean, stream_interval=interval,
        stall_at_batch=args.stall_at_batch, stall_s=args.stall_s)


def cmd_emulate(args: argparse.Namespace) -> int:
    from inferasim.emulator.server import run_foreground

    config = config_from_args(args)

    def announce(line: str) -> None:
        # On stdout and flushed: scripts and tests wait for this line to learn the port.
        print(line, flush=True)

    return run_foreground(config, announce)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferasim.emulator")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cli(sub)
    args = parser.parse_args(["emulate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except (ValueError, InferasimError) as exc:  # bad input: one line naming the flag, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


__all__ = ["add_cli", "add_layout_args", "cmd_emulate", "config_from_args", "main", "positive_float",
           "positive_int"]
