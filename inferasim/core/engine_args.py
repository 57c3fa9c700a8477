"""The engine server's argv and environment for a :class:`~inferasim.core.config.ServingConfig`.

Every engine argument is taken from the engine catalogue (:mod:`inferasim.catalog.engines`) and
checked with :func:`~inferasim.catalog.engines.is_known_flag` before it is emitted; an unknown
flag (from the mapping below or from ``extra_args``) raises ValueError naming it. Source tags in
the comments are those of ``shared/notes/engine-facts.md`` section 0:

* ``V10`` ROCm/vllm (v0.10.1 line) ``vllm/engine/arg_utils.py``, ``vllm/envs.py``
* ``S``   sgl-project/sglang ``python/sglang/srt/server_args.py``
* ``A``   ROCm/ATOM ``atom/model_engine/arg_utils.py``, ``atom/entrypoints/openai/api_server.py``
* ``I``   SemiAnalysisAI/InferenceX configs (flags and env used in practice)

Facts read outside the notes say so ("not in the notes"). One replica must fit on one node
(``layout.gpus <= gpus_per_node``); multi-node replicas are refused with a ValueError.
"""

from __future__ import annotations

import json
import re
from typing import Any

from inferasim.catalog.checkpoints import checkpoint_format, names_quantized_checkpoint
from inferasim.catalog.engines import (
    DEFAULT_HOST,
    SGLANG_MAX_PREFILL_TOKENS,
    default_port,
    engine_flags,
    flag_for,
    is_known_flag,
    launch_command,
    model_flag,
)
from inferasim.catalog.gpus import GPU
from inferasim.core.config import KV_DTYPES, SPEC_NEEDS_DRAFT, SPEC_SPELLING, ServingConfig, normalize_knob
from inferasim.core.layout import Layout

# Hugging Face cache inside the container (an emptyDir; swap for a PVC to keep weights across
# restarts). HF_HOME is the huggingface_hub cache root.
HF_HOME = "/root/.cache/huggingface"

# P/D disaggregation: KV-transfer settings per engine and role.
_VLLM_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}  # notes 5.1 example (names unverified)
# ATOM recipes (not in the notes): mooncake connector, producer on prefill, consumer on decode,
# handshake port 6301 (the default in notes 5.3).
_ATOM_KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
_ATOM_HANDSHAKE_PORT = 6301
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------


def _is_flag_token(token: str) -> bool:
    return token.startswith("-") and not _NUMBER.match(token)


def alias_map(engine: str) -> dict[str, str]:
    """Catalogued alias -> canonical flag ("-tp" -> "--tensor-parallel-size"), from the help texts."""
    out: dict[str, str] = {}
    for name, flag in engine_flags(engine).items():
        m = re.search(r"(?:alias|abbreviation) of (--?[A-Za-z][\w-]*)", flag.help)
        if m:
            out[name] = m.group(1)
    return out


def flag_spelling(engine: str, flag: str, aliases: dict[str, str]) -> str:
    """The engine's own spelling of `flag`: aliases resolved, ATOM snake->kebab (negations kept:
    `inferasim.deployment` reads --no-X and --X apart)."""
    if engine == "atom" and flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")  # A: FlexibleArgumentParser accepts both spellings
    return aliases.get(flag, flag)


def _canonical(engine: str, flag: str, aliases: dict[str, str]) -> str:
    """Canonical name used to detect duplicates: the engine's spelling with negations folded."""
    key = flag_spelling(engine, flag.split("=", 1)[0], aliases)
    if key.startswith("--no-"):
        key = "--" + key[5:]  # --no-enable-prefix-caching conflicts with --enable-prefix-caching
    return key


def _role(engine: str, role: str) -> str:
    flag = flag_for(engine, role)
    if flag is None:  # pragma: no cover - guarded by the callers
        raise ValueError(f"{engine} has no catalogued flag for {role!r}")
    return flag


