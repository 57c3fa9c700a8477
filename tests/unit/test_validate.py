"""Tests of the validation protocol (DESIGN.md section 7) with small CSVs and test-double predictors."""

import csv
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from inferasim.anchor_rules import select_anchors
from inferasim.core.runs import TARGET_ENGINES, BenchRow, Layout, RowPrediction, load_rows
from inferasim.errors import CannotPredict
from inferasim.validate import metric_values, row_reach, run_validation, throughput_per_gpu
from inferasim.validation_outputs import write_outputs

# shared/ lies beside the checkout (DESIGN.md; CI lays a copy there too).
DEV_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"

COLUMNS = [
    "id",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    "prefill_batch_size",
    "prefill_num_workers",
    "prefill_tp_size",
    "prefill_pp_size",
    "prefill_attention_dp_size",
    "prefill_moe_tp_size",
    "prefill_moe_ep_size",
    "decode_batch_size",
    "decode_num_workers",
    "decode_tp_size",
    "decode_pp_size",
    "decode_attention_dp_size",
    "decode_moe_tp_size",
    "decode_moe_ep_size",
    "scenario",
    "batch_latency_s",
    "throughput_tok_s",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
]

_counter = iter(range(1, 1_000_000))


def rec(
    tp: int | str = 1,
    *,
    pp: int | str = 1,
    dp: int | str = 1,
    moe_tp: int | str = 1,
    moe_ep: int | str = 1,
    isl: int = 1024,
    osl: int = 128,
    c: int | str = 8,
    backend: str = "vllm",
    version: str = "0.10.0",
    model: str = "meta-llama/Llama-3.1-8B",
    system: str = "h100_sxm",
    precision: str = "fp16",
    mode: str = "agg",
    ttft: float | str = 100.0,
    tpot: float | str = 10.0,
    rid: str | None = None,
    **extra: str | int | float,
) -> dict[str, str]:
    row = {
        "id": rid if rid is not None else f"r{next(_counter)}",
        "backend": backend,
        "backend_version": version,
        "model_path": model,
        "system": system,
        "precision": precision,
        "mode": mode,
        "isl": isl,
        "osl": osl,
        "batch_size": c,
        "tp_size": tp,
        "pp_size": pp,
        "attention_dp_size": dp,
        "moe_tp_size": moe_tp,
        "moe_ep_size": moe_ep,
        "silicon_ttft_ms": ttft,
        "silicon_tpot_ms": tpot,
    }
    row.update(extra)
    return {k: str(v) for k, v in row.items()}


def write_csv(path: Path, records: list[dict[str, str]], columns: list[str] | None = None) -> Path:
    cols = columns or COLUMNS
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        for r in records:
            writer.writerow({k: r.get(k, "") for k in cols})
    return path


def rows_of(tmp_path: Path, records: list[dict[str, str]]) -> list[BenchRow]:
    return load_rows(write_csv(tmp_path / "runs.csv", records))


def ids(rows: list[BenchRow]) -> set[str]:
    return {r.id for r in rows}


# ---------------------------------------------------------------------------------------------
# test-double predictors

PredictFn = Callable[[BenchRow], RowPrediction]


class _Kernel:
    def __init__(self, fn: PredictFn, truth: dict[str, BenchRow], seen: list[BenchRow]) -> None:
        self.fn = fn
        self.truth = truth
        self.seen = seen

    def predict(self, row: BenchRow) -> RowPrediction:
        self.seen.append(row)
        return self.fn(self.truth[row.id])


class DoublePredictor:
    """Predicts from the measured truth (looked up by id) through `fn`; records what it is given."""

    def __init__(
        self, rows: list[BenchRow], fn: PredictFn | None = None, refuse: set[tuple[str, ...]] | None = None
    ) -> None:
        self.truth = {r.id: r for r in rows}
        self.fn = fn or oracle
        self.refuse = refuse or set()
        self.fits: dict[tuple[str, ...], list[BenchRow]] = {}
        self.seen: list[BenchRow] = []

    def fit(self, kernel_key: tuple[str, ...], anchor_rows: list[BenchRow]) -> _Kernel:
        self.fits[kernel_key] = list(anchor_rows)
        if kernel_key in self.refuse:
            raise CannotPredict(f"unknown architecture {kernel_key[2]}")
        return _Kernel(self.fn, self.truth, self.seen)


def oracle(m: BenchRow) -> RowPrediction:
    return RowPrediction(m.ttft_ms, m.tpot_ms, m.batch_latency_s, m.throughput_tok_s, anchor="oracle")


def tpot_110(m: BenchRow) -> RowPrediction:
    return RowPrediction(m.ttft_ms, None if m.tpot_ms is None else m.tpot_ms * 1.1)


# ---------------------------------------------------------------------------------------------
# loading


def test_load_rows_reads_layout_defaults_and_measurements(tmp_path: Path) -> None:
    rows = rows_of(
        tmp_path,
        [
            rec(tp=2, pp="", dp="0", moe_tp="", moe_ep="0", rid="a"),
            rec(tp=4, pp=1, dp=2, moe_tp=2, moe_ep=4, rid="b", ttft="", tpot=""),
        ],
    )
    a, b = rows
    assert a.layout == Layout(2, 1, 1, 1, 1)
    assert a.layout.gpus == 2 and a.gpus == 2
    assert b.layout == Layout(4, 1, 2, 2, 4) and b.gpus == 8
    assert a.scenario == "closed" and a.concurrency == 8
    assert a.ttft_ms == 100.0 and b.ttft_ms is None and b.tpot_ms is None
    assert a.kernel_key == ("vllm", "0.10.0", "meta-llama/Llama-3.1-8B", "h100_sxm", "fp16")
    assert a.raw["id"] == "a"


