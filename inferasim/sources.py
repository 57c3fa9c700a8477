"""How particular public data files write their rows, and the rules that read them as the engine ran.

A measured file sometimes counts things its own way. Such a reading belongs to the loader of that
file, named for the source and switchable off (`inferasim validate --as-written`), never to the
predictor: predict, tune and the operator price a layout exactly as a user writes it.

Each rule says which rows it reads (by the source's own row ids), what it changes and the evidence
in the rows themselves. A rule never drops a row and keeps every cell the file gave (`BenchRow.raw`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from inferasim.catalog.engines import ROCM_FORK_TAG, UnknownEngineError, normalize_engine
from inferasim.catalog.gpus import UnknownGPUError, get_gpu
from inferasim.catalog.models import ModelConfigError, UnknownModelError, get_model
from inferasim.core.runs import BenchRow, Layout, recorded_clients


@dataclass(frozen=True)
class SourceRule:
    """One source's way of writing a row, and how it reads as the engine ran it."""

    name: str
    applies: Callable[[BenchRow], bool]
    read: Callable[[BenchRow], BenchRow]
    why: str
    # A rule whose evidence is other rows of the same file: given the file's rows, the rule bound
    # to them (read_as_run binds it before reading any row).
    bind: Callable[[Sequence[BenchRow]], SourceRule] | None = None


def _gpu_name(system: str) -> str | None:
    try:
        return get_gpu(system).name
    except UnknownGPUError:
        return None


def _argonne_mi250(row: BenchRow) -> bool:
    return row.id.startswith("argonne_") and _gpu_name(row.system) in ("MI250", "MI250X")


def _per_gcd(row: BenchRow) -> BenchRow:
    lay = row.layout
    # The package's two GCDs split the model as one more tp factor of 2. An MoE row whose expert
    # fields were written for the packages keeps them per package; written as 1 they already
    # read as "experts over the tp ranks" (predictor.to_layout).
    moe_tp = lay.moe_tp * 2 if lay.moe_tp > 1 else lay.moe_tp
    return replace(row, layout=Layout(lay.tp * 2, lay.pp, lay.dp, moe_tp, lay.moe_ep))


# Argonne's LLM-Inference-Bench (shared/data/argonne-offline) writes 'Num of Hardware' as tp_size.
# On MI250 that number counts OAM packages, not the GCDs ROCm and vLLM see as devices (catalog:
# one MI250 entry is one GCD, 64 GB). The rows say so themselves: Mixtral-8x7B in fp16 (93 GB of
# weights) runs at 'tp 1', and Llama-2-70B and Llama-3-70B (138-141 GB) at 'tp 2', which one and
# two 64 GB GCDs cannot hold but one and two 128 GB packages can; and no MI250 row is written
# at a tp above 4, the 4 packages of an 8-GCD node. vLLM ran such a row at tensor-parallel 2 x
# the written count over GCDs, so it reads as that many GCDs (its GPU count included: throughput
# per GPU is per GCD, measured and predicted alike).
ARGONNE_MI250_PACKAGES = SourceRule(
    name="argonne-mi250-packages",
    applies=_argonne_mi250,
    read=_per_gcd,
    why="Argonne LLM-Inference-Bench counts an MI250 OAM package (two GCDs) as one GPU: tp_size x 2 GCDs",
)

def _rocm_dev_docker(row: BenchRow) -> bool:
    return row.id.startswith("rocmdd_") and ROCM_FORK_TAG not in row.backend_version.lower()


def _fork_build(row: BenchRow) -> BenchRow:
    return replace(row, backend_version=row.backend_version + ROCM_FORK_TAG)


