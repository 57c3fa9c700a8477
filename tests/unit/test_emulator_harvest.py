"""The harvester against the emulator: plan parsing, the anchor it writes, budget, refusals, CLI.

The emulator runs in a child process (spawn_emulator) so that the harvester's client in this
process does not share a GIL with it; everything binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferasim.catalog.gpus import get_gpu
from inferasim.catalog.models import get_model
from inferasim.cli.harvest import add_cli
from inferasim.core.layout import Layout
from inferasim.emulator import EmulatorConfig, EmulatorProcess, spawn_emulator
from inferasim.harvest import EXIT_FAILED, EXIT_POOR_FIT, HarvestConfig, PlanPoint, harvest, parse_plan
from inferasim.harvest.plan import default_plan
from inferasim.model.anchors import load_anchor
from inferasim.model.layoutcost import layout_cost
from inferasim.model.steptime import StepParams, step_time

MODEL = "meta-llama/Llama-3.1-8B"
PARAMS = StepParams(t_fixed=5e-3, t_seq=3e-5, e_bw=0.7, e_kv=0.5, e_flops=0.5, e_attn=0.35, t_ttft=0.03)
SPEEDUP = 25.0
SMALL_PLAN = "256x32@1,4;1024x16@2"


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorProcess]:
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=2, speedup=SPEEDUP, params=PARAMS)) as h:
        yield h


def test_parse_plan() -> None:
    pts = parse_plan("512x128@1,4;4096x64@8")
    assert [(p.isl, p.osl, p.concurrency) for p in pts] == [(512, 128, 1), (512, 128, 4), (4096, 64, 8)]
    assert pts[0].requests == 12 and pts[2].requests == 24  # max(12, 3 x C)
    assert [p.label() for p in default_plan()] == ["512x128@c1", "512x128@c4", "512x128@c16", "512x128@c64",
                                                   "4096x64@c8"]
    assert parse_plan("64x8@2", min_requests=1, per_client=5) == [PlanPoint(64, 8, 2, 10)]
    for bad in ("", "512@1", "512x128", "ax1@2", "512x128@0", "512x1@4"):
        with pytest.raises(ValueError, match="plan"):
            parse_plan(bad)


def test_harvest_writes_a_consistent_anchor(emu: EmulatorProcess, tmp_path: Path) -> None:
    cfg = HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="vllm", tp=2, speedup=SPEEDUP,
                        plan=parse_plan(SMALL_PLAN, min_requests=6), engine_version="0.11.0-emulated",
                        max_rms_log_error=0.5)
    report = harvest(cfg)
    assert report.exit_code == 0, report.message
    assert report.anchor is not None and report.fit is not None
    a = report.anchor
    assert a.kernel_set.engine == "vllm" and a.kernel_set.model == MODEL and a.kernel_set.gpu == "H100"
    assert a.kernel_set.precision == "" and a.kernel_set.engine_version == "0.11.0-emulated"
    assert a.layout.tp == 2 and len(a.points) == 3
    assert a.provenance.method == "harvest" and a.provenance.measured_by == "inferasim harvest"
    assert a.provenance.source == emu.url
    assert a.provenance.gpu_seconds == pytest.approx(report.wall_s * 2 * SPEEDUP)
    notes = a.provenance.notes
    assert "speedup 25" in notes and "engine time" in notes and "wall" in notes
    assert "for pipeline tests, not for accuracy" in notes  # host overheads read 25x too long
    # The server's counters moved by exactly what the client received (warm-up excluded).
    assert report.counters == {"prompt_tokens": report.client_tokens["prompt_tokens"],
                               "generation_tokens": report.client_tokens["generation_tokens"]}
    assert report.client_tokens["generation_tokens"] == 6 * 32 + 12 * 32 + 6 * 16
    for p in a.points:
        assert p.ttft_ms and p.tpot_ms and p.throughput_tok_s
    # TPOT at concurrency 1 is one decode step of batch 1 (5 ms host + weights over 0.7 x HBM, about
    # 8.5 ms). The client measures wall time x speedup, so a few ms of HTTP and scheduling delay on
    # 2 busy cores become 25x larger: a late first token inflates TTFT and, as the emulator's clock
    # catches up, deflates TPOT (seen: 5.8 to 9.0 ms). The band still catches a missing speedup
    # factor or a wrong step model (both off by far more than 40%).
    c1 = next(p for p in a.points if p.concurrency == 1)
    truth_ms = 1e3 * float(step_time(PARAMS, layout_cost(get_model(MODEL), get_gpu("H100"), Layout(tp=2)), 1, 256 + 16))
    assert 0.6 * truth_ms < c1.tpot_ms < 1.35 * truth_ms
    assert set(a.params) >= {"t_fixed", "e_bw", "t_ttft"}
    path = tmp_path / "out"
    path.mkdir()
    from inferasim.harvest import write_anchor

    written = write_anchor(a, path)
    assert written is not None and written.parent == path
    assert load_anchor(written).params == a.params
    # A second harvest of the same kernels and layout keeps the first one aside.
    b = a.model_copy(update={"points": a.points[:-1]})
    told: list[tuple[Path, Path]] = []
    assert write_anchor(b, path, on_replace=lambda p, kept: told.append((p, kept))) == written
    assert len(told) == 1 and told[0][0] == written and load_anchor(told[0][1]) == a
    assert load_anchor(written) == b


def test_harvest_refuses_a_poor_fit(emu: EmulatorProcess) -> None:
    cfg = HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="vllm", tp=2, speedup=SPEEDUP,
                        plan=parse_plan("256x16@1,2", min_requests=3), max_rms_log_error=1e-6)
    report = harvest(cfg)
    assert report.exit_code == EXIT_POOR_FIT
    assert "rms log error" in report.message and "not written" in report.message


def test_harvest_stops_within_its_budget(emu: EmulatorProcess) -> None:
    # The first point alone takes about 2.5 s of wall time at this speedup; the budget is 1 s.
    plan = [PlanPoint(512, 1000, 1, 3), PlanPoint(256, 16, 1, 3)]
    cfg = HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="vllm", tp=2, speedup=SPEEDUP, plan=plan,
                        budget_s=1.0, warmup=False)
    report = harvest(cfg)
    assert report.wall_s < 3.0
    assert report.exit_code == EXIT_FAILED and not report.points
    assert any("time budget" in s for s in report.skipped) and any("512x1000@c1" in s for s in report.skipped)
    assert any("256x16@c1: skipped" in s for s in report.skipped)


def test_harvest_names_a_wrong_model(emu: EmulatorProcess) -> None:
    from inferasim.harvest import HarvestError

    cfg = HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="vllm", tp=2,
                        served_model_name="acme/other", plan=parse_plan("64x4@1"))
    with pytest.raises(HarvestError, match="does not serve 'acme/other'"):
        harvest(cfg)


def test_httpx_client_measures_too(emu: EmulatorProcess) -> None:
    cfg = HarvestConfig(endpoint=emu.url + "/v1/", model=MODEL, gpu="H100", engine="vllm", tp=2, speedup=SPEEDUP,
                        plan=parse_plan("256x16@1,2", min_requests=3), client="httpx", max_rms_log_error=1.0)
    report = harvest(cfg)
    assert report.exit_code == 0 and len(report.points) == 2
    assert report.counters is not None and report.counters["generation_tokens"] == (3 + 6) * 16  # c1: 3, c2: 3 x 2


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferasim.harvest", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_exit_codes(emu: EmulatorProcess, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    common = ["run", "--endpoint", emu.url, "--model", MODEL, "--gpu", "H100", "--engine", "vllm", "--tp", "2",
              "--speedup", str(SPEEDUP), "--out", str(out), "--plan", "256x16@1,2", "--min-requests", "3"]
    r = run_cli(*common, "--max-rms-log-error", "0.000001")
    assert r.returncode == 3, r.stderr
    assert "fit too poor: rms log error" in r.stderr and not out.exists()
    report = tmp_path / "r.json"
    r = run_cli(*common, "--max-rms-log-error", "2", "--report", str(report))
    assert r.returncode == 0, r.stderr
    anchor = load_anchor(out)
    assert anchor.provenance.method == "harvest" and len(anchor.points) == 2
    rep = json.loads(report.read_text())
    assert rep["server_counter_deltas"]["generation_tokens"] == rep["client_tokens"]["generation_tokens"]
    assert rep["warnings"] == []  # the endpoint runs the layout given; nothing was measured again
    r = run_cli(*common[:-4], "--out", "-", "--plan", "256x16@1", "--min-requests", "2", "--quiet",
                "--max-rms-log-error", "5")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["provenance"]["method"] == "harvest"
    r = run_cli("run", "--endpoint", "http://127.0.0.1:9", "--model", MODEL, "--gpu", "H100", "--engine", "vllm",
                "--out", str(tmp_path / "x.json"))
    assert r.returncode == EXIT_FAILED and "cannot reach" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("run", "--endpoint", emu.url, "--model", MODEL, "--gpu", "H100", "--engine", "vllm",
                "--out", "-", "--plan", "nonsense")
    assert r.returncode == 2 and "--plan" in r.stderr


def test_add_cli_registers_harvest_run() -> None:
    from inferasim.cli.harvest import cmd_harvest, config_from_args

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["harvest", "run", "--endpoint", "http://127.0.0.1:8000", "--model", MODEL, "--gpu",
                              "MI300X", "--engine", "sglang", "--tp", "8", "--out", "-", "--budget-s", "60"])
    assert args.func is cmd_harvest
    cfg = config_from_args(args)
    assert cfg.engine == "sglang" and cfg.tp == 8 and cfg.budget_s == 60 and len(cfg.plan) == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["harvest", "run", "--endpoint", "x"])


def test_unwritable_out_is_refused_before_any_traffic(tmp_path: Path) -> None:
    from inferasim.cli.harvest import check_writable

    a_file = tmp_path / "a.json"
    a_file.write_text("{}")
    check_writable("--out", "-")
    check_writable("--out", str(tmp_path))
    check_writable("--out", str(tmp_path / "new" / "deeper" / "b.json"))  # folders are created
    with pytest.raises(ValueError, match="--report .* is a file, not a folder"):
        check_writable("--report", str(a_file / "r.json"))
    # The endpoint is down: exit 2 naming --out (not 1, "cannot reach") shows no request was tried.
    r = run_cli("run", "--endpoint", "http://127.0.0.1:9", "--model", MODEL, "--gpu", "H100", "--engine", "vllm",
                "--out", str(a_file / "x.json"))
    assert r.returncode == 2 and "--out" in r.stderr and "is a file, not a folder" in r.stderr, r.stderr
    assert "cannot reach" not in r.stderr and "Traceback" not in r.stderr


def test_harvest_warns_when_the_endpoint_reports_another_layout(emu: EmulatorProcess) -> None:
    """The emulator runs tp2 and says so at vLLM's /server_info: a harvest told --tp 4 warns
    (and keeps the warning in the anchor), one told --tp 2 does not."""
    import httpx

    info = httpx.get(f"{emu.url}/server_info", timeout=10).json()
    assert "tensor_parallel_size=2" in info["vllm_config"]
    said: list[str] = []
    for tp in (2, 4):
        cfg = HarvestConfig(endpoint=emu.url, model=MODEL, gpu="H100", engine="vllm", tp=tp, speedup=SPEEDUP,
                            plan=parse_plan("256x8@1", min_requests=2), max_rms_log_error=5.0)
        report = harvest(cfg, progress=said.append)
        assert report.anchor is not None, report.message
        warned = [w for w in report.warnings if "--tp 4 but the endpoint runs tp 2" in w]
        assert bool(warned) == (tp == 4)
        assert ("--tp 4 but the endpoint runs tp 2" in report.anchor.provenance.notes) == (tp == 4)
    assert any(line.startswith("warning: --tp 4 but the endpoint runs tp 2") for line in said)


def test_sglang_server_info_names_its_widths() -> None:
    from inferasim.harvest.client import layout_mismatch

    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", engine="sglang", tp=1, dp=2, speedup=SPEEDUP,
                                       params=PARAMS)) as h:
        import httpx

        info = httpx.get(f"{h.url}/get_server_info", timeout=10).json()
    assert (info["tp_size"], info["dp_size"], info["enable_dp_attention"]) == (1, 2, True)
    assert layout_mismatch({"tp": 1, "dp": 2}, {"tp": 1, "dp": 1, "ep": 1, "pp": 1}) == \
        "--dp 1 but the endpoint runs dp 2"
    assert layout_mismatch(None, {"tp": 1}) is None and layout_mismatch({"tp": 2}, {"tp": 2}) is None


def test_a_point_that_waited_outside_the_engine_is_measured_again() -> None:
    """The emulator stalls 3 s (emulated) the first time its batch reaches 4 sequences, as an engine
    compiling a kernel at a new shape's first use does: the 8-client point's first run reads a
    TTFT no engine step explains, the harvest measures it again, and the anchor keeps the warm run.
    Its short requests make the stalled run look like 2 requests in flight of 8: not a client cap,
    since the harvester opens a connection per client."""
    import httpx

    from inferasim.emulator.config import resolve

    with pytest.raises(ValueError, match="--stall-at-batch 4 --stall-s 0"):
        resolve(EmulatorConfig(model=MODEL, gpu="H100", stall_at_batch=4))
    with spawn_emulator(EmulatorConfig(model=MODEL, gpu="H100", tp=2, speedup=10.0, params=PARAMS,
                                       stall_at_batch=4, stall_s=3.0)) as stalling:
        cfg = HarvestConfig(endpoint=stalling.url, model=MODEL, gpu="H100", engine="vllm", tp=2, speedup=10.0,
                            plan=parse_plan("256x32@1,2,8", min_requests=6), max_rms_log_error=0.5)
        said: list[str] = []
        report = harvest(cfg, progress=said.append)
        assert httpx.get(f"{stalling.url}/_inferasim/stats", timeout=10).json()["stalls"] == 1
    assert report.exit_code == 0, report.message
    redone = [w for w in report.warnings if w.startswith("re-measured ")]
    assert len(redone) == 1 and redone[0].startswith("re-measured 256x32@c8"), report.warnings
    assert any("measuring it again" in line for line in said)
    c8 = next(p for p in report.points if p.point.concurrency == 8)
    c2 = next(p for p in report.points if p.point.concurrency == 2)
    # The warm run's TTFT is of the engine's order (a wave of 8 short prompts), not the 3 s stall's.
    assert c8.ttft_s() < 0.5 < 3.0 * 8 / 24 and c8.ttft_s() < 10 * c2.ttft_s()
    assert report.anchor is not None and "re-measured 256x32@c8" in report.anchor.provenance.notes
    assert report.anchor.params["client_cap"] == 0.0
    # Both runs' requests reached the server: its counters and the client's agree.
    assert report.counters is not None
    assert report.counters["generation_tokens"] == report.client_tokens["generation_tokens"] == (6 + 6 + 24 + 24) * 32