def test_load_rows_id_defaults_to_row_number(tmp_path: Path) -> None:
    cols = [c for c in COLUMNS if c != "id"]
    rows = load_rows(write_csv(tmp_path / "x.csv", [rec(), rec()], cols))
    assert [r.id for r in rows] == ["1", "2"]


def test_load_rows_missing_column_names_it(tmp_path: Path) -> None:
    cols = [c for c in COLUMNS if c != "tp_size"]
    path = write_csv(tmp_path / "nocol.csv", [rec()], cols)
    with pytest.raises(ValueError) as err:
        load_rows(path)
    msg = str(err.value)
    assert "tp_size" in msg and "nocol.csv" in msg and "required" in msg


def test_load_rows_malformed_number_names_row_and_column(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "bad.csv", [rec(), rec(isl="1k")])
    with pytest.raises(ValueError) as err:
        load_rows(path)
    msg = str(err.value)
    assert "bad.csv" in msg and "row 2" in msg and "'isl'" in msg and "positive integer" in msg


def test_load_rows_names_a_short_row_and_a_file_of_another_separator(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "ok.csv", [rec(), rec()])
    lines = path.read_text().splitlines()
    short = tmp_path / "short.csv"
    short.write_text("\n".join([*lines, "vllm,0.1,x"]) + "\n")
    with pytest.raises(ValueError, match=r"row 3 \(line 4\) has 3 cells where the header names \d+ columns"):
        load_rows(short)
    semi = tmp_path / "semi.csv"
    semi.write_text("\n".join(line.replace(",", ";") for line in lines) + "\n")
    with pytest.raises(ValueError, match="one column holding ';': write the file comma-separated"):
        load_rows(semi)


def test_load_rows_bad_scenario_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="closed, offline"):
        rows_of(tmp_path, [rec(scenario="burst")])
    with pytest.raises(ValueError, match="cannot open"):
        load_rows(tmp_path / "absent.csv")


def test_disagg_row_pools_gpus_and_concurrency_from_source(tmp_path: Path) -> None:
    pools = {
        "prefill_num_workers": 2,
        "prefill_tp_size": 4,
        "prefill_attention_dp_size": "",
        "decode_num_workers": 1,
        "decode_tp_size": 8,
        "decode_batch_size": 64,
    }
    cols = COLUMNS + ["silicon_data_source"]
    path = write_csv(
        tmp_path / "d.csv",
        [
            rec(mode="disagg", tp="", pp="", dp="", moe_tp="", moe_ep="", c="", **pools,
                silicon_data_source="db; config_id=1; silicon_concurrency=32; x"),
        ],
        cols,
    )
    (row,) = load_rows(path)
    assert row.prefill is not None and row.decode is not None
    assert row.prefill.workers == 2 and row.prefill.layout.tp == 4 and row.prefill.batch_size is None
    assert row.decode.batch_size == 64
    assert row.gpus == 2 * 4 + 1 * 8
    assert row.concurrency == 32


# ---------------------------------------------------------------------------------------------
# anchors


def test_anchor_fewest_gpus_all_concurrencies_smallest_lengths(tmp_path: Path) -> None:
    rows = rows_of(
        tmp_path,
        [
            rec(tp=2, isl=1024, osl=128, c=1, rid="a1"),
            rec(tp=2, isl=1024, osl=128, c=64, rid="a2"),
            rec(tp=2, isl=128, osl=1024, c=8, rid="a3"),  # same isl + osl as a1/a2, smaller isl
            rec(tp=2, isl=8192, osl=1024, c=8, rid="x1"),
            rec(tp=4, isl=128, osl=128, c=8, rid="x2"),  # shorter, but more GPUs
            rec(tp=8, isl=1024, osl=128, c=8, rid="x3"),
        ],
    )
    anchors = select_anchors(rows)
    assert len(anchors) == 1
    (choice,) = anchors.values()
    assert choice.layout == Layout(2, 1, 1, 1, 1)
    # 128 + 1024 == 1024 + 128: the tie goes to the smaller isl
    assert (choice.isl, choice.osl) == (128, 1024)
    assert ids(choice.rows) == {"a3"}


def test_anchor_every_concurrency_and_scenario_of_the_pair(tmp_path: Path) -> None:
    rows = rows_of(
        tmp_path,
        [
            rec(tp=1, isl=512, osl=128, c=1, rid="a1"),
            rec(tp=1, isl=512, osl=128, c=16, rid="a2"),
            rec(tp=1, isl=512, osl=128, c=256, rid="a3"),
            rec(tp=1, isl=512, osl=128, c=16, rid="a4"),  # duplicate: also an anchor row
            rec(tp=1, isl=512, osl=128, c=4, rid="a5", scenario="offline", ttft="", tpot="",
                batch_latency_s=2.0, throughput_tok_s=256.0),
            rec(tp=1, isl=1024, osl=128, c=16, rid="x1"),
            rec(tp=2, isl=512, osl=128, c=16, rid="x2"),
        ],
    )
    (choice,) = select_anchors(rows).values()
    assert ids(choice.rows) == {"a1", "a2", "a3", "a4", "a5"}