# shared/data/rocm-vllm-dev-docker copies AMD's tables for its rocm/vllm-dev images, which are
# builds of AMD's vLLM fork (ROCm/vllm), written by their upstream release (0.6.6 ... 0.10.0). The
# fork's kernels differ from the upstream release of the same number: it ran its own custom
# all-reduce on MI300 from 2024 on, where upstream vLLM reduced through RCCL until 0.8.3
# (catalog.engines.allreduce_hop_latency). The rows show it: Llama-3.1-70B FP8 at tp8 decodes one
# sequence in 9.3 ms a step (0.6.6), less than the 80 layers' all-reduces alone would take through
# RCCL. Their version reads with the fork's tag (0.6.6+rocmfork), and their kernel set with it.
ROCM_DEV_DOCKER_FORK = SourceRule(
    name="rocm-dev-docker-fork",
    applies=_rocm_dev_docker,
    read=_fork_build,
    why="ROCm/vllm dev-docker rows are builds of AMD's vLLM fork: backend_version + '+rocmfork'",
)

def _aic_silicon(row: BenchRow) -> bool:
    return "silicon_data_source" in row.raw and row.mode == "agg"


def _engine(row: BenchRow) -> str | None:
    try:
        return normalize_engine(row.backend)
    except UnknownEngineError:
        return None  # trtllm and others: no rule of theirs here


def _squared_vllm(row: BenchRow) -> bool:
    lay = row.layout
    return _engine(row) == "vllm" and lay.tp > 1 and lay.dp == lay.tp and lay.moe_ep == lay.tp * lay.dp


def _squared_sglang(row: BenchRow) -> bool:
    lay = row.layout
    try:
        node = get_gpu(row.system).gpus_per_node
    except UnknownGPUError:
        return False
    return _engine(row) == "sglang" and lay.dp == 1 and lay.moe_tp > 1 and lay.moe_tp == lay.moe_ep and \
        lay.tp == lay.moe_tp * lay.moe_ep and lay.tp > node


def _aic_squared(row: BenchRow) -> bool:
    return _aic_silicon(row) and (_squared_vllm(row) or _squared_sglang(row))


def _as_deployed(row: BenchRow) -> BenchRow:
    lay = row.layout
    if _squared_vllm(row):
        # batch_size is per attention-DP rank in this schema (clients = batch_size x dp, or the
        # recorded silicon_concurrency): the clients stay those that ran once dp reads as 1.
        clients = recorded_clients(row) or row.concurrency * lay.dp
        return replace(row, layout=Layout(lay.tp, lay.pp, 1, 1, lay.tp), concurrency=clients)
    return replace(row, layout=Layout(lay.moe_tp, lay.pp, 1, 1, lay.moe_ep))


# The aiconfigurator silicon data (shared/data/aic-silicon) writes 242 aggregated expert-parallel
# runs of its dev split with a squared width; their measured TTFT and TPOT equal, within run noise,
# those of the rows written plainly at the same client count and kernel set (several are the same
# run, duplicated), and the squared count of GPUs is more than the engine was given:
# - vLLM `--tensor-parallel-size T --enable-expert-parallel` appears as tp = T, attention dp = T,
#   moe_ep = T x T, batch_size = clients / T (MiniMax-M2.5 and Kimi-K2.5 on B200/B300);
# - SGLang `--tp T --ep T` appears as tp = T x T, moe_tp = T, moe_ep = T (DeepSeek-R1 and
#   Qwen3.5 on B200/B300). Only squared widths beyond one node read this way: a layout such as
#   tp 4, moe_tp 2, moe_ep 2 is a plain SGLang `--tp 4 --ep 2` and stays as written.
# Each reads as the deployment that ran, on its T GPUs.
AIC_SILICON_SQUARED_WIDTH = SourceRule(
    name="aic-silicon-squared-width",
    applies=_aic_squared,
    read=_as_deployed,
    why="aic-silicon writes vLLM tpT+EP as tp T x dp T x ep T^2 and SGLang --tp T --ep T as tp T^2: tp T, ep T",
)


def _architecture(model_path: str) -> tuple[object, ...] | None:
    """A model's architecture (its ModelSpec but for the name and where it was read from), so that
    two names of one architecture (DeepSeek-R1 and DeepSeek-V3) compare equal; None when unknown."""
    try:
        spec = get_model(model_path)
    except (UnknownModelError, ModelConfigError):
        return None
    return tuple(getattr(spec, f.name) for f in fields(spec) if f.name not in ("name", "source"))


