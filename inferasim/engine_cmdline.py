"""An engine container's command line read back (the half of :mod:`inferasim.deployment` that reads
flags): the argv (also inside ``sh -c "..."``), the launch command that names the engine, the flags
as the engine's catalogue spells them (:class:`EngineFlags`), and the serving-configuration fields
they decide: layout, model, precision, KV dtype, speculative method, P/D role.

Nothing that decides the kernel set is guessed: what cannot be read raises :class:`DeploymentError`
naming the flag and the fix.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferasim.catalog.engines import engine_flags, flag_for
from inferasim.catalog.precision import PRECISIONS
from inferasim.core.config import KV_DTYPES, SPEC_SPELLING
from inferasim.core.engine_args import alias_map, flag_spelling
from inferasim.core.layout import Layout, LayoutError
from inferasim.errors import UserError
from inferasim.render import LABEL_ROLE

ANN_MODEL = "inferasim.io/model"
ANN_PRECISION = "inferasim.io/precision"
ANN_VERSION = "inferasim.io/engine-version"

# Engine launch modules and executables (notes 5.1-5.3); older vLLM images start the API server module.
_LAUNCH_MODULES: dict[str, str] = {
    "vllm.entrypoints.openai.api_server": "vllm",
    "sglang.launch_server": "sglang",
    "atom.entrypoints.openai_server": "atom",
}

# Flags that only bind the server (the renderer sets them itself): read into `port`, never into extra_args.
_SERVER_ROLES = ("host", "port", "enable_metrics")


class DeploymentError(UserError):
    """The manifest does not say something inferasim needs; the message names the field and the fix."""


# --------------------------------------------------------------------------------------------------
# command line -> engine, model, flags
# --------------------------------------------------------------------------------------------------


def container_argv(container: Mapping[str, Any]) -> list[str]:
    argv = [str(t) for t in (container.get("command") or [])] + [str(t) for t in (container.get("args") or [])]
    # `sh -c "vllm serve ... && ..."`: the script's tokens, cut at shell separators.
    if len(argv) >= 3 and Path(argv[0]).name in ("sh", "bash", "dash") and argv[1] in ("-c", "-lc", "-ec"):
        try:
            tokens = shlex.split(" ".join(argv[2:]))
        except ValueError as exc:
            raise DeploymentError(f"container {container.get('name')!r}: cannot split the shell command: {exc}") \
                from None
        parts: list[list[str]] = [[]]
        for t in tokens:
            if t in ("&&", "||", ";", "|"):
                parts.append([])
            else:
                parts[-1].append(t)
        for part in parts:
            if launch_of(part) is not None:
                return part
        return tokens
    return argv


# Images whose entrypoint is vLLM's OpenAI server (vllm/vllm-openai and its -rocm build, Docker Hub).
ENTRYPOINT_IMAGE = re.compile(r"(^|/)vllm-openai(-rocm)?(:|@|$)")


def launch_of(argv: list[str]) -> tuple[str, int] | None:
    """(engine, index of the first argument after the launch command), or None."""
    for i, tok in enumerate(argv):
        base = Path(tok).name
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm", i + 2
        if tok == "-m" and i + 1 < len(argv) and argv[i + 1] in _LAUNCH_MODULES:
            return _LAUNCH_MODULES[argv[i + 1]], i + 2
        if base == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "sglang", i + 2
    return None


@dataclass
class EngineFlags:
    engine: str
    values: dict[str, str | None]  # canonical flag -> value (None: a boolean flag)
    order: list[tuple[str, list[str]]]  # (canonical flag, the original tokens) in command-line order
    positional: list[str]
    unknown: list[str]

    def has(self, flag: str) -> bool:
        return flag in self.values

    def get(self, flag: str) -> str | None:
        return self.values.get(flag)

    def role(self, role: str) -> str | None:
        flag = flag_for(self.engine, role)
        return None if flag is None else self.values.get(self._canon(flag))

    def has_role(self, role: str) -> bool:
        flag = flag_for(self.engine, role)
        return flag is not None and self._canon(flag) in self.values

    def _canon(self, flag: str) -> str:
        return flag_spelling(self.engine, flag, alias_map(self.engine))


def parse_flags(engine: str, tokens: list[str]) -> EngineFlags:
    catalog = engine_flags(engine)
    aliases = alias_map(engine)
    out = EngineFlags(engine, {}, [], [], [])
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-") or re.match(r"^-\d", tok):
            out.positional.append(tok)
            i += 1
            continue
        key, eq, inline = tok.partition("=")
        canon = flag_spelling(engine, key, aliases)
        spec = catalog.get(canon)
        known = spec is not None or (engine == "vllm" and canon == "--model")
        takes_value = spec.takes_value if spec is not None else (
            canon == "--model" or (i + 1 < len(tokens) and not tokens[i + 1].startswith("-")))
        if eq:
            value: str | None = inline
            used = [tok]
            i += 1
        elif takes_value:
            if i + 1 >= len(tokens):
                raise DeploymentError(f"{engine} flag {key} needs a value (it is the last argument)")
            value = tokens[i + 1]
            used = [tok, value]
            i += 2
        else:
            value, used = None, [tok]
            i += 1
        if known:
            out.values[canon] = value  # argparse: the last occurrence wins
            out.order.append((canon, used))
        else:
            out.unknown.extend(used)
    return out


# --------------------------------------------------------------------------------------------------
# fields
# --------------------------------------------------------------------------------------------------


def flag_int(flags: EngineFlags, flag: str, what: str) -> int | None:
    raw = flags.get(flag)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DeploymentError(f"{flags.engine} flag {flag}={raw!r} ({what}) is not an integer") from None


def role_int(flags: EngineFlags, role: str) -> int | None:
    flag = flag_for(flags.engine, role)
    return None if flag is None else flag_int(flags, flags._canon(flag), role)


def layout_of(flags: EngineFlags) -> tuple[Layout, int]:
    """(layout of one replica, data-parallel copies inside one pod that are replicas, not a layout)."""
    eng = flags.engine
    copies = 1
    if eng == "vllm":
        tp = flag_int(flags, "--tensor-parallel-size", "tensor parallel") or 1
        pp = flag_int(flags, "--pipeline-parallel-size", "pipeline parallel") or 1
        dp = flag_int(flags, "--data-parallel-size", "data parallel") or 1
        # V10: --enable-expert-parallel shards the experts over all tp x dp GPUs.
        ep = tp * dp if flags.has("--enable-expert-parallel") else 1
    elif eng == "sglang":
        tp_size = flag_int(flags, "--tp-size", "tensor parallel") or 1
        pp = flag_int(flags, "--pp-size", "pipeline parallel") or 1
        dp = flag_int(flags, "--dp-size", "data parallel") or 1
        ep = flag_int(flags, "--ep-size", "expert parallel") or 1
        if dp > 1 and flags.has("--enable-dp-attention"):
            # S: under DP attention --tp-size spans all attention-DP ranks.
            if tp_size % dp:
                raise DeploymentError(f"sglang --tp-size {tp_size} is not a multiple of --dp-size {dp} under "
                                      "--enable-dp-attention")
            tp = tp_size // dp
        else:
            # S: without DP attention --dp-size runs dp copies of the tp-size engine in one pod.
            tp, copies, dp = tp_size, dp, 1
    else:
        tp = flag_int(flags, "--tensor-parallel-size", "tensor parallel") or 1
        pp = flag_int(flags, "-pp", "pipeline parallel") or 1
        dp = flag_int(flags, "--data-parallel-size", "data parallel") or 1
        ep = 1
        if flags.has("--enable-expert-parallel"):
            if dp > 1 and not flags.has("--enable-dp-attention"):
                raise DeploymentError("atom --enable-expert-parallel with --data-parallel-size > 1 needs "
                                      "--enable-dp-attention (without it the experts stay inside each DP rank)")
            ep = dp if dp > 1 else tp
    try:
        return Layout(tp=tp, pp=pp, dp=dp, moe_ep=ep), copies
    except LayoutError as exc:
        raise DeploymentError(f"{eng} parallel flags give an impossible layout: {exc}") from None


def model_of(flags: EngineFlags, annotations: Mapping[str, str]) -> str:
    if annotations.get(ANN_MODEL):
        return str(annotations[ANN_MODEL])
    if flags.engine == "vllm":
        model = flags.positional[0] if flags.positional else flags.get("--model")
    else:
        model = flags.role("model") or flags.get("--model")
    if not model:
        spelled = {"vllm": "vllm serve MODEL", "sglang": "--model-path MODEL", "atom": "--model MODEL"}
        raise DeploymentError(f"{flags.engine}: the command line names no model ({spelled[flags.engine]})")
    return model


def precision_of(flags: EngineFlags, annotations: Mapping[str, str], override: str | None) -> str:
    if override is not None:
        value = override
    elif annotations.get(ANN_PRECISION):
        value = str(annotations[ANN_PRECISION])
    else:
        value = flags.role("quantization") or "auto"
    norm = value.strip().lower().replace("-", "_")
    if norm not in PRECISIONS:
        raise DeploymentError(f"precision {value!r} (from --quantization or the annotation {ANN_PRECISION}) is not "
                              f"one inferasim models; pass precision= (--precision), one of {', '.join(PRECISIONS)}")
    return norm


def kv_dtype_of(flags: EngineFlags) -> str:
    raw = flags.role("kv_cache_dtype")
    if raw is None:
        return "auto"
    norm = raw.strip().lower().replace("-", "_")
    # SGLang has no bare fp8: the renderer writes fp8 as fp8_e4m3, and reading it back gives fp8.
    if flags.engine == "sglang" and norm == "fp8_e4m3":
        return "fp8"
    if norm not in KV_DTYPES[flags.engine]:
        raise DeploymentError(f"{flags.engine} --kv-cache-dtype {raw!r} is not one inferasim models; accepted: "
                              f"{', '.join(k for k in KV_DTYPES[flags.engine] if k != 'auto')}")
    return norm


def spec_of(flags: EngineFlags) -> tuple[str, int, str | None]:
    eng = flags.engine
    inverse = {v.lower(): k for k, v in SPEC_SPELLING[eng].items()}
    if eng == "vllm":
        raw = flags.get("--speculative-config")
        if raw is None:
            return "none", 0, None
        try:
            conf = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DeploymentError(f"vllm --speculative-config is not JSON: {exc}") from None
        method = str(conf.get("method", "")).lower()
        if method == "deepseek_mtp":
            method = "mtp"
        if method not in inverse:
            raise DeploymentError(f"vllm --speculative-config method {conf.get('method')!r} is not modelled; "
                                  f"accepted: {', '.join(inverse)}")
        return inverse[method], int(conf.get("num_speculative_tokens") or 0), conf.get("model")
    algo = flags.role("speculative")
    if algo is None:
        return "none", 0, None
    if algo.lower() not in inverse:
        raise DeploymentError(f"{eng} {flag_for(eng, 'speculative')} {algo!r} is not modelled; accepted: "
                              f"{', '.join(SPEC_SPELLING[eng].values())}")
    method = inverse[algo.lower()]
    if eng == "sglang":
        k = flag_int(flags, "--speculative-num-draft-tokens" if method == "ngram" else "--speculative-num-steps",
                 "speculative tokens") or 0
        return method, k, flags.get("--speculative-draft-model-path")
    return method, flag_int(flags, "--num-speculative-tokens", "speculative tokens") or 1, flags.get("--draft-model")


def disagg_role_of(flags: EngineFlags, labels: Mapping[str, str]) -> str | None:
    if labels.get(LABEL_ROLE):
        return str(labels[LABEL_ROLE])
    raw = flags.role("disaggregation")
    if raw is None:
        return None
    if flags.engine == "sglang":
        return None if raw == "null" else raw
    try:
        role = str(json.loads(raw).get("kv_role", ""))
    except (json.JSONDecodeError, AttributeError):
        raise DeploymentError(f"{flags.engine} --kv-transfer-config is not a JSON object: {raw!r}") from None
    by_role = {"kv_producer": "prefill", "kv_consumer": "decode"}
    if role not in by_role:
        raise DeploymentError(f"{flags.engine} --kv-transfer-config kv_role {role!r} does not say prefill or decode; "
                              f"label the pod {LABEL_ROLE}=prefill|decode")
    return by_role[role]


def role_float(flags: EngineFlags, role: str) -> float | None:
    raw = flags.role(role)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise DeploymentError(f"{flags.engine} {flag_for(flags.engine, role)}={raw!r} is not a number") from None


def consumed_flags(engine: str) -> set[str]:
    """Canonical flags the ServingConfig fields stand for (the renderer writes them back)."""
    aliases = alias_map(engine)
    roles = ("tensor_parallel", "pipeline_parallel", "data_parallel", "expert_parallel", "dp_attention",
             "max_num_seqs", "max_num_batched_tokens", "max_prefill_tokens", "memory_fraction", "kv_cache_dtype",
             "enable_prefix_caching", "disable_prefix_caching", "enable_chunked_prefill", "speculative",
             "quantization", "max_model_len", "disaggregation", "model", *_SERVER_ROLES)
    out = {flag_spelling(engine, f, aliases) for r in roles if (f := flag_for(engine, r)) is not None}
    out |= {"--no-enable-chunked-prefill", "--model", "--speculative-num-steps", "--speculative-eagle-topk",
            "--speculative-num-draft-tokens", "--speculative-draft-model-path", "--num-speculative-tokens",
            "--draft-model"}
    return out