def test_anchor_tie_most_rows_then_smallest_tp_then_tuple(tmp_path: Path) -> None:
    # same GPU count (2): tp2 has 1 row, tp1/dp2 has 2 rows -> most rows wins
    rows = rows_of(
        tmp_path,
        [
            rec(tp=2, rid="t2"),
            rec(tp=1, dp=2, rid="d2a"),
            rec(tp=1, dp=2, isl=2048, rid="d2b"),
        ],
    )
    (choice,) = select_anchors(rows).values()
    assert choice.layout == Layout(1, 1, 2, 1, 1)

    # equal rows -> smallest tp
    rows = rows_of(tmp_path, [rec(tp=2, rid="t2"), rec(tp=1, dp=2, rid="d2")])
    (choice,) = select_anchors(rows).values()
    assert choice.layout == Layout(1, 1, 2, 1, 1)

    # equal rows and tp -> smallest (tp, pp, dp, moe_tp, moe_ep) tuple
    rows = rows_of(
        tmp_path,
        [rec(tp=2, moe_ep=2, rid="e2"), rec(tp=2, moe_tp=2, rid="m2"), rec(tp=2, pp=1, moe_tp=1, rid="p1")],
    )
    (choice,) = select_anchors(rows).values()
    assert choice.layout == Layout(2, 1, 1, 1, 1) and ids(choice.rows) == {"p1"}
    rows = rows_of(tmp_path, [rec(tp=2, moe_ep=2, rid="e2"), rec(tp=2, moe_tp=2, rid="m2")])
    (choice,) = select_anchors(rows).values()
    assert choice.layout == Layout(2, 1, 1, 1, 2)


def test_anchor_empty_and_zero_layout_fields_read_as_one(tmp_path: Path) -> None:
    rows = rows_of(
        tmp_path,
        [rec(tp=1, pp="", dp="0", moe_tp="0", moe_ep="", rid="a"), rec(tp=1, rid="b", c=32)],
    )
    (choice,) = select_anchors(rows).values()
    assert choice.layout == Layout() and ids(choice.rows) == {"a", "b"}


def test_trtllm_and_other_modes_filtered_before_anchors(tmp_path: Path) -> None:
    records = [
        rec(tp=1, backend="trtllm", rid="t1"),
        rec(tp=1, backend="trtllm", mode="disagg", rid="t2"),
        rec(tp=4, rid="v4a"),
        rec(tp=8, rid="v8"),
        rec(tp=1, backend="sglang", mode="agg", rid="s1"),
        rec(tp=2, backend="sglang", mode="agg", rid="s2"),
    ]
    rows = rows_of(tmp_path, records)
    anchors = select_anchors(rows)
    assert {k[0] for k in anchors} == {"vllm", "sglang"}
    assert ids(anchors[rows[2].kernel_key].rows) == {"v4a"}
    assert "trtllm" not in TARGET_ENGINES

    result = run_validation(rows, DoublePredictor(rows))
    counts = result.summary["counts"]
    assert counts["rows"] == 6 and counts["filtered"] == 4 and counts["anchor_rows"] == 2
    assert result.summary["anchor_share"] == pytest.approx(2 / 4)
    assert all(r.row.backend != "trtllm" for r in result.results)


def test_scenario_spellings_of_a_closed_loop(tmp_path: Path) -> None:
    spellings = ("", "closed", "Closed-Loop", "closed_loop", "online", "serving")
    rows = rows_of(tmp_path, [rec(tp=1, rid=f"r{i}", scenario=sc) for i, sc in enumerate(spellings)])
    assert {r.scenario for r in rows} == {"closed"}
    with pytest.raises(ValueError, match="column 'scenario': cannot read 'poisson'"):
        rows_of(tmp_path, [rec(tp=1, rid="x", scenario="poisson")])


def test_engines_and_modes_under_their_other_names_are_scored(tmp_path: Path) -> None:
    """vllm-rocm is vLLM and "aggregated" is agg; the kernel set keys on the backend as written."""
    rows = rows_of(tmp_path, [rec(tp=1, backend="vllm-rocm", mode="aggregated", rid="r1"),
                              rec(tp=2, backend="vllm-rocm", mode="Aggregated", rid="r2"),
                              rec(tp=1, backend="tensorrt-llm", rid="t1")])
    assert [r.mode for r in rows] == ["agg", "agg", "agg"]
    result = run_validation(rows, DoublePredictor(rows))
    assert [r.row.id for r in result.results] == ["r2"] and result.summary["counts"]["filtered"] == 2
    assert next(iter(result.anchors))[0] == "vllm-rocm"


def test_unknown_rule_and_split_key(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, [rec()])
    with pytest.raises(ValueError, match="min-gpus"):
        select_anchors(rows, rule="max-gpus")
    with pytest.raises(ValueError, match="min-gpus"):
        run_validation(rows, DoublePredictor(rows), rule="nearest")
    with pytest.raises(ValueError) as err:
        run_validation(rows, DoublePredictor(rows), split_by=("engine", "datacenter"))
    assert "datacenter" in str(err.value) and "engine" in str(err.value) and "gpu" in str(err.value)


# ---------------------------------------------------------------------------------------------
# the protocol


def _two_kernel_sets() -> list[dict[str, str]]:
    out = []
    for model in ("m/A", "m/B"):
        for tp, speed in ((1, 1.0), (2, 0.6), (4, 0.35)):
            for c in (4, 16):
                for isl in (512, 2048):
                    out.append(
                        rec(tp=tp, isl=isl, osl=256, c=c, model=model,
                            ttft=isl * 0.1 * speed * (1 + c / 32), tpot=(8 + c * 0.25) * speed)
                    )
    return out


