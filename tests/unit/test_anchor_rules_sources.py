"""The `harvest` anchor rule, the anchors' share of measured GPU time, and the named source rules
that read one public file's rows as their engine ran them (inferasim/sources.py)."""

from pathlib import Path

import pytest

from inferasim.anchor_rules import anchor_gpu_time_share, gpu_seconds, select_anchors
from inferasim.catalog.engines import ROCM_FORK_TAG
from inferasim.core.runs import Layout, load_rows
from inferasim.sources import ARGONNE_MI250_PACKAGES, SOURCE_RULES, read_as_run
from tests.unit.test_validate import rec, rows_of, write_csv

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ARGONNE = DATA / "argonne-offline" / "vllm_offline_dev.csv"


def _sweep(tp: int, isl: int, osl: int, concs: list[int]) -> list[dict[str, str]]:
    return [rec(tp, isl=isl, osl=osl, c=c, rid=f"t{tp}-{isl}x{osl}-c{c}") for c in concs]


def test_harvest_rule_takes_the_pair_nearest_512x128_at_four_concurrencies_and_the_long_prompt(tmp_path: Path) -> None:
    records = (_sweep(1, 1024, 1024, [1, 2, 4, 8, 16, 32, 64, 128])
               + _sweep(1, 512, 256, [2, 3, 5, 17, 50, 100])
               + _sweep(1, 8192, 1024, [1, 4, 16, 32])
               + _sweep(1, 8192, 64, [2, 64])
               + _sweep(2, 512, 128, [1, 4, 16, 64]))  # more GPUs: never the anchor layout
    rows = rows_of(tmp_path, records)
    harvest = next(iter(select_anchors(rows, "harvest").values()))
    # |ln(512/512)| + |ln(256/128)| = 0.69 beats 1024x1024's 0.69 + 2.08.
    assert (harvest.isl, harvest.osl) == (512, 256)
    # 1 -> 2 (nearest in log), 4 -> 5 (ln 5/4 < ln 4/3), 16 -> 17, 64 -> 50 (ln 64/50 < ln 100/64).
    short = sorted(r.concurrency for r in harvest.rows if r.isl == 512)
    assert short == [2, 5, 17, 50]
    # The longest prompt at the concurrency nearest 8 (4 and 16 tie in log: the smaller), its
    # output length nearest 64 among those at that concurrency.
    long = [(r.isl, r.osl, r.concurrency) for r in harvest.rows if r.isl == 8192]
    assert long == [(8192, 1024, 4)]
    assert all(r.layout.tp == 1 for r in harvest.rows)
    # The min-gpus rule keeps its own choice: the shortest pair, every concurrency.
    mingpu = next(iter(select_anchors(rows, "min-gpus").values()))
    assert (mingpu.isl, mingpu.osl) == (512, 256) and len(mingpu.rows) == 6
    assert "+8192x1024" in harvest.describe()


def test_unknown_anchor_rule_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="min-gpus, harvest"):
        select_anchors(rows_of(tmp_path, _sweep(1, 512, 128, [1])), "everything")


def test_gpu_time_share_weights_rows_by_gpus_and_measured_duration(tmp_path: Path) -> None:
    records = [
        rec(1, isl=1000, osl=101, c=4, ttft=100.0, tpot=10.0, rid="a"),  # 1 GPU x 1.1 s
        rec(4, isl=1000, osl=101, c=4, ttft=200.0, tpot=8.0, rid="b"),  # 4 GPUs x 1.0 s
        rec(2, isl=1000, osl=11, c=1, scenario="offline", batch_latency_s=3.0, throughput_tok_s=1, ttft="",
            tpot="", rid="c"),  # 2 GPUs x 3 s
        rec(2, isl=1000, osl=11, c=1, ttft="", tpot="", rid="d"),  # nothing measured: no cost
    ]
    rows = {r.id: r for r in rows_of(tmp_path, records)}
    assert gpu_seconds(rows["a"]) == pytest.approx(1.1)
    assert gpu_seconds(rows["b"]) == pytest.approx(4.0)
    assert gpu_seconds(rows["c"]) == pytest.approx(6.0)
    assert gpu_seconds(rows["d"]) is None
    share = anchor_gpu_time_share(list(rows.values()), {id(rows["a"])})
    assert share == pytest.approx(1.1 / (1.1 + 4.0 + 6.0))
    assert anchor_gpu_time_share([rows["d"]], set()) is None


