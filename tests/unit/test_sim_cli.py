"""`inferasim simulate` (registered by `inferasim.cli.simulate.add_cli`) and the replay speed."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from inferasim.cli.simulate import add_cli, load_workload

MODEL = ["--model", "meta-llama/Meta-Llama-3.1-8B", "--gpu", "H100", "--engine", "vllm", "--tp", "1"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:  # noqa: ANN001
    parser = argparse.ArgumentParser(prog="inferasim")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cli(sub)
    args = parser.parse_args(argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def _yaml(tmp_path, text: str):  # noqa: ANN001, ANN202
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return str(p)


def test_simulate_a_workload_as_json(tmp_path, capsys) -> None:  # noqa: ANN001
    w = _yaml(tmp_path, "kind: multi-turn\nsessionsPerSecond: 1\nturns: 3\ninputTokens: 800\noutputTokens: 60\n"
                        "userTokensPerTurn: 50\nthinkTimeS: 1\nnumRequests: 45\n")
    code, out, err = _run(["simulate", *MODEL, "--workload", w, "--output", "json", "--replicas", "2",
                           "--router", "prefix", "--slo-ttft-ms", "500"], capsys)
    assert code == 0
    d = json.loads(out)
    assert d["completed"] == 45 and d["dropped"] == 0 and d["gpus"] == 2
    assert d["prefix_hit_rate"] > 0.3 and d["throughput_per_gpu"] > 0
    for key in ("ttft", "itl"):
        assert set(d[key]) == {"mean", "p50", "p90", "p99"}
    assert d["config"]["router"] == "prefix"
    assert d["anchored"] != ("no anchor" in err)  # a note when measurement-free


def test_simulate_a_trace_as_a_table(shared_data, tmp_path, capsys) -> None:  # noqa: ANN001
    trace = str(shared_data / "traces" / "conversation_trace.jsonl")
    recs = tmp_path / "r.jsonl"
    code, out, _ = _run(["simulate", *MODEL, "--trace", trace, "--sample", "200", "--time-scale", "4",
                         "--requests-out", str(recs)], capsys)
    assert code == 0
    assert "TTFT (ms)" in out and "prefix cache hit rate" in out and "200 / 0" in out
    rows = [json.loads(line) for line in recs.read_text().splitlines()]
    assert len(rows) == 200 and all(r["ttft"] > 0 and r["dropped"] is None for r in rows)
    assert sum(r["prefix_hit"] for r in rows) > 0


def test_bad_input_names_the_field(tmp_path, capsys) -> None:  # noqa: ANN001
    bad = _yaml(tmp_path, "kind: poisson\nrequestRate: -2\n")
    with pytest.raises(ValueError, match="requestRate"):
        _run(["simulate", *MODEL, "--workload", bad], capsys)
    with pytest.raises(ValueError, match="needs requestRate"):
        load_workload(_yaml(tmp_path, "kind: poisson\n"))
    with pytest.raises(ValueError, match="does not exist"):
        load_workload(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="host-kv-gb"):
        _run(["simulate", *MODEL, "--workload", _yaml(tmp_path, "kind: poisson\nrequestRate: 1\nnumRequests: 3\n"),
              "--host-kv-gb", "-1"], capsys)
    with pytest.raises(SystemExit):  # argparse: exactly one of --trace / --workload
        _run(["simulate", *MODEL], capsys)
    ok = _yaml(tmp_path, "static:\n  kind: closed\n  concurrency: 2\n  numRequests: 4\n")
    assert load_workload(ok).concurrency == 2


def test_bad_input_exits_2_naming_the_field_without_a_traceback(tmp_path, capsys) -> None:  # noqa: ANN001
    """Through the installed entry point (`inferasim.cli.main`), not only the subcommand."""
    from inferasim.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": "many"}\n')
    bad, ok = tmp_path / "bad.yaml", tmp_path / "ok.yaml"
    bad.write_text("kind: poisson\nrequestRate: 0\n")
    ok.write_text("kind: closed\nconcurrency: 2\nnumRequests: 2\n")
    neg, frac, azure = tmp_path / "neg.jsonl", tmp_path / "frac.jsonl", tmp_path / "a.csv"
    neg.write_text('{"timestamp": 0, "input_length": -100, "output_length": 10}\n')
    frac.write_text('{"timestamp": 0, "input_length": 100, "output_length": 100.7}\n')
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,10\n")
    cases = [(["--trace", str(trace)], "t.jsonl:1: field 'output_length'"),
             (["--trace", str(neg)], "field 'input_length' must be a whole number of tokens >= 1, got -100"),
             (["--trace", str(frac)], "field 'output_length' must be a whole number of tokens >= 0, got 100.7"),
             (["--trace", str(azure)], "column ContextTokens must be a whole number of tokens >= 1, got '0'"),
             (["--workload", str(ok), "--sample", "3"], "--sample apply to --trace only"),
             (["--workload", str(ok), "--time-scale", "0.5", "--format", "azure"],
              "--format, --time-scale apply to --trace only"),
             (["--trace", str(tmp_path)], "is not a file"),
             (["--workload", str(bad)], "requestRate"),
             (["--workload", str(ok), "--disagg", "1-2"], "disagg"),
             (["--workload", str(ok), "--tp", "0"], "--tp")]
    for extra, field in cases:
        try:
            code = main(["simulate", *MODEL, *extra])
        except SystemExit as exc:  # argparse's own checks
            code = exc.code
        assert code == 2, extra
        err = capsys.readouterr().err
        assert "Traceback" not in err and "inferasim simulate: error:" in err
        assert field in err, err


def test_anchor_for_another_model_is_refused(capsys) -> None:  # noqa: ANN001
    from inferasim.cli.simulate import ANCHOR_DIR

    anchor = next(iter(sorted(ANCHOR_DIR.glob("vllm-meta-llama--llama-3.1-70b-h100*.json"))), None)
    if anchor is None:
        pytest.skip("no shipped 70B H100 anchor")
    w = "--workload"
    with pytest.raises(ValueError, match="--anchor .* is for model"):
        _run(["simulate", *MODEL, "--anchor", str(anchor), w, "unused.yaml"], capsys)


def test_plot(tmp_path, capsys) -> None:  # noqa: ANN001
    pytest.importorskip("matplotlib")
    w = _yaml(tmp_path, "kind: poisson\nrequestRate: 2\ninputTokens: 500\noutputTokens: 50\nnumRequests: 40\n")
    png = tmp_path / "p.png"
    code, out, _ = _run(["simulate", *MODEL, "--workload", w, "--plot", str(png)], capsys)
    assert code == 0 and png.stat().st_size > 1000 and "plot written" in out


def test_output_files_that_cannot_be_written_are_refused_before_the_run(tmp_path, capsys,  # noqa: ANN001
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import inferasim.sim.api as api

    def no_run(*a, **kw) -> None:  # noqa: ANN002, ANN003
        raise AssertionError("simulated before checking the output paths")

    monkeypatch.setattr(api, "simulate_workload", no_run)
    w = _yaml(tmp_path, "kind: poisson\nrequestRate: 2\nnumRequests: 5\n")
    for option, path, why in (("--requests-out", tmp_path / "no" / "r.jsonl", "folder .* does not exist"),
                              ("--requests-out", tmp_path, "is a folder"),
                              ("--plot", tmp_path / "no" / "p.png", "folder .* does not exist")):
        if option == "--plot":
            pytest.importorskip("matplotlib")
        with pytest.raises(ValueError, match=f"{option} .*{why}"):
            _run(["simulate", *MODEL, "--workload", w, option, str(path)], capsys)


def test_progress_bar_on_a_terminal_only(shared_data, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import io
    import re
    import sys

    class _Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    trace = str(shared_data / "traces" / "conversation_trace.jsonl")
    argv = ["simulate", *MODEL, "--trace", trace, "--sample", "1000", "--time-scale", "4"]
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "1000 / 0" in out
    shown = [float(x) for x in re.findall(r"simulating \[#*\s*\]\s+([\d.]+)%", tty.getvalue())]
    assert shown and shown == sorted(shown) and all(0 < x <= 100 for x in shown)
    assert tty.getvalue().endswith("\r")  # the bar is cleared before the results
    monkeypatch.undo()
    _, _, err = _run(argv, capsys)
    assert "simulating [" not in err  # not a terminal: no bar


def test_full_mooncake_replay_completes(shared_data) -> None:  # noqa: ANN001
    """The acceptance case: the whole conversation trace (12,031 requests, one hour) on one
    replica of Llama-3.1-70B fp8, tp8, finishes every request. Its speed (under 2 s on one core)
    is `make bench`'s to measure (benchmarks/sim_bench.py), not a timed test's."""
    from inferasim.catalog.gpus import get_gpu
    from inferasim.catalog.models import get_model
    from inferasim.core.layout import Layout
    from inferasim.core.spec import TraceWorkload
    from inferasim.model.predictor import unanchored
    from inferasim.sim.api import simulate_workload

    f = unanchored("vllm", get_model("meta-llama/Meta-Llama-3.1-70B"), get_gpu("H100"), "fp8", Layout(tp=8),
                   kv_dtype="fp8")
    t0 = time.perf_counter()
    rep = simulate_workload(f, Layout(tp=8), TraceWorkload(path=str(shared_data / "traces" /
                                                                    "conversation_trace.jsonl")))
    wall = time.perf_counter() - t0
    assert len(rep.completed) == 12031
    print(f"Mooncake replay: {wall:.2f} s wall")


def test_a_run_where_every_request_is_dropped_fails_with_the_reason(tmp_path, capsys) -> None:  # noqa: ANN001
    too_long = _yaml(tmp_path, "kind: closed\nconcurrency: 2\nnumRequests: 4\ninputTokens: 200000\noutputTokens: 8\n")
    code, _, err = _run(["simulate", *MODEL, "--workload", too_long], capsys)
    assert code == 1 and "no request completed (" in err and "x context length" in err


def test_a_lockstep_closed_loop_is_compared_with_the_benchmark_estimate(tmp_path, capsys) -> None:  # noqa: ANN001
    """Every client of a fixed-length closed loop starts at once and the simulator keeps their
    waves together; a measured benchmark keeps part of them. The report carries predict's figures
    for the same point, and a note says why they differ when they do (TTFT was 3x predict's, with
    no word)."""
    w = _yaml(tmp_path, "kind: closed\nconcurrency: 32\ninputTokens: 1024\noutputTokens: 256\nnumRequests: 128\n")
    code, out, err = _run(["simulate", *MODEL, "--workload", w, "--output", "json", "--no-series"], capsys)
    assert code == 0, err
    d = json.loads(out)
    est = d["benchmark_estimate"]
    assert est["ttft_ms"] > 0 and est["tpot_ms"] > 0
    differs = not 0.8 * est["ttft_ms"] <= d["ttft"]["mean"] <= 1.25 * est["ttft_ms"]
    assert ("keeps their arrival waves in lock step" in err) == differs
    spread = _yaml(tmp_path, "kind: closed\nconcurrency: 32\ninputTokens: 1024\noutputTokens: 256\nnumRequests: 128\n"
                             "thinkTimeS: 0.5\n")
    code, out, err = _run(["simulate", *MODEL, "--workload", spread, "--output", "json", "--no-series"], capsys)
    assert code == 0 and "benchmark_estimate" not in json.loads(out) and "lock step" not in err


def test_a_closed_loop_whose_every_request_is_refused_ends_cleanly(tmp_path, capsys) -> None:  # noqa: ANN001
    """One replica, one client, 3000 prompts longer than the model's context: each refusal issues
    the next request at once; that once recursed until the stack overflowed (a traceback)."""
    w = _yaml(tmp_path, "kind: closed\nconcurrency: 1\nnumRequests: 3000\ninputTokens: 200000\noutputTokens: 10\n")
    code, out, err = _run(["simulate", *MODEL, "--workload", w, "--output", "json", "--no-series"], capsys)
    assert code == 1 and "no request completed (3000 dropped: 3000 x context length)" in err