def test_fit_receives_only_anchor_rows_and_predict_sees_no_measurement(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, _two_kernel_sets())
    pred = DoublePredictor(rows)
    result = run_validation(rows, pred)
    anchors = select_anchors(rows)
    assert set(pred.fits) == set(anchors)
    anchor_ids = set()
    for key, anchor_rows in pred.fits.items():
        assert ids(anchor_rows) == ids(anchors[key].rows)
        assert all(r.layout == Layout(1) and r.isl == 512 for r in anchor_rows)
        anchor_ids |= ids(anchor_rows)
    # anchors are not predicted and not scored; every other row is predicted once
    assert ids(pred.seen) == ids(rows) - anchor_ids
    assert len(pred.seen) == len(rows) - len(anchor_ids)
    assert {r.row.id for r in result.results} == ids(rows) - anchor_ids
    # measured values are hidden from predict
    assert all(r.ttft_ms is None and r.tpot_ms is None for r in pred.seen)
    assert all("silicon_ttft_ms" not in r.raw and "silicon_tpot_ms" not in r.raw for r in pred.seen)
    # anchor share = anchor rows / filtered rows: 2 kernel sets x 2 concurrencies / 24 rows
    assert result.summary["anchor_share"] == pytest.approx(4 / 24)
    counts = result.summary["counts"]
    assert counts["kernel_sets"] == 2 and counts["anchor_rows"] == 4 and counts["scored_agg"] == 20


def test_oracle_gives_zero_error_and_perfect_ranking(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, _two_kernel_sets())
    s = run_validation(rows, DoublePredictor(rows)).summary
    for metric in ("ttft", "tpot", "throughput_per_gpu"):
        assert s[metric]["median_ape"] == 0.0 and s[metric]["p90_ape"] == 0.0 and s[metric]["n"] == 20
    assert s["batch_latency"] == {"median_ape": None, "p90_ape": None, "n": 0}
    rk = s["ranking"]
    assert rk["pair_accuracy"] == 1.0 and rk["top1"] == 1.0 and rk["regret"] == 0.0
    # groups (model, isl, c): isl 512 has 2 layouts left (tp2, tp4), isl 2048 has 3
    assert rk["groups"] == 8 and rk["pairs"] == 2 * 2 * 1 + 2 * 2 * 3
    assert s["unpredicted"] == {"n": 0, "rows": []}


def test_tpot_110_percent_gives_ten_percent_error(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, _two_kernel_sets())
    s = run_validation(rows, DoublePredictor(rows, fn=tpot_110)).summary
    assert s["tpot"]["median_ape"] == pytest.approx(0.10, abs=1e-12)
    assert s["tpot"]["p90_ape"] == pytest.approx(0.10, abs=1e-12)
    assert s["ttft"]["median_ape"] == 0.0
    assert 0.0 < s["throughput_per_gpu"]["median_ape"] < 0.10


def test_cannot_predict_kernel_set_rows_listed_with_reason(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, _two_kernel_sets())
    key_b = next(r.kernel_key for r in rows if r.model_path == "m/B")
    result = run_validation(rows, DoublePredictor(rows, refuse={key_b}))
    s = result.summary
    assert s["unpredicted"]["n"] == 10
    assert all("unknown architecture m/B" in u["reason"] for u in s["unpredicted"]["rows"])
    b_ids = {r.id for r in rows if r.model_path == "m/B"}
    assert {u["id"] for u in s["unpredicted"]["rows"]} <= b_ids
    assert s["tpot"]["n"] == 10 and s["counts"]["scored_agg"] == 10
    c = s["counts"]
    assert c["filtered"] == c["anchor_rows"] + c["scored_agg"] + c["scored_disagg"] + s["unpredicted"]["n"] + \
        s["unmeasured"]["n"]


def test_a_row_without_any_measured_value_is_predicted_but_counted_apart(tmp_path: Path) -> None:
    """A row whose measured cells are all NaN or empty is not a row the tool failed to predict: it
    is written with its prediction and counted as unmeasured, not unpredicted, and scores nothing."""
    rows = rows_of(tmp_path, [rec(tp=1, c=8, rid="a1"), rec(tp=1, c=16, rid="a2"), rec(tp=2, c=8, rid="b"),
                              rec(tp=2, c=16, ttft="NaN", tpot="", rid="blank")])
    result = run_validation(rows, DoublePredictor(rows))
    s = result.summary
    assert s["unmeasured"] == {"n": 1, "rows": ["blank"]}
    assert s["unpredicted"] == {"n": 0, "rows": []}
    assert s["tpot"]["n"] == s["ttft"]["n"] == 1
    blank = next(r for r in result.results if r.row.id == "blank")
    assert blank.status == "unmeasured" and blank.ape("tpot") is None
    from inferasim.model.predictor import AnchoredPredictor

    real = run_validation(rows, AnchoredPredictor())
    blank = next(r for r in real.results if r.row.id == "blank")
    assert blank.status == "unmeasured" and blank.predicted["tpot"] > 0
    c = s["counts"]
    assert c["filtered"] == c["anchor_rows"] + c["scored_agg"] + c["scored_disagg"] + s["unpredicted"]["n"] + \
        s["unmeasured"]["n"]


