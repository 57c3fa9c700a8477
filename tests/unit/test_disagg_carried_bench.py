"""benchmarks/disagg_carried.py: which release's anchor carries a disaggregated kernel set, and which
rows it reports apart (one recorded configuration measured at two TPOTs)."""

from __future__ import annotations

import sys
from pathlib import Path

from inferasim.anchor_rules import select_anchors
from inferasim.core.runs import BenchRow, Layout

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.disagg_carried import ambiguous_rows, neighbour_anchor  # noqa: E402


def _row(version: str, mode: str = "agg", tpot: float = 10.0, conc: int = 4, rid: str = "r") -> BenchRow:
    return BenchRow(id=rid, backend="sglang", backend_version=version, model_path="deepseek-ai/DeepSeek-V3",
                    system="b200_sxm", precision="fp8", mode=mode, scenario="closed", isl=1024, osl=1024,
                    concurrency=conc, layout=Layout(tp=8, moe_ep=8), prefill=None, decode=None, ttft_ms=200.0,
                    tpot_ms=tpot, batch_latency_s=None, throughput_tok_s=None)


def test_the_nearest_named_release_carries_and_an_unnamed_build_comes_last() -> None:
    anchors = select_anchors([_row("0.5.6"), _row("0.5.9"), _row(""), _row("0.5.8.post1", "disagg")])
    target = _row("0.5.8.post1", "disagg")
    assert neighbour_anchor(target, anchors).rows[0].backend_version == "0.5.9"
    only_unnamed = select_anchors([_row("")])
    assert neighbour_anchor(target, only_unnamed).rows[0].backend_version == ""
    # Its own release is never borrowed: that is validate's anchor, not a neighbour.
    assert neighbour_anchor(target, select_anchors([_row("0.5.8.post1")])) is None


def test_rows_of_one_recorded_configuration_two_tpots_apart_are_ambiguous() -> None:
    fast, slow, near = (_row("0.5.8", "disagg", t, rid=i) for t, i in ((4.7, "a"), (9.8, "b"), (5.0, "c")))
    other = _row("0.5.8", "disagg", 9.8, conc=8, rid="d")  # another concurrency: its own configuration
    flagged = ambiguous_rows([fast, slow, near, other])
    assert flagged == {id(fast), id(slow), id(near)}
    assert ambiguous_rows([fast, near]) == set()  # 6% apart: measurement spread, not a hidden setting
