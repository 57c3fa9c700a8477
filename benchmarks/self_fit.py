"""How well each dev anchor fits its own rows (issue 26: every anchor within 8% median TTFT).

    python benchmarks/self_fit.py

For every kernel set of the dev file, the anchor the min-gpus rule selects is fitted on its rows
and predicts the same rows back: the median absolute TTFT and TPOT error per anchor, then per
engine how many anchors are within 8% TTFT, the median anchor and the worst ones. An anchor that
misses its own rows cannot carry them anywhere: the fit, not a transfer law, is what is off there.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from inferasim.anchor_rules import select_anchors  # noqa: E402
from inferasim.core.runs import KernelKey, filter_rows, load_rows  # noqa: E402
from inferasim.errors import InferasimError  # noqa: E402
from inferasim.model.predictor import fit_anchor_rows  # noqa: E402
from inferasim.sources import read_as_run  # noqa: E402
from inferasim.validate import RowResult, metric_values  # noqa: E402

DEV = REPO.parent / "shared" / "data" / "aic-silicon" / "silicon_dev.csv"
TARGET = 0.08  # median TTFT error of an anchor on its own rows


@dataclass(frozen=True)
class AnchorFit:
    """One anchor predicting its own rows."""

    engine: str
    anchor: str
    kernel_key: KernelKey
    ttft: float  # median TTFT error over its rows
    tpot: float  # median TPOT error (NaN without a measured TPOT)
    rows: int
    # Per client count, the median log(measured / fitted) TTFT: what the fit leaves unexplained.
    ttft_residual: dict[int, float] = field(default_factory=dict)


def self_fit(path: Path) -> dict[str, list[AnchorFit]]:
    """Per engine, every anchor that fits, predicting its own rows."""
    rows = filter_rows(read_as_run(load_rows(path)))
    out: dict[str, list[AnchorFit]] = defaultdict(list)
    for choice in select_anchors(rows).values():
        try:
            fitted = fit_anchor_rows(choice.rows)
        except InferasimError:
            continue  # validate reports these (an anchor at a layout the engine cannot start)
        ttft, tpot = [], []
        unexplained: dict[int, list[float]] = defaultdict(list)
        for r in choice.rows:
            p = fitted.predict(r)
            # Scored as validate scores a row (its metric values and error).
            scored = RowResult(r, "ok", measured=metric_values(r, r.ttft_ms, r.tpot_ms, None, None),
                               predicted=metric_values(r, p.ttft_ms, p.tpot_ms, None, None))
            for errs, name in ((ttft, "ttft"), (tpot, "tpot")):
                e = scored.ape(name)
                if e is not None:
                    errs.append(e)
            if scored.ape("ttft") is not None:
                unexplained[r.concurrency].append(math.log(r.ttft_ms / p.ttft_ms))  # type: ignore[operator]
        if ttft:
            out[fitted.engine].append(AnchorFit(
                engine=fitted.engine, anchor=fitted.anchor_id, kernel_key=choice.rows[0].kernel_key,
                ttft=float(np.median(ttft)), tpot=float(np.median(tpot)) if tpot else float("nan"),
                rows=len(choice.rows), ttft_residual={c: float(np.median(v)) for c, v in unexplained.items()}))
    return out


def main() -> int:
    if not DEV.exists():
        print(f"skipped self-fit: {DEV} not present")
        return 0
    per = self_fit(DEV)
    print(f"Anchor self-fit on {DEV.name} (each anchor predicting its own rows; target: median TTFT <= "
          f"{TARGET:.0%} per anchor)")
    for engine, fits in sorted(per.items()):
        ttfts = np.array([f.ttft for f in fits])
        within = int((ttfts <= TARGET).sum())
        print(f"  {engine}: {len(fits)} anchors, {within} within {TARGET:.0%} TTFT ({within / len(fits):.0%}); "
              f"median anchor TTFT {np.median(ttfts):.1%}, TPOT {np.nanmedian([f.tpot for f in fits]):.1%}")
        for f in sorted(fits, key=lambda f: -f.ttft)[:3]:
            if f.ttft > TARGET:
                print(f"    worst: {f.anchor} ({f.rows} rows): TTFT {f.ttft:.1%}, TPOT {f.tpot:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