def test_an_anchor_with_nothing_to_score_that_cannot_be_fitted_is_listed(tmp_path: Path) -> None:
    # The h900 row is its kernel set's only row, hence its anchor: no scored row would say why its
    # fit fails, and it must not vanish into the anchor share.
    rows = rows_of(tmp_path, [rec(tp=1, rid="a"), rec(tp=2, rid="b"), rec(tp=1, system="h900", rid="lone")])
    lone = next(r.kernel_key for r in rows if r.id == "lone")
    s = run_validation(rows, DoublePredictor(rows, refuse={lone})).summary
    assert [(u["rows"], "unknown architecture" in u["reason"]) for u in s["unusable_anchors"]] == [(["lone"], True)]
    assert s["unpredicted"]["n"] == 0 and s["tpot"]["n"] == 1
    # With the real predictor the unknown GPU is named.
    from inferasim.model.predictor import AnchoredPredictor

    s = run_validation(rows, AnchoredPredictor()).summary
    assert len(s["unusable_anchors"]) == 1 and "h900" in s["unusable_anchors"][0]["reason"]


def test_predict_raising_for_one_row_is_reported(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, [rec(tp=1, rid="a"), rec(tp=2, rid="b"), rec(tp=4, rid="c")])

    def picky(m: BenchRow) -> RowPrediction:
        if m.id == "c":
            raise CannotPredict("tp4 exceeds the KV heads")
        return oracle(m)

    s = run_validation(rows, DoublePredictor(rows, fn=picky)).summary
    assert s["unpredicted"] == {"n": 1, "rows": [{"id": "c", "reason": "tp4 exceeds the KV heads"}]}
    assert s["tpot"]["n"] == 1


def test_disagg_rows_need_an_agg_anchor(tmp_path: Path) -> None:
    pools = {"prefill_num_workers": 1, "prefill_tp_size": 2, "decode_num_workers": 2, "decode_tp_size": 2}
    rows = rows_of(
        tmp_path,
        [
            rec(tp=1, rid="a"),
            rec(tp=2, rid="b"),
            rec(mode="disagg", tp="", c=16, rid="d1", **pools),
            rec(mode="disagg", tp="", c=16, model="m/NoAgg", rid="d2", **pools),
        ],
    )
    result = run_validation(rows, DoublePredictor(rows, fn=tpot_110))
    s = result.summary
    assert s["disagg"]["tpot"]["n"] == 1 and s["disagg"]["tpot"]["median_ape"] == pytest.approx(0.1)
    assert s["tpot"]["n"] == 1  # agg figures exclude the disagg row
    assert [u["id"] for u in s["unpredicted"]["rows"]] == ["d2"]
    assert "no aggregated anchor" in s["unpredicted"]["rows"][0]["reason"]
    assert s["counts"]["scored_disagg"] == 1 and s["counts"]["kernel_sets"] == 1
    d1 = next(r for r in result.results if r.row.id == "d1")
    assert d1.row.gpus == 1 * 2 + 2 * 2
    assert d1.measured["throughput_per_gpu"] == pytest.approx(16 * 1000 / (100 + 127 * 10) * 128 / 6)


def test_a_kernel_set_without_an_agg_anchor_is_priced_measurement_free_where_the_predictor_can(
        tmp_path: Path) -> None:
    """DESIGN section 7: unpredicted only where no architecture is known. A predictor with an
    `unanchored(kernel_key, row)` prices the disaggregated rows of a kernel set that has no
    aggregated row, flagged (reach "no anchor"); where it refuses, the reason names both."""
    pools = {"prefill_num_workers": 1, "prefill_tp_size": 2, "decode_num_workers": 2, "decode_tp_size": 2}
    rows = rows_of(tmp_path, [rec(tp=1, rid="a"), rec(tp=2, rid="b"),
                              rec(mode="disagg", tp="", c=16, model="m/NoAgg", rid="d2", **pools),
                              rec(mode="disagg", tp="", c=16, model="m/Unknown", rid="d3", **pools)])

    class Free(DoublePredictor):
        def unanchored(self, kernel_key: tuple[str, ...], row: BenchRow) -> _Kernel:
            if kernel_key[2] == "m/Unknown":
                raise CannotPredict("unknown architecture m/Unknown")
            return _Kernel(tpot_110, self.truth, self.seen)

    result = run_validation(rows, Free(rows, fn=oracle), split_by=("reach",))
    s = result.summary
    # Scored apart from the disaggregated rows carried from an aggregated anchor.
    assert s["measurement_free"]["tpot"]["n"] == 1 and s["measurement_free"]["tpot"]["median_ape"] == pytest.approx(0.1)
    assert s["disagg"]["tpot"]["n"] == 0 and s["counts"]["scored_measurement_free"] == 1
    (lost,) = s["unpredicted"]["rows"]
    assert lost["id"] == "d3" and "no aggregated anchor" in lost["reason"] and "m/Unknown" in lost["reason"]
    d2 = next(r for r in result.results if r.row.id == "d2")
    assert d2.status == "ok" and d2.reach == "no anchor" and d2.anchor == "measurement-free"
    assert s["splits"]["reach"]["no anchor"]["measurement_free"]["tpot"]["n"] == 1