def test_argonne_mi250_rows_read_per_gcd(tmp_path: Path) -> None:
    records = [
        rec(1, rid="argonne_1", system="mi250", model="mistralai/Mixtral-8x7B-v0.1"),
        rec(4, rid="argonne_2", system="mi250", moe_tp=4),
        rec(1, rid="argonne_3", system="mi300x"),  # another GPU: as written
        rec(1, rid="other_4", system="mi250"),  # another source: as written
    ]
    rows = {r.id: r for r in read_as_run(rows_of(tmp_path, records))}
    assert rows["argonne_1"].layout.tp == 2 and rows["argonne_1"].gpus == 2
    assert (rows["argonne_2"].layout.tp, rows["argonne_2"].layout.moe_tp) == (8, 8)
    assert rows["argonne_3"].layout.tp == 1 and rows["other_4"].layout.tp == 1
    # Nothing the file gave is lost: the cells are kept as written.
    assert rows["argonne_1"].raw["tp_size"] == "1"
    applied: dict[str, int] = {}
    read_as_run(rows_of(tmp_path, records), applied=applied)
    assert applied == {ARGONNE_MI250_PACKAGES.name: 2}


def test_rocm_dev_docker_rows_are_fork_builds(tmp_path: Path) -> None:
    rows = read_as_run(rows_of(tmp_path, [rec(8, rid="rocmdd_1", system="mi300x", version="0.6.6")]))
    assert rows[0].backend_version == "0.6.6" + ROCM_FORK_TAG
    again = read_as_run(rows)  # a rule reads a row once
    assert again[0].backend_version == "0.6.6" + ROCM_FORK_TAG


@pytest.mark.skipif(not ARGONNE.exists(), reason="shared/data not beside the checkout")
def test_argonne_file_shows_what_the_mi250_rule_reads() -> None:
    """The evidence the rule stands on: Mixtral-8x7B fp16 (93 GB of weights) at 'tp 1' and the 70B
    models at 'tp 2' on MI250, and no MI250 row beyond 'tp 4' (an 8-GCD node)."""
    rows = [r for r in load_rows(ARGONNE) if r.system == "mi250"]
    assert any("Mixtral" in r.model_path and r.layout.tp == 1 for r in rows)
    assert any("70b" in r.model_path.lower() and r.layout.tp == 2 for r in rows)
    assert max(r.layout.tp for r in rows) == 4
    assert all(r.layout.tp <= 8 for r in read_as_run(rows))
    assert len(SOURCE_RULES) == len({r.name for r in SOURCE_RULES})


