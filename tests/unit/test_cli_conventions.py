"""CLI conventions (issue 27 item 6): help on every flag, one meaning per flag name, readable
observe tables."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

from inferasim.cli.main import build_parser
from inferasim.cli.observe import observation_table
from inferasim.observed import ObservedWorkload


def _flags(p: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _flags(sp, f"{path} {name}")
        elif not isinstance(a, argparse._HelpAction):
            yield path, a


def test_every_flag_and_argument_has_help_text() -> None:
    # A flag refused on purpose (emulate's --time-scale) is hidden, not undocumented.
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in _flags(build_parser(), "inferasim")
               if not a.help]
    assert not missing, missing


def test_one_flag_name_one_meaning() -> None:
    """--max-num-batched-tokens everywhere (simulate still takes its old --max-batched-tokens);
    --time-scale only where it multiplies times."""
    seen: dict[str, set[str]] = {}
    for path, a in _flags(build_parser(), "inferasim"):
        for opt in a.option_strings:
            seen.setdefault(opt, set()).add(path)
    assert "inferasim simulate" in seen["--max-num-batched-tokens"]
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "emulate", "--model", "meta-llama/Meta-Llama-3-8B",
                        "--gpu", "h100", "--time-scale", "4"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--speedup 4" in r.stderr and "Traceback" not in r.stderr


def test_observe_table_has_units_utc_time_and_percentiles() -> None:
    o = ObservedWorkload(engine="vllm", window="5m", selector={"namespace": "llm"}, observed_at=1764900000.0,
                         request_rate=3.2, prompt_tokens_mean=1834.2, output_tokens_mean=212.0,
                         prompt_tokens={"p50": 1500, "p90": 4000, "p99": 8000}, running=37, waiting=2,
                         kv_cache_usage=0.42, ttft={"p50_ms": 120.5, "p90_ms": 480.2, "p99_ms": 1200.0})
    text = observation_table(o)
    assert "2025-12-05 02:00:00 UTC" in text and "1764900000" not in text
    assert "3.2 req/s" in text and "p90 4,000" in text and "p99 1,200.0 ms" in text
    assert "42.0%" in text and "namespace=llm" in text