def test_a_kernel_set_without_an_anchor_is_priced_from_the_population_of_the_files_anchors(
        tmp_path: Path) -> None:
    """As predict and tune price a kernel set the store has no anchor for (model.measurement_free),
    a predictor that learns a population prices the file's anchor-less kernel sets from the
    anchors of the others, not from the GPU family's defaults; an anchored row keeps its anchor."""
    pools = {"prefill_num_workers": 1, "prefill_tp_size": 2, "decode_num_workers": 2, "decode_tp_size": 2}
    rows = rows_of(tmp_path, [rec(tp=1, rid="a"), rec(tp=2, rid="b"),
                              rec(mode="disagg", tp="", c=16, model="m/NoAgg", rid="d2", **pools)])

    class Learns(DoublePredictor):
        learned: dict[tuple[str, ...], _Kernel] = {}

        def learn_population(self, fitted: dict[tuple[str, ...], _Kernel]) -> None:
            self.learned = dict(fitted)

        def population(self, kernel_key: tuple[str, ...], row: BenchRow) -> _Kernel:
            assert kernel_key not in self.learned  # its own rows inform nothing
            return _Kernel(tpot_110, self.truth, self.seen)

        def unanchored(self, kernel_key: tuple[str, ...], row: BenchRow) -> _Kernel:
            raise AssertionError("the GPU family's defaults are not asked where a population is learned")

    predictor = Learns(rows, fn=oracle)
    s = run_validation(rows, predictor).summary
    assert list(predictor.learned) == [rows[0].kernel_key]
    assert s["measurement_free"]["tpot"]["n"] == 1 and s["measurement_free"]["tpot"]["median_ape"] == pytest.approx(0.1)
    assert s["tpot"]["median_ape"] == 0.0  # the anchored kernel set: its own anchor


def test_reach_split_names_what_each_prediction_carries(tmp_path: Path) -> None:
    pools = {"prefill_num_workers": 1, "prefill_tp_size": 2, "decode_num_workers": 2, "decode_tp_size": 2}
    # Per model the anchor is tp1 at 512x256 (smallest isl + osl), at both concurrencies.
    records = _two_kernel_sets() + [
        rec(mode="disagg", tp="", c=16, isl=512, osl=256, model="m/A", rid="d1", **pools),
        rec(mode="disagg", tp="", c=16, model="m/NoAgg", rid="d2", **pools),
    ]
    rows = rows_of(tmp_path, records)
    result = run_validation(rows, DoublePredictor(rows, fn=tpot_110), split_by=("reach",))
    anchors = select_anchors(rows)
    reach = {r.row.id: row_reach(r.row, anchors.get(r.row.kernel_key)) for r in result.results}
    by_id = {r.row.id: r.row for r in result.results}
    for rid, value in reach.items():
        row = by_id[rid]
        if row.mode == "disagg":
            assert value == ("disagg" if row.model_path == "m/A" else "no anchor")
        elif row.layout.tp == 1:
            assert value == "lengths" and row.isl == 2048
        else:
            assert value == ("layout" if row.isl == 512 else "layout+lengths")
    per = result.summary["splits"]["reach"]
    assert set(per) == {"anchor", "lengths", "layout", "layout+lengths", "disagg", "no anchor"}
    assert per["anchor"]["counts"]["anchor_rows"] == 4 and per["anchor"]["tpot"]["n"] == 0
    assert [per[k]["tpot"]["n"] for k in ("lengths", "layout", "layout+lengths")] == [4, 8, 8]
    assert per["disagg"]["disagg"]["tpot"]["n"] == 1 and per["disagg"]["tpot"]["n"] == 0
    assert per["no anchor"]["unpredicted"]["n"] == 1
    assert per["layout"]["tpot"]["median_ape"] == pytest.approx(0.1)
    # predictions.csv carries the same reach per row
    write_outputs(result, tmp_path / "out")
    with (tmp_path / "out" / "predictions.csv").open() as fh:
        assert {ln["id"]: ln["reach"] for ln in csv.DictReader(fh)} == reach


def test_reach_compares_layouts_as_the_predictor_prices_them(tmp_path: Path) -> None:
    """A predictor that prices the tp2 rows as the tp1 deployment carries no layout to them: at the anchor's lengths
    they reach 'anchor', at others 'lengths', and predictions.csv agrees."""

    class SameDeployment(DoublePredictor):
        def deployment(self, row: BenchRow) -> tuple[int, int]:
            return (1 if row.layout.tp <= 2 else row.layout.tp, row.layout.pp)

    rows = rows_of(tmp_path, _two_kernel_sets())
    result = run_validation(rows, SameDeployment(rows), split_by=("reach",))
    for r in result.results:
        if r.row.layout.tp == 2:
            assert r.reach == ("anchor" if r.row.isl == 512 else "lengths")
        elif r.row.layout.tp == 4:
            assert r.reach == ("layout" if r.row.isl == 512 else "layout+lengths")
    per = result.summary["splits"]["reach"]
    assert [per[k]["tpot"]["n"] for k in ("anchor", "lengths", "layout", "layout+lengths")] == [4, 8, 4, 4]
    write_outputs(result, tmp_path / "out")
    with (tmp_path / "out" / "predictions.csv").open() as fh:
        assert {ln["id"]: ln["reach"] for ln in csv.DictReader(fh)} == {r.row.id: r.reach for r in result.results}


def test_moe_fields_that_do_not_cover_the_ranks_are_derived_for_pricing() -> None:
    """Empty MoE fields read as 1 in the row's layout key (DESIGN section 7), but the engines spread
    the experts over every GPU of the attention ranks, and that is what is priced."""
    from inferasim.core.runs import Layout as RowLayout
    from inferasim.model.predictor import to_layout

    assert to_layout(RowLayout(tp=8, moe_tp=1, moe_ep=1)) == to_layout(RowLayout(tp=8, moe_tp=8, moe_ep=1))
    assert to_layout(RowLayout(tp=8, moe_tp=1, moe_ep=1)).moe_width == 8
    assert to_layout(RowLayout(tp=4, dp=2, moe_tp=1, moe_ep=8)).moe_ep == 8  # consistent: as written
    assert to_layout(RowLayout(tp=8, moe_tp=1, moe_ep=4)) == to_layout(RowLayout(tp=8, moe_tp=2, moe_ep=4))
    assert to_layout(RowLayout(tp=4, moe_tp=1, moe_ep=3)).moe_width == 4  # ep 3 cannot split 4 GPUs