class _Args:
    """Accumulates ``flag [value]`` pairs, checking each flag against the engine catalogue."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.flags = engine_flags(engine)
        self.aliases = alias_map(engine)
        self.tokens: list[str] = []
        self.seen: dict[str, str] = {}

    def add(self, flag: str, value: object = None, *, origin: str = "rendered") -> None:
        if not is_known_flag(self.engine, flag):
            raise ValueError(
                f"{flag!r} ({origin}) is not a known {self.engine} flag; see "
                f"inferasim.catalog.engines.engine_flags({self.engine!r})"
            )
        canon = _canonical(self.engine, flag, self.aliases)
        if canon in self.seen:
            raise ValueError(
                f"{self.engine} flag {flag!r} ({origin}) duplicates {self.seen[canon]!r}, which is already set"
            )
        self.seen[canon] = flag
        self.tokens.append(flag)
        if value is not None:
            self.tokens.append(str(value))

    def add_extra(self, extra: tuple[str, ...]) -> None:
        """Pass ``extra_args`` through: each flag must be catalogued, values must follow their flag."""
        i = 0
        while i < len(extra):
            token = extra[i]
            if not _is_flag_token(token):
                raise ValueError(
                    f"extra_args: {token!r} is not preceded by a flag that takes a value; extra_args hold "
                    "'--flag value' pairs and bare boolean flags"
                )
            key = token.split("=", 1)[0]
            if not is_known_flag(self.engine, key):
                raise ValueError(
                    f"extra_args: {key!r} is not a known {self.engine} flag; see "
                    f"inferasim.catalog.engines.engine_flags({self.engine!r})"
                )
            spec = self.flags.get(_canonical_lookup(self.engine, key))
            takes_value = spec.takes_value if spec is not None else False
            if "=" in token:
                if not takes_value:
                    raise ValueError(f"extra_args: {key!r} is a boolean flag and takes no value")
                self._add_raw(token, key)
                i += 1
                continue
            if takes_value:
                if i + 1 >= len(extra) or _is_flag_token(extra[i + 1]):
                    raise ValueError(f"extra_args: {key!r} needs a value")
                self._add_raw(token, key)
                self.tokens.append(extra[i + 1])
                i += 2
            else:
                self._add_raw(token, key)
                i += 1

    def _add_raw(self, token: str, key: str) -> None:
        canon = _canonical(self.engine, key, self.aliases)
        if canon in self.seen:
            raise ValueError(
                f"extra_args: {key!r} duplicates {self.seen[canon]!r}, which the renderer already sets "
                "from the ServingConfig fields; set the field instead"
            )
        self.seen[canon] = key
        self.tokens.append(token)


def _canonical_lookup(engine: str, key: str) -> str:
    """Catalogue key of ``key`` (ATOM snake spellings map to the kebab entries)."""
    if engine == "atom" and key.startswith("--"):
        return "--" + key[2:].replace("_", "-")
    return key


# --------------------------------------------------------------------------------------------------
# Engine arguments and environment
# --------------------------------------------------------------------------------------------------


def _check_fits_node(cfg: ServingConfig, gpu: GPU) -> None:
    lay = cfg.layout
    if lay.gpus > gpu.gpus_per_node:
        raise ValueError(
            f"layout tp={lay.tp} x pp={lay.pp} x dp={lay.dp} = {lay.gpus} GPUs per replica exceeds "
            f"gpus_per_node={gpu.gpus_per_node} of {gpu.name}: one pod cannot hold it; render it as a "
            "LeaderWorkerSet (what `render` and `tune --manifest` write for a colocated replica), or "
            f"choose layout.tp, layout.pp and layout.dp with tp*pp*dp <= {gpu.gpus_per_node}"
        )


# LeaderWorkerSet sets these in every pod of a group (kubernetes-sigs/lws: LWS_LEADER_ADDRESS,
# LWS_GROUP_SIZE, LWS_WORKER_INDEX; the leader's index is 0); Kubernetes expands $(NAME) in a
# container's args from its environment.
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# Rendezvous port on the leader: vLLM's torch.distributed master port (docs.vllm.ai LWS example:
# 29500), SGLang's --dist-init-addr port (docs.sglang.io multi-node: 20000).
MULTINODE_PORT = {"vllm": 29500, "sglang": 20000}


def nodes_of(cfg: ServingConfig) -> int:
    """Nodes one replica spans: 1 within a node; beyond it, whole nodes (every pod the same GPUs)."""
    gpu = cfg.gpu_spec
    gpus, per_node = cfg.layout.gpus, gpu.gpus_per_node
    if gpus <= per_node:
        return 1
    if gpus % per_node:
        raise ValueError(f"layout {cfg.layout.label()}: {multinode_problem(cfg.engine, cfg.layout, per_node)}; "
                         f"choose tp x pp x dp as a multiple of {per_node} ({gpu.name})")
    return gpus // per_node


def multinode_problem(engine: str, layout: Layout, gpus_per_node: int) -> str | None:
    """Why a replica of ``layout`` spanning nodes could not be rendered and started (None: it can,
    or it fits one node): whole nodes only, an engine whose multi-node launch is catalogued, and
    for vLLM no data parallel across nodes."""
    if layout.gpus <= gpus_per_node:
        return None
    if layout.gpus % gpus_per_node:
        return (f"{layout.gpus} GPUs per replica is not a whole number of {gpus_per_node}-GPU nodes (a multi-node "
                "replica takes every GPU of each node)")
    if flag_for(engine, "nnodes") is None:
        return f"{engine} multi-node serving is not rendered (its launch across nodes is not catalogued)"
    if engine == "vllm" and layout.dp > 1:
        return "vLLM data parallel across nodes is not rendered (dp 1 for a multi-node replica)"
    return None


def _multinode_args(cfg: ServingConfig, args: _Args, nodes: int, leader: bool) -> None:
    """The flags that join one pod of a LeaderWorkerSet group into one engine spanning ``nodes``."""
    eng = cfg.engine
    why = multinode_problem(eng, cfg.layout, cfg.gpu_spec.gpus_per_node)
    if why:
        raise ValueError(f"{why}: choose a layout within one node ({cfg.gpu_spec.gpus_per_node} GPUs), more "
                         "replicas, or vllm / sglang")
    port = MULTINODE_PORT[eng]
    if eng == "vllm":
        # The multiprocessing executor: every pod runs `vllm serve`; rank 0 serves HTTP, the
        # others run their engine ranks headless.
        args.add(_role(eng, "executor_backend"), "mp")
        args.add(_role(eng, "rendezvous_addr"), LWS_LEADER_ADDRESS)
        args.add(_role(eng, "rendezvous_port"), port)
    else:
        args.add(_role(eng, "rendezvous_addr"), f"{LWS_LEADER_ADDRESS}:{port}")
    args.add(_role(eng, "nnodes"), nodes)
    args.add(_role(eng, "node_rank"), LWS_WORKER_INDEX)
    if not leader and flag_for(eng, "headless") is not None:
        args.add(_role(eng, "headless"))


def _parallel_args(cfg: ServingConfig, args: _Args) -> None:
    lay = cfg.layout
    eng = cfg.engine
    if eng == "vllm":
        # V10 arg_utils: --tensor-parallel-size / --pipeline-parallel-size / --data-parallel-size;
        # --enable-expert-parallel shards the experts over TP x DP (notes 5.1), so EP width = tp*dp.
        if lay.moe_ep not in (1, lay.tp * lay.dp):
            raise ValueError(
                f"vLLM expert parallel shards experts over all tp x dp = {lay.tp * lay.dp} GPUs: layout.moe_ep "
                f"must be 1 or {lay.tp * lay.dp}, got {lay.moe_ep}"
            )
        args.add(_role(eng, "tensor_parallel"), lay.tp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"))
    elif eng == "sglang":
        # S server_args: under --enable-dp-attention, --tp-size spans all attention-DP ranks
        # (attention TP = tp_size / dp_size), so --tp-size = tp*dp; --ep-size divides it.
        args.add(_role(eng, "tensor_parallel"), lay.tp * lay.dp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
            args.add(_role(eng, "dp_attention"))
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"), lay.moe_ep)
    else:
        # A arg_utils: -tp / -pp / -dp, --enable-expert-parallel, --enable-dp-attention.
        # ATOM's FusedMoEParallelConfig (atom/model_ops/moe.py, not in the notes) flattens DP into the
        # MoE group only under --enable-dp-attention, and its CoreManager then runs every rank with
        # attention TP 1 (docs/distributed_guide.md, not in the notes). So: EP over tp GPUs (dp == 1),
        # or EP over dp GPUs with attention TP 1 (tp == 1); tp > 1 and dp > 1 with EP has no ATOM form
        # that matches the layout.
        if lay.moe_ep > 1:
            if lay.dp == 1 and lay.moe_ep != lay.tp:
                raise ValueError(
                    f"ATOM expert parallel spans the tp={lay.tp} GPUs of one engine: layout.moe_ep must be 1 or "
                    f"{lay.tp}, got {lay.moe_ep}"
                )
            if lay.dp > 1 and lay.tp == 1 and lay.moe_ep != lay.dp:
                raise ValueError(
                    f"ATOM expert parallel under DP attention spans all dp={lay.dp} ranks: layout.moe_ep must be 1 "
                    f"or {lay.dp}, got {lay.moe_ep}"
                )
            if lay.dp > 1 and lay.tp > 1:
                raise ValueError(
                    f"ATOM cannot render layout tp={lay.tp}, dp={lay.dp}, moe_ep={lay.moe_ep}: with "
                    "--enable-dp-attention ATOM runs attention at TP 1 over tp*dp ranks, without it the experts "
                    "stay inside each DP rank. Use layout.tp=1, layout.dp=N, layout.moe_ep=N (DP attention + EP) "
                    "or layout.dp=1, layout.moe_ep=layout.tp"
                )
        args.add(_role(eng, "tensor_parallel"), lay.tp)
        if lay.pp > 1:
            args.add(_role(eng, "pipeline_parallel"), lay.pp)
        if lay.dp > 1:
            args.add(_role(eng, "data_parallel"), lay.dp)
            if lay.moe_ep > 1:
                args.add(_role(eng, "dp_attention"))
        if lay.moe_ep > 1:
            args.add(_role(eng, "expert_parallel"))


def online_fp8(cfg: ServingConfig) -> bool:
    """Whether fp8 is reached by quantising a 16-bit checkpoint online. The checkpoint's own format
    decides (catalog.checkpoints.checkpoint_format): native FP8 checkpoints whose ids do not say so
    (DeepSeek-V3, Kimi-K2-Instruct, MiniMax-M2.5) carry their scheme in config.json and need no
    flag. Only an id nothing states a format for is judged by its name (-FP8, -AWQ, ...)."""
    if normalize_knob(cfg.precision) != "fp8":
        return False
    fmt = checkpoint_format(cfg.model)
    if fmt is None:
        return not names_quantized_checkpoint(cfg.model)
    return fmt in ("bf16", "fp16", "fp32")


def _quantization_args(cfg: ServingConfig, args: _Args) -> None:
    # Quantised checkpoints (FP8/FP4/INT4/AWQ/GPTQ ...) carry their scheme in config.json and every
    # engine detects it; the only precision that needs a flag is online FP8 of a 16-bit checkpoint:
    # vLLM --quantization fp8 (V10), SGLang --quantization fp8 (S). ATOM has no catalogued
    # quantization flag: precision fp8/fp4 on ATOM needs a pre-quantised checkpoint.
    if not online_fp8(cfg):
        return
    flag = flag_for(cfg.engine, "quantization")
    if flag is not None:
        args.add(flag, "fp8")


def _scheduler_args(cfg: ServingConfig, args: _Args) -> None:
    eng = cfg.engine
    if cfg.max_num_seqs is not None:
        # V10 / A --max-num-seqs; S --max-running-requests
        args.add(_role(eng, "max_num_seqs"), cfg.max_num_seqs)
    if eng == "sglang":
        # S: --chunked-prefill-size is SGLang's token budget per prefill chunk (-1 disables chunking);
        # --max-prefill-tokens (16384) bounds one prefill batch.
        if cfg.chunked_prefill is False:
            args.add(_role(eng, "max_num_batched_tokens"), -1)
            if cfg.max_num_batched_tokens is not None:
                args.add(_role(eng, "max_prefill_tokens"), cfg.max_num_batched_tokens)
        elif cfg.max_num_batched_tokens is not None:
            args.add(_role(eng, "max_num_batched_tokens"), cfg.max_num_batched_tokens)
            if cfg.max_num_batched_tokens > SGLANG_MAX_PREFILL_TOKENS:
                args.add(_role(eng, "max_prefill_tokens"), cfg.max_num_batched_tokens)
    else:
        if cfg.max_num_batched_tokens is not None:
            args.add(_role(eng, "max_num_batched_tokens"), cfg.max_num_batched_tokens)  # V10 / A
        if cfg.chunked_prefill is True:
            args.add(_role(eng, "enable_chunked_prefill"))  # V10 / A --enable-chunked-prefill
        elif cfg.chunked_prefill is False:
            if eng == "atom":
                # A defines --no-enable_chunked_prefill (BooleanOptionalAction), but the catalogue does not
                # list it, and only catalogued flags are rendered.
                raise ValueError(
                    "chunked_prefill=False cannot be rendered for atom: its negation flag is not in the engine "
                    "catalogue; leave chunked_prefill None or True"
                )
            # V10: BooleanOptionalAction negation; without chunking the step budget must hold a whole prompt.
            if (
                cfg.max_num_batched_tokens is not None
                and cfg.max_model_len is not None
                and cfg.max_num_batched_tokens < cfg.max_model_len
            ):
                raise ValueError(
                    f"chunked_prefill=False needs max_num_batched_tokens >= max_model_len for vLLM; got "
                    f"max_num_batched_tokens={cfg.max_num_batched_tokens}, max_model_len={cfg.max_model_len}"
                )
            args.add("--no-enable-chunked-prefill")
    if cfg.prefix_caching is True:
        flag = flag_for(eng, "enable_prefix_caching")
        if flag is not None:  # SGLang's radix cache is on by default and has no enabling flag (S)
            args.add(flag)
    elif cfg.prefix_caching is False:
        # V10 / A --no-enable-prefix-caching; S --disable-radix-cache
        args.add(_role(eng, "disable_prefix_caching"))


def _memory_args(cfg: ServingConfig, args: _Args) -> None:
    eng = cfg.engine
    if cfg.memory_fraction is not None:
        # V10 / A --gpu-memory-utilization (of total memory); S --mem-fraction-static
        args.add(_role(eng, "memory_fraction"), _fmt_float(cfg.memory_fraction))
    kv = KV_DTYPES[eng][normalize_knob(cfg.kv_cache_dtype)]
    if kv is not None:
        args.add(_role(eng, "kv_cache_dtype"), kv)  # V10 / S / A --kv-cache-dtype (value lists: notes 5.1-5.3)
    if cfg.max_model_len is not None:
        # V10 / A --max-model-len; S --context-length
        args.add(_role(eng, "max_model_len"), cfg.max_model_len)


def _spec_args(cfg: ServingConfig, args: _Args) -> None:
    method = normalize_knob(cfg.spec_method)
    if method == "none":
        return
    eng = cfg.engine
    value = SPEC_SPELLING[eng][method]
    k = cfg.num_speculative_tokens
    if eng == "vllm":
        # V10 --speculative-config JSON {"method", "model", "num_speculative_tokens"} (notes 5.1)
        spec: dict[str, Any] = {"method": value}
        if method in SPEC_NEEDS_DRAFT:
            spec["model"] = cfg.draft_model
        spec["num_speculative_tokens"] = k
        args.add(_role(eng, "speculative"), json.dumps(spec, separators=(",", ":")))
    elif eng == "sglang":
        # S --speculative-algorithm with --speculative-num-steps k, --speculative-eagle-topk 1 and
        # --speculative-num-draft-tokens k+1 (a chain of k drafts plus the verified token);
        # NGRAM takes only the draft-token count (its tree settings keep SGLang's defaults).
        args.add(_role(eng, "speculative"), value)
        if method == "ngram":
            args.add("--speculative-num-draft-tokens", k)
        else:
            args.add("--speculative-num-steps", k)
            args.add("--speculative-eagle-topk", 1)
            args.add("--speculative-num-draft-tokens", k + 1)
        if method in SPEC_NEEDS_DRAFT:
            args.add("--speculative-draft-model-path", cfg.draft_model)
    else:
        # A --method mtp | eagle3, --num-speculative-tokens k, --draft-model (required for eagle3)
        args.add(_role(eng, "speculative"), value)
        args.add("--num-speculative-tokens", k)
        if method in SPEC_NEEDS_DRAFT:
            args.add("--draft-model", cfg.draft_model)


def _disagg_args(cfg: ServingConfig, args: _Args) -> None:
    role = cfg.disagg_role
    if role is None:
        return
    eng = cfg.engine
    if eng == "vllm":
        # V10 --kv-transfer-config (notes 5.1 example; connector names unverified there)
        args.add(_role(eng, "disaggregation"), json.dumps(_VLLM_KV_TRANSFER, separators=(",", ":")))
    elif eng == "sglang":
        args.add(_role(eng, "disaggregation"), role)  # S --disaggregation-mode prefill | decode
    else:
        # A --kv-transfer-config; role/connector/handshake port from the ATOM P/D recipes (not in the notes)
        kv = {"kv_role": _ATOM_KV_ROLE[role], "kv_connector": "mooncake", "handshake_port": _ATOM_HANDSHAKE_PORT}
        args.add(_role(eng, "disaggregation"), json.dumps(kv, separators=(",", ":")))


def _fmt_float(x: float) -> str:
    return format(float(x), "g")


def engine_args(cfg: ServingConfig, node_role: str | None = None) -> list[str]:
    """Full argv of the engine server: launch command, model, then flags (real, catalogued flags only).

    vLLM: ``vllm serve <model> ...`` (model positional); SGLang: ``python3 -m sglang.launch_server
    --model-path <model> --host 0.0.0.0 --port 30000 --enable-metrics ...``; ATOM: ``python3 -m
    atom.entrypoints.openai_server --model <model> --server-port 8000 ...``. Raises ValueError for a
    layout that does not fit one node, a layout the engine cannot express, an unknown or duplicated
    flag (naming it), or a malformed ``extra_args``.

    ``node_role`` ("leader" | "worker"): the argv of one pod of a multi-node replica (a
    LeaderWorkerSet group, render.render_leader_worker_set), with the engine's flags that join the nodes.
    """
    eng = cfg.engine
    gpu = cfg.gpu_spec
    if node_role is None:
        _check_fits_node(cfg, gpu)
    elif node_role not in ("leader", "worker"):
        raise ValueError(f"node_role {node_role!r}: leader or worker")
    argv = launch_command(eng)
    mflag = model_flag(eng)
    args = _Args(eng)
    if mflag is None:
        argv.append(cfg.model)  # V10: `vllm serve <model>`
    else:
        args.add(mflag, cfg.model)  # S --model-path, A --model

    # Bind address and HTTP port. SGLang binds 127.0.0.1 by default and must get --host 0.0.0.0 in a
    # Pod (notes 5.2); vLLM (None: all interfaces) and ATOM (0.0.0.0) need no --host. The port is set
    # explicitly so probes, container port and Service agree: vLLM --port 8000, SGLang --port 30000,
    # ATOM --server-port 8000 (--port is ATOM's internal engine port).
    if DEFAULT_HOST[eng] not in (None, "0.0.0.0"):
        args.add(_role(eng, "host"), "0.0.0.0")
    args.add(_role(eng, "port"), default_port(eng))
    metrics = flag_for(eng, "enable_metrics")
    if metrics is not None:
        args.add(metrics)  # S --enable-metrics (off by default; /metrics is always on for vLLM and ATOM)

    _parallel_args(cfg, args)
    if node_role is not None:
        nodes = nodes_of(cfg)
        if nodes < 2:
            raise ValueError(f"layout {cfg.layout.label()} fits one node: render it as a Deployment")
        _multinode_args(cfg, args, nodes, leader=node_role == "leader")
    _quantization_args(cfg, args)
    _scheduler_args(cfg, args)
    _memory_args(cfg, args)
    _spec_args(cfg, args)
    _disagg_args(cfg, args)
    args.add_extra(cfg.extra_args)
    return argv + args.tokens


def engine_env(cfg: ServingConfig) -> dict[str, str]:
    """Environment of the engine container (plain name -> value pairs)."""
    gpu = cfg.gpu_spec
    env: dict[str, str] = {"HF_HOME": HF_HOME}
    if gpu.vendor == "amd":
        if cfg.engine == "vllm":
            # V10 vllm/envs.py: VLLM_ROCM_USE_AITER is the master switch, default False; InferenceX (I)
            # sets it to 1 on Instinct (notes 5.1). The sub-switches default on.
            env["VLLM_ROCM_USE_AITER"] = "1"
        elif cfg.engine == "sglang":
            # notes 5.2: the aiter attention backend on ROCm is selected with SGLANG_USE_AITER=1, which I
            # exports (whether the ROCm image sets it is unverified).
            env["SGLANG_USE_AITER"] = "1"
        # ATOM is built on AITER; it needs no switch.
    return env
