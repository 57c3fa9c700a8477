"""The store keeps a passive anchor beside a harvested one of the same kernels and layout, prefers
the harvested one, and shows both with their fit reports."""

from __future__ import annotations

from pathlib import Path

from inferasim.core.layout import Layout
from inferasim.model.anchor_store import AnchorStore
from inferasim.model.anchors import Anchor, BenchPoint, FitReport, KernelSet, LayoutModel, Provenance

KS = KernelSet(engine="vllm", engine_version="0.10.1", model="meta-llama/Llama-3.1-8B", gpu="H100", precision="")


def anchor(method: str, layout: Layout, n_points: int, rms: float) -> Anchor:
    return Anchor(
        kernel_set=KS, layout=LayoutModel.from_layout(layout),
        points=[BenchPoint(isl=512, osl=64, concurrency=2 ** i, tpot_ms=8.0 + i, row_id=f"{method}{i}")
                for i in range(n_points)],
        params={"t_fixed": 0.005},
        fit=FitReport(n_points=n_points, rms_log_error=rms, max_abs_log_error=2 * rms),
        provenance=Provenance(method=method, source=f"test {method}"))  # type: ignore[arg-type]


def test_passive_is_kept_beside_harvested_and_never_preferred(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    harvested = anchor("harvest", Layout(tp=2), 4, 0.03)
    # More points, the very layout asked for, and saved later: every other rule favours it.
    passive = anchor("passive", Layout(tp=1), 12, 0.08)
    p_harvest = store.save(harvested)
    p_passive = store.save(passive)
    assert p_harvest != p_passive and p_passive.name.endswith("-passive.json")
    reread = AnchorStore(tmp_path)
    assert len(reread) == 2
    assert reread.find(KS, Layout(tp=1)) == harvested
    assert reread.find(KS) == harvested
    alts = reread.alternatives(KS, Layout(tp=1))
    assert [a.provenance.method for _, a in alts] == ["harvest", "passive"]
    assert [p.name for p, _ in alts] == [p_harvest.name, p_passive.name]
    assert [a.fit.rms_log_error for _, a in alts if a.fit] == [0.03, 0.08]  # residuals of both


def test_passive_is_used_when_nothing_else_was_measured(tmp_path: Path) -> None:
    store = AnchorStore(tmp_path)
    passive = anchor("passive", Layout(tp=1), 6, 0.05)
    store.save(passive)
    assert store.find(KS, Layout(tp=4)) == passive
    # a newer passive fit of the same deployment replaces the older file
    newer = anchor("passive", Layout(tp=1), 7, 0.04)
    store.save(newer)
    assert AnchorStore(tmp_path).all() == [newer]
