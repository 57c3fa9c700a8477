"""The anchor rules of DESIGN.md section 7: which rows of a kernel set form its anchor (`min-gpus`:
the fewest-GPU layout at its shortest length pair; `harvest`: what `inferasim harvest run` measures by
default), and what an anchor costs in measured GPU time."""

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from inferasim.core.runs import BenchRow, KernelKey, Layout, is_target
from inferasim.harvest.plan import default_plan

ANCHOR_RULES = ("min-gpus", "harvest")
# What `inferasim harvest run` measures by default (harvest.plan.DEFAULT_PLAN_TEXT: 512x128 at 1, 4,
# 16, 64 clients; 4096x64 at 8): the short pair at its client counts, the long prompt at one. The
# harvest anchor rule takes the rows nearest to it, so it follows the plan if the plan changes.
_PLAN = default_plan()
HARVEST_SHORT = (_PLAN[0].isl, _PLAN[0].osl)
HARVEST_CONCURRENCIES = tuple(p.concurrency for p in _PLAN if (p.isl, p.osl) == HARVEST_SHORT)
HARVEST_LONG = max(_PLAN, key=lambda p: p.isl)  # its osl and concurrency are what the long rows are held to
@dataclass(frozen=True)
class AnchorChoice:
    layout: Layout
    isl: int
    osl: int
    rows: list[BenchRow]

    def describe(self) -> str:
        pairs = sorted({(r.isl, r.osl) for r in self.rows} - {(self.isl, self.osl)})
        more = "".join(f"+{i}x{o}" for i, o in pairs)
        return f"{self.layout}@{self.isl}x{self.osl}{more}"


def check_rule(rule: str) -> None:
    if rule not in ANCHOR_RULES:
        raise ValueError(f"unknown anchor rule {rule!r}; accepted: {', '.join(ANCHOR_RULES)}")


def _anchor_layout(rows: list[BenchRow]) -> tuple[Layout, list[BenchRow]]:
    """The fewest-GPU layout (tie: most rows, then smallest tp, then the smallest layout tuple)."""
    by_layout: dict[Layout, list[BenchRow]] = defaultdict(list)
    for r in rows:
        by_layout[r.layout].append(r)
    layout = min(by_layout, key=lambda lo: (lo.gpus, -len(by_layout[lo]), lo.tp, lo.as_tuple()))
    return layout, by_layout[layout]


def _choose_anchor(rows: list[BenchRow]) -> AnchorChoice:
    layout, at_layout = _anchor_layout(rows)
    isl, osl = min({(r.isl, r.osl) for r in at_layout}, key=lambda p: (p[0] + p[1], p[0]))
    chosen = [r for r in at_layout if r.isl == isl and r.osl == osl]
    return AnchorChoice(layout=layout, isl=isl, osl=osl, rows=chosen)


def _log_distance(a: float, b: float) -> float:
    return abs(math.log(a / b))


def _choose_harvest_anchor(rows: list[BenchRow]) -> AnchorChoice:
    """DESIGN section 7, rule `harvest`: at the min-gpus layout, the length pair nearest the harvest
    plan's short pair at up to four concurrencies (each of 1, 4, 16, 64 in turn takes the nearest
    unused one in log scale; tie: the smaller), plus the longest prompt at the concurrency nearest 8
    (its output length nearest the plan's 64) unless already in. Every row at a chosen (length
    pair, concurrency) is anchor, duplicates included, as under min-gpus."""
    layout, at_layout = _anchor_layout(rows)
    s_isl, s_osl = HARVEST_SHORT
    isl, osl = min({(r.isl, r.osl) for r in at_layout},
                   key=lambda p: (_log_distance(p[0], s_isl) + _log_distance(p[1], s_osl), p[0] + p[1], p[0]))
    pair = [r for r in at_layout if r.isl == isl and r.osl == osl]
    left = sorted({r.concurrency for r in pair})
    taken: list[int] = []
    for want in HARVEST_CONCURRENCIES:
        if not left:
            break
        pick = min(left, key=lambda c: (_log_distance(c, want), c))
        taken.append(pick)
        left.remove(pick)
    chosen = [r for r in pair if r.concurrency in taken]
    long_isl = max(r.isl for r in at_layout)
    longest = [r for r in at_layout if r.isl == long_isl]
    conc = min({r.concurrency for r in longest},
               key=lambda c: (_log_distance(c, HARVEST_LONG.concurrency), c))
    at_conc = [r for r in longest if r.concurrency == conc]
    long_osl = min({r.osl for r in at_conc}, key=lambda o: (_log_distance(o, HARVEST_LONG.osl), o))
    ids = {id(r) for r in chosen}
    chosen += [r for r in at_conc if r.osl == long_osl and id(r) not in ids]
    return AnchorChoice(layout=layout, isl=isl, osl=osl, rows=chosen)


def select_anchors(rows: Sequence[BenchRow], rule: str = "min-gpus") -> dict[KernelKey, AnchorChoice]:
    """One anchor per kernel set, formed among the filtered agg rows."""
    check_rule(rule)
    by_kernel: dict[KernelKey, list[BenchRow]] = defaultdict(list)
    for r in rows:
        if is_target(r) and r.mode == "agg":
            by_kernel[r.kernel_key].append(r)
    choose = _choose_harvest_anchor if rule == "harvest" else _choose_anchor
    return {key: choose(members) for key, members in by_kernel.items()}


def gpu_seconds(row: BenchRow) -> float | None:
    """GPU time a row's measurement cost (DESIGN section 7, anchor cost): GPUs x batch latency for an
    offline batch, GPUs x one request cycle (TTFT + (osl - 1) x TPOT) for a closed loop; None
    without the measurement."""
    if row.scenario == "offline":
        return row.gpus * row.batch_latency_s if row.batch_latency_s else None
    if row.ttft_ms is None or row.tpot_ms is None:
        return None
    return row.gpus * (row.ttft_ms + (row.osl - 1) * row.tpot_ms) / 1000.0


def anchor_gpu_time_share(rows: Sequence[BenchRow], anchor_ids: set[int]) -> float | None:
    """The anchors' share of the measured GPU time of `rows` (rows without a measured cost left out):
    how the InferaSim paper states its 4.5% of GPU-hours."""
    cost = [(id(r) in anchor_ids, gpu_seconds(r)) for r in rows]
    total = sum(c for _, c in cost if c)
    return sum(c for a, c in cost if a and c) / total if total else None
