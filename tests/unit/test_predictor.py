"""The anchored predictor end to end: fit round trip, transfer, validation regression guard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferasim.anchor_rules import select_anchors
from inferasim.core.runs import filter_rows, load_rows
from inferasim.errors import CannotPredict
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import load_anchor
from inferasim.model.predictor import AnchoredPredictor, anchor_from_rows, clients, fit_anchor_rows, fitted_from_anchor
from inferasim.sources import read_as_run
from inferasim.validate import run_validation

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def silicon(request: pytest.FixtureRequest):  # noqa: ANN201
    path = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    if not path.exists():
        pytest.skip("shared data not present")
    return filter_rows(read_as_run(load_rows(path)))  # as `inferasim validate` reads it


def test_round_trip_anchor_points_within_fit_residual(silicon) -> None:
    anchors = select_anchors(silicon)
    checked = 0
    for choice in anchors.values():
        if len(choice.rows) < 5:
            continue
        try:
            fitted = fit_anchor_rows(choice.rows)
        except CannotPredict as exc:  # rows at a layout the engine cannot start: no anchor
            assert "cannot start" in str(exc)
            continue
        logs = []
        for row in choice.rows:
            pred = fitted.predict(row)
            logs += [np.log(pred.tpot_ms / row.tpot_ms), np.log(pred.ttft_ms / row.ttft_ms)]
        rms = float(np.sqrt(np.mean(np.square(logs))))
        assert rms == pytest.approx(fitted.fit.rms_log_error, rel=0.05, abs=0.01)
        checked += 1
    assert checked >= 10


def test_stored_anchor_reproduces_the_fit(silicon, tmp_path: Path) -> None:
    choice = next(c for c in select_anchors(silicon).values() if len(c.rows) >= 5)
    anchor = anchor_from_rows(choice.rows, "test")
    store = AnchorStore(tmp_path)
    path = store.save(anchor)
    again = fitted_from_anchor(load_anchor(path))
    direct = fit_anchor_rows(choice.rows)
    row = choice.rows[-1]
    assert again.predict(row).tpot_ms == pytest.approx(direct.predict(row).tpot_ms, rel=1e-9)


def test_transfer_to_more_gpus_lowers_tpot_but_not_below_the_fixed_cost(silicon) -> None:
    key = next(k for k in select_anchors(silicon) if "Llama-3.1-70B" in k[2] and k[3] == "h100_sxm")
    fitted = fit_anchor_rows(select_anchors(silicon)[key].rows)
    from inferasim.core.layout import Layout

    t2 = fitted.predict_layout(Layout(tp=2), 1024, 1024, 8)["tpot"]
    t8 = fitted.predict_layout(Layout(tp=8), 1024, 1024, 8)["tpot"]
    assert t8 < t2
    assert t8 > fitted.params.t_fixed
    assert t8 > t2 / 4  # the host part does not shrink


def test_unknown_model_is_unpredicted_with_reason(silicon) -> None:
    rows = [r for r in silicon if r.mode == "agg"][:3]
    from dataclasses import replace

    bad = [replace(r, model_path="acme/Unknown-1B") for r in rows]
    with pytest.raises(CannotPredict, match="unknown model"):
        AnchoredPredictor().fit(bad[0].kernel_key, bad)


def test_validate_refuses_a_row_at_a_layout_the_engine_cannot_start(silicon) -> None:
    """A row whose tp does not divide the attention heads (vLLM asserts it at start-up) did not run
    as written: validate reports it unpredicted with the engine's reason instead of scoring it."""
    from dataclasses import replace

    from inferasim.core.runs import Layout

    key = next(k for k in select_anchors(silicon) if "Llama-3.1-70B" in k[2] and k[0] == "vllm")
    rows = [r for r in silicon if r.kernel_key == key and r.mode == "agg"]
    bad = replace(rows[0], id="tp999-row", layout=Layout(tp=999))
    res = run_validation([*rows, bad], AnchoredPredictor())
    got = {r.row.id: r for r in res.results}
    assert got["tp999-row"].status == "unpredicted"
    assert "cannot start tp999" in got["tp999-row"].reason and "attention heads" in got["tp999-row"].reason
    assert sum(r.status == "ok" for r in res.results) >= 1  # the rows that can run are still scored


