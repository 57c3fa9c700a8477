"""The configuration space: every deployment worth scoring, and why the others were pruned.

Axes: engine x precision x (tp, pp, attention dp, expert parallel) x scheduler limits
(max_num_seqs, max_num_batched_tokens, chunked prefill) x disaggregation (prefill and decode pools),
within the GPU budget and the node size. Replicas are not an axis: the per-GPU throughput of a
layout does not depend on how many copies run; the search sizes the replica count to the workload
afterwards. Memory feasibility prunes (by each engine's own KV rule), and every pruned candidate keeps
its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from inferasim.catalog.checkpoints import precision_error
from inferasim.catalog.engines import engine_gpu_error
from inferasim.catalog.gpus import GPU
from inferasim.catalog.models import ModelSpec
from inferasim.core.engine_args import multinode_problem
from inferasim.core.layout import Layout
from inferasim.core.spec import SearchSpace
from inferasim.model.memory import plan_memory


@dataclass(frozen=True)
class Disagg:
    """Prefill/decode pools: workers x layout each."""

    prefill_workers: int
    prefill: Layout
    decode_workers: int
    decode: Layout

    @property
    def gpus(self) -> int:
        return self.prefill_workers * self.prefill.gpus + self.decode_workers * self.decode.gpus

    def label(self) -> str:
        return f"P{self.prefill_workers}x{self.prefill.label()}+D{self.decode_workers}x{self.decode.label()}"


@dataclass(frozen=True)
class Candidate:
    engine: str
    precision: str
    layout: Layout  # of one replica (decode pool layout when disaggregated)
    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool = True
    spec_method: str = "none"
    disagg: Disagg | None = None

    @property
    def gpus_per_replica(self) -> int:
        return self.disagg.gpus if self.disagg else self.layout.gpus

    @property
    def shape(self) -> str:
        """What makes two candidates differ 'in the way that matters' (engine, layout, disagg)."""
        return f"{self.engine}|{self.precision}|{self.disagg.label() if self.disagg else self.layout.label()}"

    def label(self) -> str:
        base = self.disagg.label() if self.disagg else self.layout.label()
        cp = "" if self.chunked_prefill else " no-chunk"
        return f"{self.engine} {self.precision} {base} seqs{self.max_num_seqs} tok{self.max_batched_tokens}{cp}"


@dataclass
class Space:
    candidates: list[Candidate] = field(default_factory=list)
    pruned: list[tuple[str, str]] = field(default_factory=list)  # (what, why)
    # The prunings that drop a whole engine or engine x precision (also in `pruned`): worth telling
    # a person, unlike the many layouts that do not fit.
    excluded: list[tuple[str, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.candidates) + len(self.pruned)


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def layouts(model: ModelSpec, gpu: GPU, max_gpus: int, gpus_per_node: int, space: SearchSpace) -> Iterator[Layout]:
    """Layouts of one replica within the budget: tp up to a node, pp across nodes, attention dp and
    expert parallelism for MoE models."""
    node = min(gpus_per_node, max_gpus)
    for tp in _powers_of_two(node):
        pps = [p for p in _powers_of_two(max(max_gpus // tp, 1)) if p <= 4] if space.pipeline_parallel else [1]
        for pp in pps:
            dps = [1]
            if model.is_moe and space.attention_dp:
                dps = [d for d in _powers_of_two(node // tp)]
            for dp in dps:
                if tp * pp * dp > max_gpus:
                    continue
                width = tp * dp
                eps = [1]
                if model.is_moe and space.expert_parallel and width > 1:
                    eps = [1, width] if dp == 1 else [width]  # attention dp pairs with expert parallelism
                for ep in eps:
                    yield Layout(tp=tp, pp=pp, dp=dp, moe_ep=ep)


def build_space(model: ModelSpec, gpu: GPU, engines: list[str], precisions: list[str], max_gpus: int,
                gpus_per_node: int, space: SearchSpace, model_id: str | None = None) -> Space:
    """`model_id`: the model as the user named it (the checkpoint a manifest serves, whose weight
    format decides which precisions the engines can run; default: the catalog's name)."""
    out = Space()
    feasible_layouts: dict[tuple[str, str], list[Layout]] = {}
    for engine in engines:
        why = engine_gpu_error(engine, gpu.vendor, gpu.name)
        if why:
            out.pruned.append((f"{engine} on {gpu.name}", why))
            out.excluded.append(out.pruned[-1])
            continue
        for precision in precisions:
            # A precision the engine would not run with this checkpoint (an FP4 price for an FP8
            # checkpoint) could be recommended but not deployed as priced: pruned, saying why.
            unservable = precision_error(engine, model_id or model.name, precision)
            if unservable:
                out.pruned.append((f"{engine} {precision}", unservable))
                out.excluded.append(out.pruned[-1])
                continue
            good: list[Layout] = []
            for lay in layouts(model, gpu, max_gpus, gpus_per_node, space):
                # What tune recommends, render writes and the engine starts: a replica beyond one
                # node only as a LeaderWorkerSet the engine can run.
                cannot = multinode_problem(engine, lay, gpus_per_node)
                if cannot:
                    out.pruned.append((f"{engine} {precision} {lay.label()}", cannot))
                    continue
                plan = plan_memory(model, gpu, lay, engine=engine, precision=precision)
                if not plan.feasible:
                    out.pruned.append((f"{engine} {precision} {lay.label()}", "; ".join(plan.reasons)))
                    continue
                if plan.kv_tokens < 4096:
                    out.pruned.append((f"{engine} {precision} {lay.label()}",
                                       f"KV pool holds only {plan.kv_tokens} tokens"))
                    continue
                good.append(lay)
            feasible_layouts[(engine, precision)] = good
            for lay in good:
                for mns in space.max_num_seqs:
                    for mbt in space.max_num_batched_tokens:
                        if mbt < mns and engine != "sglang":
                            # vLLM and ATOM refuse a step budget below one token per running sequence.
                            out.pruned.append((f"{engine} {precision} {lay.label()} seqs{mns} tok{mbt}",
                                               "max_num_batched_tokens below max_num_seqs: the engine refuses it"))
                            continue
                        for chunked in space.chunked_prefill:
                            if not chunked and engine != "vllm":
                                continue  # SGLang and ATOM chunk prefills by design; the switch is vLLM's
                            out.candidates.append(Candidate(engine, precision, lay, mns, mbt, chunked))
            if space.disaggregation:
                for d in disagg_shapes(good, max_gpus):
                    for mns in space.max_num_seqs:
                        out.candidates.append(Candidate(engine, precision, d.decode, mns,
                                                        max(space.max_num_batched_tokens), True, disagg=d))
    return out


def disagg_shapes(layouts_ok: list[Layout], max_gpus: int, max_workers: int = 4) -> Iterator[Disagg]:
    """Prefill and decode pools from the feasible single-pool layouts, within the budget."""
    small = sorted({lay for lay in layouts_ok if lay.pp == 1}, key=lambda lay: (lay.gpus, lay.tp))
    for p_lay in small:
        for d_lay in small:
            for pw in range(1, max_workers + 1):
                for dw in range(1, max_workers + 1):
                    d = Disagg(pw, p_lay, dw, d_lay)
                    if d.gpus <= max_gpus:
                        yield d