def _measurement(row: BenchRow) -> tuple[object, ...] | None:
    """What identifies one disaggregated measurement across two records of it: engine build, GPU,
    precision, lengths, clients, architecture, and the measured TTFT and TPOT to the last digit."""
    if row.mode != "disagg" or row.ttft_ms is None or row.tpot_ms is None:
        return None
    return (row.backend, row.backend_version, row.system, row.precision, row.isl, row.osl, row.concurrency,
            row.ttft_ms, row.tpot_ms, _architecture(row.model_path))


def _pools_unrecorded(row: BenchRow) -> bool:
    return row.mode == "disagg" and not (row.raw.get("prefill_num_workers") or row.raw.get("decode_num_workers"))


def _bind_twins(rows: Sequence[BenchRow]) -> SourceRule:
    recorded: dict[tuple[object, ...], BenchRow] = {}
    for row in rows:
        key = _measurement(row)
        if key is not None and key[-1] is not None and not _pools_unrecorded(row):
            recorded.setdefault(key, row)

    def twin(row: BenchRow) -> BenchRow | None:
        key = _measurement(row) if _pools_unrecorded(row) else None
        return recorded.get(key) if key is not None and key[-1] is not None else None

    def applies(row: BenchRow) -> bool:
        t = twin(row)
        return t is not None and (t.prefill, t.decode) != (row.prefill, row.decode)

    def read(row: BenchRow) -> BenchRow:
        t = twin(row)
        assert t is not None
        return replace(row, prefill=t.prefill, decode=t.decode)

    return replace(DISAGG_TWINS, applies=applies, read=read, bind=None)


# shared/data/aic-silicon holds SGLang's disaggregated DeepSeek runs on B200, GB200 and GB300 twice:
# once from the benchmark's database (ids dsr1_*: every pool column, workers and per-rank batch
# included) and once from its CSV exports (silicon_data_source "source_file=..."), which leave the
# worker counts and batch sizes empty, write a worker's GPU count as its tp and drop attention dp.
# The two records of one run agree on TTFT and TPOT to the last digit (the database labels some of
# them DeepSeek-V3, the same architecture), and their layouts say the export is lossy: "tp8 ep8"
# is one worker of dp 8 (--enable-dp-attention) in some runs and of tp 8 in others, "tp32 moe_tp4
# ep8" one decode worker of dp 32 and ep 32, and prefill pools of 2-10 workers read as one. A row
# that does not record its pools' workers and whose measurement a recorded row repeats is read
# with that row's pools; a row without such a twin stays as written.
DISAGG_TWINS = SourceRule(
    name="disagg-pools-of-the-recorded-twin",
    applies=lambda row: False,  # bound to a file's rows by read_as_run
    read=lambda row: row,
    why="a disaggregated row without its pools' worker counts whose TTFT and TPOT a fully recorded row of the same "
        "run repeats is read with that row's pools",
    bind=_bind_twins,
)

SOURCE_RULES: tuple[SourceRule, ...] = (ARGONNE_MI250_PACKAGES, ROCM_DEV_DOCKER_FORK, AIC_SILICON_SQUARED_WIDTH,
                                        DISAGG_TWINS)


def read_as_run(rows: Sequence[BenchRow], rules: Sequence[SourceRule] = SOURCE_RULES,
                applied: dict[str, int] | None = None) -> list[BenchRow]:
    """`rows` with every source rule applied where it applies (the first that applies wins);
    `applied` receives how many rows each rule read (rules that read none are left out)."""
    rules = [r.bind(rows) if r.bind is not None else r for r in rules]
    out = []
    for row in rows:
        rule = next((r for r in rules if r.applies(row)), None)
        if rule is None:
            out.append(row)
            continue
        out.append(rule.read(row))
        if applied is not None:
            applied[rule.name] = applied.get(rule.name, 0) + 1
    return out