def test_validation_accuracy_regression_guard(silicon) -> None:
    """Loose bounds well above the measured figures (see the closing notes): they catch a broken
    law, not a one-point regression."""
    res = run_validation(silicon, AnchoredPredictor())
    s = res.summary
    assert s["tpot"]["median_ape"] < 0.16
    assert s["ttft"]["median_ape"] < 0.32
    assert s["throughput_per_gpu"]["median_ape"] < 0.16
    assert s["ranking"]["pair_accuracy"] > 0.9
    assert s["tpot"]["n"] > 1000


def test_validate_cli_writes_outputs(tmp_path: Path) -> None:
    data = REPO.parent / "shared" / "data" / "argonne-offline" / "vllm_offline_dev.csv"
    if not data.exists():
        pytest.skip("shared data not present")
    r = subprocess.run([sys.executable, "-m", "inferasim.cli", "validate", str(data), "--anchor-rule", "min-gpus",
                        "--out", str(tmp_path), "--split-by", "engine,gpu", "--split-by", "reach"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary)[:3] == ["tpot", "ttft", "throughput_per_gpu"]
    assert summary["batch_latency"]["n"] > 500 and summary["batch_latency"]["median_ape"] < 0.2
    # a comma list and a repeated flag add up: no split the user asked for is dropped
    assert list(summary["splits"]) == ["engine", "gpu", "reach"] and (tmp_path / "predictions.csv").exists()
    # each split is printed as a table, its groups' scored rows adding up to the whole
    assert "median APE by reach" in r.stdout and "median APE by gpu" in r.stdout
    reach = summary["splits"]["reach"]
    assert sum(v["counts"]["scored_agg"] for v in reach.values()) == summary["counts"]["scored_agg"]


def test_predict_cli_uses_shipped_anchor_and_flags_unanchored() -> None:
    base = [sys.executable, "-m", "inferasim.cli", "predict", "--model", "meta-llama/Llama-3.1-70B", "--engine",
            "vllm", "--precision", "fp8", "--isl", "1024", "--osl", "1024", "--concurrency", "16", "-o", "json"]
    r = subprocess.run(base + ["--gpu", "h100_sxm", "--tp", "4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["anchor"] and d["mode"] == "anchored"
    assert d["interval"]["tpot_ms"][0] < d["tpot_ms"] < d["interval"]["tpot_ms"][1]
    # the shipped H100 fp8 anchor is tp2 at 1024x1024: tp4 carries a layout, not lengths
    assert len(d["carries"]) == 1 and "x2 GPUs" in d["carries"][0]
    i = base.index("--isl")
    longer = base[:i] + ["--isl", "8192"] + base[i + 2:]
    r = subprocess.run(longer + ["--gpu", "h100_sxm", "--tp", "4"], capture_output=True, text=True, timeout=120)
    d8 = json.loads(r.stdout)
    assert any("prompt 8192 tokens, 3.0 doublings" in c for c in d8["carries"])
    # and the band widens with what it carries
    width = d["interval"]["ttft_ms"][1] / d["interval"]["ttft_ms"][0]
    assert d8["interval"]["ttft_ms"][1] / d8["interval"]["ttft_ms"][0] > width
    r = subprocess.run(base + ["--gpu", "MI355X", "--tp", "4"], capture_output=True, text=True, timeout=120)
    d = json.loads(r.stdout)
    assert d["anchor"] is None and d["mode"].startswith("unanchored")
    assert d["carries"] and "no measurement" in d["carries"][0]
    r = subprocess.run(base + ["--gpu", "MI355X", "--tp", "4", "--require-anchor"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "nearest" in r.stderr
    # --precision auto reads the checkpoint the name gives: AMD's FP8-KV Llama runs FP8 weights and
    # an FP8 KV cache (priced at the BF16 config's 16 bits, 64 clients of 9k tokens did not fit).
    amd = [sys.executable, "-m", "inferasim.cli", "predict", "--model", "amd/Llama-3.3-70B-Instruct-FP8-KV",
           "--engine", "vllm", "--gpu", "mi300x", "--tp", "1", "--isl", "1024", "--osl", "8192", "-o", "json"]
    r = subprocess.run(amd + ["--concurrency", "64"], capture_output=True, text=True, timeout=120)
    d = json.loads(r.stdout)
    assert d["precision"] == "fp8" and "running_per_replica" not in d, r.stderr


def test_predict_cli_holds_a_request_rate_against_the_anchor_sweep_by_requests_in_flight() -> None:
    """At a request rate the concurrency that meets the anchor's sweep (4-64 clients for the
    shipped H100 fp8 tp2 anchor) is the steady count in flight: a rate that keeps a handful
    running carries nothing, one that keeps a single request running is outside the sweep, and
    `carries` names what widens the band."""
    base = [sys.executable, "-m", "inferasim.cli", "predict", "--model", "meta-llama/Llama-3.1-70B", "--engine",
            "vllm", "--precision", "fp8", "--gpu", "h100_sxm", "--tp", "2", "--isl", "1024", "--osl", "1024",
            "-o", "json"]

    def run(*load: str) -> dict:
        r = subprocess.run(base + list(load), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def width(d: dict) -> float:
        return d["interval"]["tpot_ms"][1] / d["interval"]["tpot_ms"][0]
    inside, busy, idle = run("--concurrency", "16"), run("--request-rate", "2"), run("--request-rate", "0.05")
    assert inside["carries"] == [] and busy["carries"] == [] and not busy["extrapolated"]
    assert width(busy) == pytest.approx(width(inside))
    assert idle["extrapolated"] and idle["carries"] == ["concurrency 1 outside the anchor's 4-64"]
    assert width(idle) > width(busy)


def test_predict_cli_refuses_a_layout_the_engine_would_not_start() -> None:
    base = [sys.executable, "-m", "inferasim.cli", "predict", "--gpu", "h100", "--engine", "vllm",
            "--isl", "1024", "--osl", "256", "--concurrency", "8"]
    r = subprocess.run(base + ["--model", "meta-llama/Llama-3.1-8B", "--tp", "3"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "tp=3 does not divide the 32 attention heads" in r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
    r = subprocess.run(base + ["--model", "meta-llama/Llama-3.1-405B", "--tp", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "weights need" in r.stderr


def test_shipped_anchors_are_valid() -> None:
    store = AnchorStore(REPO / "anchors")
    assert not store.errors()
    assert len(store.all()) >= 40
    for a in store.all():
        # Public rows, or isolated steps measured on a lent GPU (provenance says the card and torch).
        if a.provenance.method == "pytorch":
            assert a.steps and not a.points and "H200" in a.provenance.engine_image
            assert a.kernel_set.attention_backend == "torch-sdpa"
        else:
            assert a.provenance.method == "public-data" and a.provenance.rows


def test_shipped_anchor_parameters_match_a_fresh_fit() -> None:
    """The stored parameters are what the current fit gives for the stored points (re-run
    `inferasim anchors build` after changing the model)."""
    store = AnchorStore(REPO / "anchors")
    for anchor in sorted(store.all(), key=lambda a: a.id)[::15]:
        stored = fitted_from_anchor(anchor)
        fresh = fitted_from_anchor(anchor.model_copy(update={"params": {}}))
        for key in ("t_fixed", "e_bw", "t_ttft"):
            a, b = getattr(stored.params, key), getattr(fresh.params, key)
            assert a == pytest.approx(b, rel=1e-6, abs=1e-9), (anchor.id, key)


def test_parameters_of_another_step_model_revision_are_refitted_from_the_points(tmp_path: Path) -> None:
    """An anchor records the step-time model revision its parameters were fitted under. Read by a
    later revision, they would mean something else (a rate, a shape law changed): the anchor is
    refitted from its own points instead, and `anchors check` says so. Parameters of the current
    revision, or of an anchor that records none, are used as stored."""
    from inferasim.model.steptime import STEP_MODEL_REVISION

    shipped = sorted(AnchorStore(REPO / "anchors").all(), key=lambda a: a.id)[0]
    assert shipped.fit is not None and shipped.fit.step_model == STEP_MODEL_REVISION
    fresh = fitted_from_anchor(shipped)
    bogus = {**shipped.params, "t_fixed": shipped.params["t_fixed"] * 5.0}
    old_fit = shipped.fit.model_copy(update={"step_model": "2000-01-01"})
    stale = shipped.model_copy(update={"params": bogus, "fit": old_fit})
    refit = fitted_from_anchor(stale)
    assert refit.params.t_fixed == pytest.approx(fresh.params.t_fixed, rel=1e-6)
    assert "2000-01-01" in refit.fit.message and STEP_MODEL_REVISION in refit.fit.message
    # The current revision, and no revision at all: the stored parameters.
    current = shipped.model_copy(update={"params": bogus})
    assert fitted_from_anchor(current).params.t_fixed == pytest.approx(bogus["t_fixed"])
    unknown = shipped.model_copy(update={"params": bogus, "fit": shipped.fit.model_copy(update={"step_model": ""})})
    assert fitted_from_anchor(unknown).params.t_fixed == pytest.approx(bogus["t_fixed"])
    # `anchors check` names the refit.
    folder = tmp_path / "a"
    folder.mkdir()
    (folder / "stale.json").write_text(stale.model_dump_json(indent=2))
    out = subprocess.run([sys.executable, "-m", "inferasim", "anchors", "check", str(folder)],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "refitted from the anchor's" in out.stderr and "2000-01-01" in out.stderr


def test_schema_layouts_read_as_the_deployment_that_ran() -> None:
    """aiconfigurator silicon rows: batch_size is per attention-DP rank; squared expert-parallel
    widths (vLLM tpT dpT epT*T, SGLang tpT*T over moe_tp T x ep T beyond a node) are the T-GPU runs."""
    from dataclasses import replace

    from inferasim.core.layout import Layout as SimLayout
    from inferasim.core.runs import Layout as RowLayout
    from inferasim.model.predictor import clients, to_layout

    # The predictor prices a layout as written (the squared widths of one public file are read by
    # that file's loader rule, inferasim.sources): tp4 dp4 ep16 is 16 GPUs.
    assert to_layout(RowLayout(tp=4, dp=4, moe_ep=16)) == SimLayout(tp=4, dp=4, moe_ep=16)
    assert to_layout(RowLayout(tp=16, moe_tp=4, moe_ep=4)) == SimLayout(tp=16, moe_tp=4, moe_ep=4)
    rows = [r for r in load_rows(REPO.parent / "shared/data/aic-silicon/silicon_dev.csv")
            if r.mode == "agg" and r.layout.dp > 1][:3] if (REPO.parent / "shared/data").exists() else []
    for r in rows:
        assert clients(r) == r.concurrency * r.layout.dp
        assert clients(replace(r, scenario="offline")) == r.concurrency


def test_interval_widens_with_what_a_prediction_carries(silicon) -> None:
    """The band grows with each doubling of prompt or output length beyond the anchor's range and
    with another layout (a little more per doubling of GPUs), and a concurrency outside the sweep
    adds to TPOT's; within the anchor's own range and layout it is the fit residual alone."""
    from inferasim.core.layout import Layout

    key = next(k for k in select_anchors(silicon) if k[0] == "vllm" and "Llama-3.1-70B" in k[2]
               and k[3] == "h100_sxm")
    fitted = fit_anchor_rows(select_anchors(silicon)[key].rows)
    lay, isl, osl = fitted.layout, fitted.isl_range[0], fitted.osl_range[0]
    conc = fitted.conc_range[0]
    for metric in ("ttft", "tpot"):
        home = fitted.spread(False, lay, isl, osl, metric, concurrency=conc)
        residual = np.sqrt(np.mean(np.square(fitted.fit.residuals[metric])))
        assert home == pytest.approx(1.64 * max(residual, 0.03))
        longer = [fitted.spread(True, lay, isl * 2 ** k, osl, metric, concurrency=conc) for k in (1, 2, 3)]
        assert home < longer[0] < longer[1] < longer[2]
        wider = [fitted.spread(False, Layout(tp=lay.tp * 2 ** k), isl, osl, metric, concurrency=conc)
                 for k in (1, 2)]
        assert home < wider[0] < wider[1]
    assert fitted.spread(True, lay, isl, osl, "tpot", concurrency=fitted.conc_range[1] * 4) > \
        fitted.spread(False, lay, isl, osl, "tpot", concurrency=conc)


def test_interval_coverage_is_near_nominal_in_every_reach_group(silicon) -> None:
    """The nominal 90% bands hold 80-97% of the measured TTFT and TPOT in each group of what a
    prediction carries (another layout, other lengths, both) for each engine: a band sized for one
    group only (too wide for layouts, too narrow for longer prompts) fails here."""
    from inferasim.validate import row_reach

    res = run_validation(silicon, AnchoredPredictor())
    groups: dict[tuple[str, str, str], list[bool]] = {}
    for r in res.results:
        if r.status != "ok" or r.row.mode != "agg" or r.row.backend not in ("vllm", "sglang"):
            continue
        reach = row_reach(r.row, res.anchors[r.row.kernel_key])
        for metric in ("ttft", "tpot"):
            lo, hi = r.interval[metric]
            groups.setdefault((metric, r.row.backend, reach), []).append(lo <= r.measured[metric] <= hi)
    assert len(groups) == 12
    for group, inside in groups.items():
        assert 0.80 <= float(np.mean(inside)) <= 0.97, (group, float(np.mean(inside)), len(inside))


def test_an_attention_dp_anchor_sweep_is_counted_in_clients() -> None:
    """A dp > 1 row's batch_size is one rank's batch; the anchor's sweep is held in clients (batch
    x dp), as predictions are, so a row of the anchor's own sweep is not called an extrapolation."""
    data = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
    if not data.exists():
        pytest.skip("shared data not present")
    rows = [r for r in load_rows(data) if r.backend == "vllm" and r.mode == "agg" and r.layout.dp == 4
            and "Kimi-K2.5" in r.model_path and r.isl == 1024 and r.osl == 1024]
    key = rows[0].kernel_key
    sweep = [r for r in rows if r.kernel_key == key and r.layout == rows[0].layout]
    assert len({r.concurrency for r in sweep}) >= 3
    fitted = fit_anchor_rows(sweep)
    assert fitted.conc_range == (min(clients(r) for r in sweep), max(clients(r) for r in sweep))
    assert not any(fitted.predict(r).extrapolated for r in sweep)
    assert all(fitted.carries(fitted.layout, r.isl, r.osl, clients(r)) == [] for r in sweep)


def test_an_anchor_carries_to_a_sibling_gpu_at_its_own_bandwidth_and_memory() -> None:
    """An H100 anchor predicts an H200 (the same die with HBM3e): its efficiencies at the H200's
    bandwidth and memory, never slower than the H100 it was measured on, flagged as carried and
    extrapolated with a wider interval; it does not carry to another die, and tune still asks for
    the H200's own anchor."""
    from inferasim.catalog.gpus import get_gpu, siblings
    from inferasim.catalog.models import get_model
    from inferasim.core.layout import Layout
    from inferasim.model.predictor import carry_to_gpu
    from inferasim.search.tune import anchored_fit

    assert set(siblings(get_gpu("H200"))) == {"H100", "GH200"} and siblings(get_gpu("MI355X")) == ("MI350X",)
    assert siblings(get_gpu("B300")) == ("GB300",) and "MI300X" not in siblings(get_gpu("MI355X"))
    store = AnchorStore(REPO / "anchors")
    model = get_model("openai/gpt-oss-120b")
    h100, h200 = get_gpu("H100"), get_gpu("H200")
    found = anchored_fit(store, "vllm", model, h200, "fp4")
    assert found is not None
    carried, anchor = found
    assert carried.measured_on == "H100" and carried.gpu is h200 and get_gpu(anchor.kernel_set.gpu) is h100
    own = fitted_from_anchor(anchor)
    assert carried.params == own.params
    lay = Layout(tp=2)
    for conc in (8, 64):
        a, b = own.predict_layout(lay, 1024, 1024, conc), carried.predict_layout(lay, 1024, 1024, conc)
        assert b["tpot"] < a["tpot"] and b["ttft"] <= a["ttft"] * 1.001
    assert carried.spread(False, lay, 1024, 1024) > own.spread(False, lay, 1024, 1024)
    assert carried.beyond_measured(8, 1024, 1024) and not own.beyond_measured(8, 1024, 1024)
    assert any("measured on H100" in c for c in carried.carries(lay, 1024, 1024))
    with pytest.raises(ValueError, match="not the same die"):
        carry_to_gpu(own, get_gpu("B200"))
    from inferasim.core.spec import parse_spec
    from inferasim.search.tune import tune

    spec = parse_spec({"model": "openai/gpt-oss-120b", "engines": ["vllm"], "precision": ["fp4"],
                       "hardware": {"gpu": "H200", "maxGPUs": 2},
                       "objective": {"maximize": "throughputPerGPU"},
                       "search": {"disaggregation": False, "pipelineParallel": False},
                       "workload": {"static": {"kind": "closed", "concurrency": 16, "inputTokens": 1024,
                                               "outputTokens": 256, "numRequests": 64}}})
    result = tune(spec, store=store, stage2_top=2)
    rec = result.entry(result.recommendation)
    assert rec["anchor"].endswith("@H100") and rec["extrapolated"] is not None
    assert [m["gpu"] for m in result.missing_anchors] == ["H200"]


def test_a_row_is_priced_at_its_checkpoints_precision_when_the_cell_is_empty() -> None:
    """An empty precision cell reads the checkpoint the row names: AMD's -FP8-KV Llama is FP8
    weights with an FP8 KV cache, though the catalog prices it by the BF16 Llama-3.1-70B config;
    every spelling of a quantised precision gets the FP8 KV cache the benchmarks run."""
    from inferasim.catalog.models import get_model
    from inferasim.core.runs import BenchRow
    from inferasim.core.runs import Layout as RowLayout
    from inferasim.model.predictor import benchmark_kv_dtype, row_precision

    def row(model: str, precision: str) -> BenchRow:
        return BenchRow(id="r", backend="vllm", backend_version="0.10.1", model_path=model, system="mi300x",
                        precision=precision, mode="agg", scenario="closed", isl=1024, osl=1024, concurrency=8,
                        layout=RowLayout(), prefill=None, decode=None, ttft_ms=None, tpot_ms=None,
                        batch_latency_s=None, throughput_tok_s=None)

    llama = get_model("meta-llama/Llama-3.1-70B")
    assert row_precision(row("amd/Llama-3.1-70B-Instruct-FP8-KV", ""), llama) == "fp8"
    assert row_precision(row("meta-llama/Llama-3.1-70B-Instruct", ""), llama) == "bf16"
    assert row_precision(row("amd/Llama-3.1-70B-Instruct-FP8-KV", "fp16"), llama) == "fp16"  # the cell wins
    for spelling in ("fp8", "fp8_block", "FP8_E4M3", "nvfp4", "mxfp4"):
        assert benchmark_kv_dtype(spelling) == "fp8", spelling
    for spelling in ("", "bf16", "fp16", "int4", "no-such-precision"):
        assert benchmark_kv_dtype(spelling) == "auto", spelling


def test_a_recorded_client_count_is_what_ran_whichever_way_batch_size_was_written() -> None:
    """batch_size of an attention-dp row is per rank in the silicon schema (clients = batch x dp);
    a row whose source note records the run's clients is held to that count."""
    from inferasim.core.runs import BenchRow
    from inferasim.core.runs import Layout as RowLayout

    def row(batch: int, note: str) -> BenchRow:
        return BenchRow(id="r", backend="sglang", backend_version="0.5.9", model_path="deepseek-ai/DeepSeek-R1",
                        system="mi355x", precision="fp8", mode="agg", scenario="closed", isl=1024, osl=1024,
                        concurrency=batch, layout=RowLayout(tp=1, dp=8, moe_tp=1, moe_ep=8), prefill=None,
                        decode=None, ttft_ms=None, tpot_ms=None, batch_latency_s=None, throughput_tok_s=None,
                        raw={"silicon_data_source": note})

    assert clients(row(8, "")) == 64  # per rank, no note: batch x dp
    assert clients(row(8, "model=DeepSeek-R1; silicon_concurrency=64")) == 64
    assert clients(row(64, "source=amd; silicon_concurrency=64")) == 64  # written as the total