def test_validate_cli_reads_source_rules_unless_as_written(tmp_path: Path) -> None:
    from inferasim.cli import main

    records = ([rec(1, rid=f"argonne_{c}", system="mi250", c=c, isl=128, osl=128, scenario="offline",
                    batch_latency_s=1.0 + c / 16, throughput_tok_s=128 * c / (1.0 + c / 16), ttft="", tpot="")
                for c in (1, 16, 32, 64)]
               + [rec(2, rid=f"argonne_t2_{c}", system="mi250", c=c, isl=128, osl=128, scenario="offline",
                      batch_latency_s=0.8 + c / 24, throughput_tok_s=128 * c / (0.8 + c / 24), ttft="", tpot="")
                  for c in (1, 16)])
    data = write_csv(tmp_path / "mi250.csv", records)
    import json

    for flag, tps in (([], {"2", "4"}), (["--as-written"], {"1", "2"})):
        out = tmp_path / ("raw" if flag else "read")
        assert main(["validate", str(data), "--out", str(out), "-o", "json", *flag]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert bool(summary["source_rules"]) == (not flag)
        import csv

        written = {r["tp"] for r in csv.DictReader((out / "predictions.csv").open())}
        assert written <= tps


DEV_FILE = DATA / "aic-silicon" / "silicon_dev.csv"


@pytest.mark.skipif(not DEV_FILE.exists(), reason="development data not present")
def test_aic_silicon_squared_widths_read_as_the_deployment_that_ran() -> None:
    """vLLM tp4 + EP written as tp4 dp4 ep16 (batch per DP rank) reads as tp4 ep4 on 4 GPUs with
    the clients that ran; SGLang --tp 4 --ep 4 written as tp16 moe_tp4 moe_ep4 reads as tp4 ep4.
    Each then has the layout of a plainly written row of its kernel set; --as-written keeps them."""
    from inferasim.core.runs import recorded_clients
    from inferasim.sources import AIC_SILICON_SQUARED_WIDTH

    raw = {r.id: r for r in load_rows(DEV_FILE)}
    applied: dict[str, int] = {}
    read = {r.id: r for r in read_as_run(list(raw.values()), applied=applied)}
    assert applied[AIC_SILICON_SQUARED_WIDTH.name] == 242
    vllm_id = "kimik2_5_b200_vllm_fp4_agg_1024x1024_c32_cfg635"
    assert raw[vllm_id].layout == Layout(4, 1, 4, 1, 16) and raw[vllm_id].gpus == 16
    assert read[vllm_id].layout == Layout(4, 1, 1, 1, 4) and read[vllm_id].gpus == 4
    assert read[vllm_id].concurrency == (recorded_clients(raw[vllm_id]) or 32)
    plain = [r for r in read.values() if r.kernel_key == read[vllm_id].kernel_key and r.id != vllm_id
             and r.layout == read[vllm_id].layout and not AIC_SILICON_SQUARED_WIDTH.applies(raw[r.id])]
    assert plain, "a plainly written row of the same deployment"
    sglang_id = "dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg202"
    assert raw[sglang_id].layout == Layout(16, 1, 1, 4, 4)
    assert read[sglang_id].layout == Layout(4, 1, 1, 1, 4) and read[sglang_id].concurrency == raw[sglang_id].concurrency
    # A plain SGLang --tp 4 --ep 2 (within a node) is not squared: it stays as written.
    small = next(r for r in raw.values() if r.backend == "sglang" and r.layout == Layout(4, 1, 1, 2, 2))
    assert read[small.id].layout == small.layout
    # Every cell the file gave is kept.
    assert read[vllm_id].raw == raw[vllm_id].raw


def test_a_disagg_row_without_its_workers_reads_the_pools_of_its_recorded_twin(tmp_path: Path) -> None:
    """Two records of one disaggregated run (TTFT and TPOT to the last digit, one architecture
    under two names): the one that leaves the workers empty reads the recorded one's pools."""
    common = {"backend": "sglang", "version": "0.5.8", "system": "gb200", "precision": "fp8", "mode": "disagg",
              "tp": "", "dp": "", "moe_tp": "", "moe_ep": "", "c": "", "isl": 1024, "osl": 1024}
    recorded = {"prefill_num_workers": 2, "prefill_tp_size": 1, "prefill_attention_dp_size": 8,
                "prefill_moe_ep_size": 8, "decode_num_workers": 1, "decode_batch_size": 128,
                "decode_tp_size": 1, "decode_attention_dp_size": 32, "decode_moe_ep_size": 32}
    lossy = {"prefill_tp_size": 8, "prefill_moe_ep_size": 8, "decode_tp_size": 32, "decode_moe_tp_size": 4,
             "decode_moe_ep_size": 8}
    src = {"silicon_data_source": "silicon_concurrency=4096"}
    records = [
        rec(rid="db", model="deepseek-ai/DeepSeek-V3", ttft=2730.5, tpot=26.61, **common, **recorded, **src),
        rec(rid="csv", model="deepseek-ai/DeepSeek-R1", ttft=2730.5, tpot=26.61, **common, **lossy, **src),
        rec(rid="other", model="deepseek-ai/DeepSeek-R1", ttft=2730.6, tpot=26.61, **common, **lossy, **src),
    ]
    rows = {r.id: r for r in read_as_run(rows_of(tmp_path, records))}
    assert rows["csv"].prefill == rows["db"].prefill and rows["csv"].decode == rows["db"].decode
    assert rows["csv"].prefill.workers == 2 and rows["csv"].decode.layout.dp == 32
    assert rows["csv"].gpus == 2 * 8 + 32 and rows["csv"].model_path == "deepseek-ai/DeepSeek-R1"
    assert rows["csv"].raw["decode_tp_size"] == "32"  # the cells stay as written
    # Another measurement (TTFT differs) has no twin: as written.
    assert rows["other"].decode.layout.tp == 32 and rows["other"].prefill.workers == 1
    applied: dict[str, int] = {}
    again = read_as_run(list(rows.values()), applied=applied)  # a rule reads a row once
    assert applied == {} and again[1].prefill == rows["db"].prefill