def test_throughput_formula_on_hand_computed_row(tmp_path: Path) -> None:
    (row,) = rows_of(tmp_path, [rec(tp=2, dp=2, isl=1000, osl=101, c=32, ttft=200.0, tpot=8.0)])
    # 32 * 1000 / (200 + 100 * 8) * 101 / 4 = 32000 / 1000 * 101 / 4 = 808
    assert throughput_per_gpu(row, 200.0, 8.0) == pytest.approx(808.0)
    m = metric_values(row, row.ttft_ms, row.tpot_ms, row.batch_latency_s, row.throughput_tok_s)
    assert m == {
        "ttft": 200.0,
        "tpot": 8.0,
        "throughput_per_gpu": pytest.approx(808.0),
        "batch_latency": None,
    }


def test_offline_rows_scored_on_batch_latency_and_throughput(tmp_path: Path) -> None:
    def off(tp: int, c: int, lat: float, thr: float, rid: str) -> dict[str, str]:
        return rec(tp=tp, c=c, isl=128, osl=128, scenario="offline", ttft="", tpot="",
                   batch_latency_s=lat, throughput_tok_s=thr, rid=rid)

    records = [off(1, 1, 1.0, 128.0, "a"), off(2, 8, 2.0, 512.0, "b"), off(4, 8, 1.5, 683.0, "c")]
    rows = rows_of(tmp_path, records)
    b = next(r for r in rows if r.id == "b")
    assert metric_values(b, None, None, 2.0, 512.0)["throughput_per_gpu"] == pytest.approx(256.0)

    def slow(m: BenchRow) -> RowPrediction:
        return RowPrediction(None, None, m.batch_latency_s * 1.2, m.throughput_tok_s / 1.2)

    s = run_validation(rows, DoublePredictor(rows, fn=slow)).summary
    assert s["batch_latency"]["n"] == 2 and s["batch_latency"]["median_ape"] == pytest.approx(0.2)
    assert s["throughput_per_gpu"]["n"] == 2
    assert s["throughput_per_gpu"]["median_ape"] == pytest.approx(1 - 1 / 1.2)
    assert s["ttft"]["n"] == 0 and s["tpot"]["n"] == 0
    assert s["ranking"]["pairs"] == 1 and s["ranking"]["pair_accuracy"] == 1.0


def _ranking_rows(tmp_path: Path) -> list[BenchRow]:
    # one group (same kernel set, isl, osl, concurrency), three layouts; throughput per GPU
    # measured: tp1 > dp2 (2 GPUs) > tp2 (2 GPUs)
    return rows_of(
        tmp_path,
        [
            rec(tp=1, isl=128, osl=128, c=8, rid="anchor"),
            rec(tp=1, isl=1024, osl=128, c=8, ttft=100.0, tpot=10.0, rid="tp1"),
            rec(tp=1, dp=2, isl=1024, osl=128, c=8, ttft=100.0, tpot=6.0, rid="dp2"),
            rec(tp=2, isl=1024, osl=128, c=8, ttft=100.0, tpot=7.0, rid="tp2"),
        ],
    )


def test_ranking_misordered_predictor(tmp_path: Path) -> None:
    rows = _ranking_rows(tmp_path)
    truth = {r.id: r for r in rows}
    # reverse the order: the slowest measured gets the fastest prediction
    swapped = {"tp1": "tp2", "tp2": "tp1", "dp2": "dp2"}

    def mis(m: BenchRow) -> RowPrediction:
        # predicted throughput per GPU of `m` = measured throughput per GPU of its swap partner
        src = truth[swapped[m.id]]
        factor = src.gpus / m.gpus
        return RowPrediction(src.ttft_ms * factor, src.tpot_ms * factor)

    s = run_validation(rows, DoublePredictor(rows, fn=mis)).summary
    rk = s["ranking"]
    meas = {r.id: throughput_per_gpu(r, r.ttft_ms, r.tpot_ms) for r in rows}
    assert meas["tp1"] > meas["dp2"] > meas["tp2"]
    assert rk["pairs"] == 3 and rk["groups"] == 1
    assert rk["pair_accuracy"] < 1.0
    assert rk["pair_accuracy"] == pytest.approx(0.0)  # fully reversed order
    assert rk["top1"] == 0.0
    assert rk["regret"] == pytest.approx((meas["tp1"] - meas["tp2"]) / meas["tp1"])
    assert rk["regret"] > 0
    # dp2 and tp2 both use 2 GPUs: one equal-GPU pair, wrongly ordered
    assert rk["pairs_equal_gpus"] == 1 and rk["pair_accuracy_equal_gpus"] == 0.0


def test_ranking_predicted_tie_counts_half(tmp_path: Path) -> None:
    rows = _ranking_rows(tmp_path)

    def flat(m: BenchRow) -> RowPrediction:
        # every row predicted at the same throughput per GPU
        return RowPrediction(100.0 / m.gpus, 10.0 / m.gpus)

    s = run_validation(rows, DoublePredictor(rows, fn=flat)).summary
    rk = s["ranking"]
    assert rk["pairs"] == 3 and rk["pair_accuracy"] == pytest.approx(0.5)
    assert rk["pair_accuracy_equal_gpus"] == pytest.approx(0.5)
    # a tie for the predicted best averages over the tied rows: one of three is the measured best
    assert rk["top1"] == pytest.approx(1 / 3)
    assert rk["regret"] > 0


def test_splits_and_outputs(tmp_path: Path) -> None:
    records = _two_kernel_sets()
    records += [rec(tp=tp, backend="sglang", system="b200_sxm", c=4, isl=isl, rid=f"s{tp}{isl}")
                for tp in (1, 2) for isl in (128, 1024)]
    rows = rows_of(tmp_path, records)
    seen: list[tuple[int, int]] = []
    result = run_validation(
        rows, DoublePredictor(rows, fn=tpot_110), split_by=("engine", "gpu", "model"),
        progress=lambda done, total: seen.append((done, total)),
    )
    s = result.summary
    assert seen[-1][0] == seen[-1][1] == len(result.results)
    assert set(s["splits"]) == {"engine", "gpu", "model"}
    assert set(s["splits"]["engine"]) == {"vllm", "sglang"}
    assert set(s["splits"]["gpu"]) == {"h100_sxm", "b200_sxm"}
    sg = s["splits"]["engine"]["sglang"]
    assert sg["tpot"]["n"] == 3 and sg["counts"]["anchor_rows"] == 1
    assert sg["anchor_share"] == pytest.approx(0.25)
    assert s["splits"]["engine"]["vllm"]["tpot"]["n"] == 20
    for key in ("tpot", "ttft", "throughput_per_gpu", "batch_latency", "ranking", "anchor_share",
                "unpredicted", "counts", "disagg"):
        assert key in s and key in sg
    assert list(s)[:4] == ["tpot", "ttft", "throughput_per_gpu", "batch_latency"]

    out = tmp_path / "out" / "deeper"
    write_outputs(result, out)
    loaded = json.loads((out / "summary.json").read_text())
    assert loaded["tpot"]["median_ape"] == pytest.approx(0.1)
    with (out / "predictions.csv").open() as fh:
        lines = list(csv.DictReader(fh))
    assert len(lines) == len(result.results) == 23
    first = lines[0]
    for col in ("id", "mode", "scenario", "backend", "gpus", "concurrency", "tpot_measured", "tpot_predicted",
                "tpot_lo", "tpot_hi", "extrapolated", "anchor", "reach", "status", "reason"):
        assert col in first
    assert float(first["tpot_predicted"]) == pytest.approx(1.1 * float(first["tpot_measured"]))
    assert {ln["status"] for ln in lines} == {"ok"}


def test_intervals_reach_predictions_csv(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, [rec(tp=1, rid="a"), rec(tp=2, rid="b")])

    def banded(m: BenchRow) -> RowPrediction:
        return RowPrediction(m.ttft_ms, m.tpot_ms, interval={"ttft": (90.0, 110.0), "tpot": (9.0, 11.0)},
                             extrapolated=True, anchor="tp1@1024x128")

    result = run_validation(rows, DoublePredictor(rows, fn=banded))
    (r,) = result.results
    assert r.interval["tpot"] == (9.0, 11.0)
    lo, hi = r.interval["throughput_per_gpu"]
    assert lo < r.predicted["throughput_per_gpu"] < hi
    write_outputs(result, tmp_path)
    with (tmp_path / "predictions.csv").open() as fh:
        (line,) = list(csv.DictReader(fh))
    assert line["extrapolated"] == "true" and line["anchor"] == "tp1@1024x128"
    assert float(line["ttft_lo"]) == 90.0 and float(line["ttft_hi"]) == 110.0


def test_interval_coverage_counts_the_measured_values_inside_the_band(tmp_path: Path) -> None:
    rows = rows_of(tmp_path, [rec(tp=1, rid="a")] + [rec(tp=2, rid=f"b{c}", c=c) for c in (1, 2, 4, 8)])

    def banded(m: BenchRow) -> RowPrediction:
        # TTFT band around the truth for two rows out of four; TPOT band always beside it.
        inside = m.concurrency in (1, 2)
        ttft = (m.ttft_ms * 0.9, m.ttft_ms * 1.1) if inside else (m.ttft_ms * 1.1, m.ttft_ms * 1.3)
        return RowPrediction(m.ttft_ms, m.tpot_ms, interval={"ttft": ttft, "tpot": (m.tpot_ms * 1.01, m.tpot_ms * 2)})

    cov = run_validation(rows, DoublePredictor(rows, fn=banded)).summary["interval_coverage"]
    assert cov["ttft"] == {"share": 0.5, "n": 4}
    assert cov["tpot"] == {"share": 0.0, "n": 4}
    assert cov["batch_latency"] == {"share": None, "n": 0}


# ---------------------------------------------------------------------------------------------
# the real development file


@pytest.mark.skipif(not DEV_FILE.exists(), reason="development data not present")
def test_real_dev_file() -> None:
    start = time.perf_counter()
    rows = load_rows(DEV_FILE)
    assert len(rows) == 4254
    anchors = select_anchors(rows)
    kernel_sets = {r.kernel_key for r in rows if r.mode == "agg" and r.backend in TARGET_ENGINES}
    assert set(anchors) == kernel_sets
    for key, choice in anchors.items():
        assert choice.rows and all(r.kernel_key == key and r.layout == choice.layout for r in choice.rows)
    result = run_validation(rows, DoublePredictor(rows))
    elapsed = time.perf_counter() - start
    s = result.summary
    assert 0 < s["anchor_share"] < 1
    assert s["counts"]["kernel_sets"] == len(anchors)
    assert s["tpot"]["median_ape"] == 0.0
    assert s["ranking"]["pair_accuracy"] == 1.0
    print(f"validation of the dev file with a trivial predictor: {elapsed:.2f} s")  # speed: make bench
