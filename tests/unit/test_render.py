"""Tests for inferasim.render: ServingConfig -> engine argv, env and Kubernetes manifests."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest
import yaml

from inferasim.catalog.engines import default_image, default_port, engine_flags, is_known_flag, launch_command
from inferasim.catalog.gpus import get_gpu
from inferasim.core.config import ServingConfig
from inferasim.core.engine_args import HF_HOME, engine_args, engine_env
from inferasim.core.layout import Layout
from inferasim.deployment import read_deployment
from inferasim.render import (
    ANNOTATION_FP8_KERNELS,
    LABEL_ENGINE,
    LABEL_LAYOUT,
    LABEL_NAME,
    render_deployment,
    render_manifests,
    render_service,
    to_yaml,
)

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
MOE_MODEL = "deepseek-ai/DeepSeek-R1"
AMD = "MI355X"
NVIDIA = "H200"

LAYOUTS = {
    "tp1": Layout(),
    "tp8": Layout(tp=8),
    "tp4-dp2-ep8": Layout(tp=4, dp=2, moe_ep=8),
    "pp2": Layout(pp=2),
    "tp2-pp2": Layout(tp=2, pp=2),
    "tp8-ep8": Layout(tp=8, moe_ep=8),
    "dp8-ep8": Layout(tp=1, dp=8, moe_ep=8),
}

_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _combos():
    for engine in ("vllm", "sglang", "atom"):
        for gpu in (AMD, NVIDIA):
            if engine == "atom" and gpu == NVIDIA:
                continue  # ROCm only; checked in test_atom_on_nvidia_is_rejected
            for lname, layout in LAYOUTS.items():
                if engine == "atom" and lname == "tp4-dp2-ep8":
                    continue  # no ATOM form; checked in test_atom_parallel_mapping
                yield pytest.param(engine, gpu, layout, id=f"{engine}-{gpu}-{lname}")


def _flags_of(cfg: ServingConfig) -> list[str]:
    """Flag tokens of the argv after the launch prefix (values such as '-1' excluded)."""
    argv = engine_args(cfg)
    prefix = launch_command(cfg.engine)
    assert argv[: len(prefix)] == prefix
    return [a.split("=", 1)[0] for a in argv[len(prefix) :] if a.startswith("-") and not _NUMBER.match(a)]


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def _assert_real_unique_flags(cfg: ServingConfig) -> list[str]:
    flags = _flags_of(cfg)
    for flag in flags:
        assert is_known_flag(cfg.engine, flag), f"{flag} is not a {cfg.engine} flag"
    assert len(flags) == len(set(flags)), f"duplicated flags in {flags}"
    return flags


def _container(dep: dict) -> dict:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _full(engine: str, gpu: str, layout: Layout, **kw) -> ServingConfig:
    """A config with every knob set (the engine-supported variant)."""
    base = dict(
        precision="fp8",
        kv_cache_dtype="fp8",
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        chunked_prefill=True,
        prefix_caching=False,
        memory_fraction=0.85,
        spec_method="mtp",
        num_speculative_tokens=3,
        max_model_len=32768,
        replicas=2,
    )
    base.update(kw)
    return ServingConfig(engine, MOE_MODEL, gpu, layout, **base)


# ---------------------------------------------------------------------------------------------
# Every rendered flag is real
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "gpu", "layout"), list(_combos()))
def test_minimal_config_renders_only_real_flags(engine, gpu, layout):
    cfg = ServingConfig(engine, MODEL, gpu, layout)
    _assert_real_unique_flags(cfg)


@pytest.mark.parametrize(("engine", "gpu", "layout"), list(_combos()))
def test_full_config_renders_only_real_flags(engine, gpu, layout):
    cfg = _full(engine, gpu, layout)
    flags = _assert_real_unique_flags(cfg)
    assert len(flags) >= 8


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_knob_grid_renders_only_real_flags(engine):
    specs = {
        "vllm": ["none", "mtp", "ngram", "eagle3"],
        "sglang": ["none", "mtp", "ngram", "eagle"],
        "atom": ["none", "mtp", "eagle3"],
    }
    chunked = [None, True] if engine == "atom" else [None, True, False]
    n = 0
    for spec, kv, prefix, chunk, precision, role in itertools.product(
        specs[engine],
        ["auto", "fp8", "bf16"],
        [None, True, False],
        chunked,
        ["auto", "fp8", "fp4"],
        [None, "prefill", "decode"],
    ):
        cfg = ServingConfig(
            engine,
            MODEL,
            AMD,
            Layout(tp=4),
            precision=precision,
            kv_cache_dtype=kv,
            prefix_caching=prefix,
            chunked_prefill=chunk,
            max_num_batched_tokens=65536,
            max_model_len=32768,
            spec_method=spec,
            num_speculative_tokens=0 if spec == "none" else 2,
            draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" if spec.startswith("eagle") else None,
            disagg_role=role,
        )
        _assert_real_unique_flags(cfg)
        n += 1
    assert n > 100


def test_every_catalogued_flag_passes_is_known_flag():
    # guards the test helper against a catalogue that renames flags
    for engine in ("vllm", "sglang", "atom"):
        for flag in engine_flags(engine):
            assert is_known_flag(engine, flag)


# ---------------------------------------------------------------------------------------------
# Engine argv details
# ---------------------------------------------------------------------------------------------


def test_vllm_model_is_positional_after_serve():
    argv = engine_args(ServingConfig("vllm", MODEL, AMD, Layout(tp=8)))
    assert argv[:3] == ["vllm", "serve", MODEL]
    assert "--model" not in argv
    assert _value(argv, "--port") == "8000"
    assert _value(argv, "--tensor-parallel-size") == "8"


def test_sglang_binds_all_interfaces_and_enables_metrics():
    argv = engine_args(ServingConfig("sglang", MODEL, NVIDIA, Layout(tp=2)))
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert _value(argv, "--model-path") == MODEL
    assert _value(argv, "--host") == "0.0.0.0"
    assert _value(argv, "--port") == "30000"
    assert "--enable-metrics" in argv


def test_atom_uses_server_port_not_internal_port():
    argv = engine_args(ServingConfig("atom", MODEL, AMD, Layout(tp=8)))
    assert _value(argv, "--model") == MODEL
    assert _value(argv, "--server-port") == "8000"
    assert "--port" not in argv  # ATOM's --port is the internal engine port (8006)


def test_vllm_parallel_mapping():
    argv = engine_args(ServingConfig("vllm", MOE_MODEL, AMD, Layout(tp=4, dp=2, moe_ep=8)))
    assert _value(argv, "--tensor-parallel-size") == "4"
    assert _value(argv, "--data-parallel-size") == "2"
    assert "--enable-expert-parallel" in argv
    assert "--pipeline-parallel-size" not in argv
    argv = engine_args(ServingConfig("vllm", MODEL, AMD, Layout(tp=2, pp=2)))
    assert _value(argv, "--pipeline-parallel-size") == "2"
    assert "--data-parallel-size" not in argv and "--enable-expert-parallel" not in argv
    with pytest.raises(ValueError, match="moe_ep"):
        engine_args(ServingConfig("vllm", MOE_MODEL, AMD, Layout(tp=8, moe_ep=4)))


def test_sglang_parallel_mapping():
    argv = engine_args(ServingConfig("sglang", MOE_MODEL, AMD, Layout(tp=4, dp=2, moe_ep=8)))
    assert _value(argv, "--tp-size") == "8"  # tp x dp under DP attention
    assert _value(argv, "--dp-size") == "2"
    assert "--enable-dp-attention" in argv
    assert _value(argv, "--ep-size") == "8"
    argv = engine_args(ServingConfig("sglang", MODEL, AMD, Layout(pp=2)))
    assert _value(argv, "--pp-size") == "2"
    assert _value(argv, "--tp-size") == "1"
    assert "--enable-dp-attention" not in argv and "--ep-size" not in argv


def test_atom_parallel_mapping():
    argv = engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=8, moe_ep=8)))
    assert _value(argv, "--tensor-parallel-size") == "8"
    assert "--enable-expert-parallel" in argv and "--enable-dp-attention" not in argv
    argv = engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=1, dp=8, moe_ep=8)))
    assert _value(argv, "--data-parallel-size") == "8"
    assert "--enable-dp-attention" in argv and "--enable-expert-parallel" in argv
    argv = engine_args(ServingConfig("atom", MODEL, AMD, Layout(tp=4, dp=2)))
    assert _value(argv, "--data-parallel-size") == "2"
    assert "--enable-dp-attention" not in argv
    with pytest.raises(ValueError, match="ATOM cannot render layout tp=4, dp=2"):
        engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=4, dp=2, moe_ep=8)))
    with pytest.raises(ValueError, match="moe_ep"):
        engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=8, moe_ep=2)))


def test_memory_and_batching_flags_only_when_set():
    for engine in ("vllm", "sglang", "atom"):
        argv = engine_args(ServingConfig(engine, MODEL, AMD, Layout(tp=8)))
        for flag in (
            "--gpu-memory-utilization",
            "--mem-fraction-static",
            "--max-num-seqs",
            "--max-running-requests",
            "--max-num-batched-tokens",
            "--chunked-prefill-size",
            "--kv-cache-dtype",
            "--quantization",
            "--speculative-config",
            "--method",
        ):
            assert flag not in argv, f"{engine}: {flag} rendered without being set"
    vllm = engine_args(_full("vllm", AMD, Layout(tp=8)))
    assert _value(vllm, "--gpu-memory-utilization") == "0.85"
    assert _value(vllm, "--max-num-seqs") == "256"
    assert _value(vllm, "--max-num-batched-tokens") == "8192"
    assert _value(vllm, "--max-model-len") == "32768"
    assert "--no-enable-prefix-caching" in vllm
    sgl = engine_args(_full("sglang", AMD, Layout(tp=8)))
    assert _value(sgl, "--mem-fraction-static") == "0.85"
    assert _value(sgl, "--max-running-requests") == "256"
    assert _value(sgl, "--chunked-prefill-size") == "8192"
    assert _value(sgl, "--context-length") == "32768"
    assert _value(sgl, "--kv-cache-dtype") == "fp8_e4m3"  # SGLang has no bare "fp8"
    assert "--disable-radix-cache" in sgl
    atom = engine_args(_full("atom", AMD, Layout(tp=8)))
    assert _value(atom, "--gpu-memory-utilization") == "0.85"
    assert _value(atom, "--max-num-seqs") == "256"
    assert _value(atom, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-prefix-caching" in atom


def test_chunked_prefill_off():
    vllm = engine_args(ServingConfig("vllm", MODEL, AMD, Layout(tp=8), chunked_prefill=False))
    assert "--no-enable-chunked-prefill" in vllm
    sgl = engine_args(
        ServingConfig("sglang", MODEL, AMD, Layout(tp=8), chunked_prefill=False, max_num_batched_tokens=32768)
    )
    assert _value(sgl, "--chunked-prefill-size") == "-1"
    assert _value(sgl, "--max-prefill-tokens") == "32768"
    with pytest.raises(ValueError, match="chunked_prefill"):
        engine_args(ServingConfig("atom", MODEL, AMD, Layout(tp=8), chunked_prefill=False))
    with pytest.raises(ValueError, match="max_num_batched_tokens >= max_model_len"):
        engine_args(
            ServingConfig(
                "vllm",
                MODEL,
                AMD,
                Layout(tp=8),
                chunked_prefill=False,
                max_num_batched_tokens=8192,
                max_model_len=32768,
            )
        )


def test_precision_fp8_quantizes_online_only_for_16_bit_checkpoints():
    for engine in ("vllm", "sglang"):
        argv = engine_args(ServingConfig(engine, MODEL, AMD, Layout(tp=8), precision="fp8"))
        assert _value(argv, "--quantization") == "fp8"
        argv = engine_args(
            ServingConfig(engine, "amd/Llama-3.1-70B-Instruct-FP8-KV", AMD, Layout(tp=8), precision="fp8")
        )
        assert "--quantization" not in argv  # the checkpoint carries its scheme
        argv = engine_args(ServingConfig(engine, MODEL, AMD, Layout(tp=8), precision="fp4"))
        assert "--quantization" not in argv
        # Native FP8 checkpoints whose ids do not say so: the catalog's checkpoint format decides,
        # not the name. An id nothing knows is still judged by its name.
        for native in (MOE_MODEL, "moonshotai/Kimi-K2-Instruct", "MiniMaxAI/MiniMax-M2.5"):
            argv = engine_args(ServingConfig(engine, native, AMD, Layout(tp=8), precision="fp8"))
            assert "--quantization" not in argv, native
        argv = engine_args(ServingConfig(engine, "some-org/unlisted-7b", AMD, Layout(tp=8), precision="fp8"))
        assert _value(argv, "--quantization") == "fp8"
        argv = engine_args(ServingConfig(engine, "some-org/unlisted-7b-FP8", AMD, Layout(tp=8), precision="fp8"))
        assert "--quantization" not in argv
    argv = engine_args(ServingConfig("atom", MODEL, AMD, Layout(tp=8), precision="fp8"))
    assert "--quantization" not in argv


def test_online_fp8_of_a_block_fp8_family_says_it_runs_other_kernels_than_priced():
    # Qwen3.5 publishes a block-scaled FP8 checkpoint, which the predictor prices; --quantization fp8
    # on the BF16 id scales per tensor instead, and the manifest says so.
    qwen = ServingConfig("sglang", "Qwen/Qwen3.5-397B-A17B", NVIDIA, Layout(tp=8), precision="fp8")
    assert _value(engine_args(qwen), "--quantization") == "fp8"
    note = render_deployment(qwen, "qwen")["metadata"]["annotations"][ANNOTATION_FP8_KERNELS]
    assert "per tensor" in note and "published FP8 checkpoint" in note
    # No note where the online FP8 is what was priced (Llama: per tensor), where the checkpoint is
    # already FP8 (DeepSeek-R1 brings its block scales), or where nothing is quantized online.
    for cfg in (ServingConfig("vllm", MODEL, NVIDIA, Layout(tp=8), precision="fp8"),
                ServingConfig("sglang", MOE_MODEL, NVIDIA, Layout(tp=8), precision="fp8"),
                ServingConfig("sglang", "Qwen/Qwen3.5-397B-A17B", NVIDIA, Layout(tp=8), precision="bf16")):
        assert ANNOTATION_FP8_KERNELS not in render_deployment(cfg, "x")["metadata"]["annotations"]


def test_speculative_decoding_per_engine():
    vllm = engine_args(
        ServingConfig(
            "vllm", MODEL, NVIDIA, Layout(tp=8), spec_method="eagle3", num_speculative_tokens=3, draft_model="org/draft"
        )
    )
    assert json.loads(_value(vllm, "--speculative-config")) == {
        "method": "eagle3",
        "model": "org/draft",
        "num_speculative_tokens": 3,
    }
    sgl = engine_args(
        ServingConfig("sglang", MOE_MODEL, AMD, Layout(tp=8), spec_method="mtp", num_speculative_tokens=3)
    )
    assert _value(sgl, "--speculative-algorithm") == "NEXTN"
    assert _value(sgl, "--speculative-num-steps") == "3"
    assert _value(sgl, "--speculative-eagle-topk") == "1"
    assert _value(sgl, "--speculative-num-draft-tokens") == "4"
    atom = engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=8), spec_method="mtp", num_speculative_tokens=3))
    assert _value(atom, "--method") == "mtp"
    assert _value(atom, "--num-speculative-tokens") == "3"


def test_disaggregation_roles():
    sgl = engine_args(ServingConfig("sglang", MOE_MODEL, AMD, Layout(tp=8), disagg_role="decode"))
    assert _value(sgl, "--disaggregation-mode") == "decode"
    vllm = engine_args(ServingConfig("vllm", MOE_MODEL, NVIDIA, Layout(tp=8), disagg_role="prefill"))
    assert json.loads(_value(vllm, "--kv-transfer-config"))["kv_connector"] == "NixlConnector"
    atom_p = engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=8), disagg_role="prefill"))
    atom_d = engine_args(ServingConfig("atom", MOE_MODEL, AMD, Layout(tp=8), disagg_role="decode"))
    assert json.loads(_value(atom_p, "--kv-transfer-config"))["kv_role"] == "kv_producer"
    assert json.loads(_value(atom_d, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    dep = render_deployment(ServingConfig("vllm", MOE_MODEL, NVIDIA, Layout(tp=8), disagg_role="prefill"), "p")
    assert dep["metadata"]["labels"]["inferasim.io/disagg-role"] == "prefill"
    env_names = [e["name"] for e in _container(dep)["env"]]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" in env_names


# ---------------------------------------------------------------------------------------------
# extra_args
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_unknown_extra_arg_is_rejected(engine):
    cfg = ServingConfig(engine, MODEL, AMD, Layout(tp=8), extra_args=("--definitely-not-a-flag", "1"))
    with pytest.raises(ValueError, match="--definitely-not-a-flag"):
        engine_args(cfg)
    with pytest.raises(ValueError, match="--definitely-not-a-flag"):
        render_manifests(cfg, "x")


def test_extra_args_pass_through():
    cfg = ServingConfig("vllm", MODEL, AMD, Layout(tp=8), extra_args=["--enforce-eager"])  # a list is accepted
    assert cfg.extra_args == ("--enforce-eager",) and hash(cfg)
    argv = engine_args(
        ServingConfig("vllm", MODEL, AMD, Layout(tp=8), extra_args=("--enforce-eager", "--block-size", "1"))
    )
    assert argv[-3:] == ["--enforce-eager", "--block-size", "1"]
    argv = engine_args(ServingConfig("vllm", MODEL, AMD, Layout(tp=8), extra_args=("--scheduling-policy=priority",)))
    assert argv[-1] == "--scheduling-policy=priority"
    argv = engine_args(ServingConfig("sglang", MODEL, AMD, Layout(tp=8), extra_args=("--chunked-prefill-size", "-1")))
    assert argv[-2:] == ["--chunked-prefill-size", "-1"]
    argv = engine_args(ServingConfig("atom", MODEL, AMD, Layout(tp=8), extra_args=("--block_size", "1")))
    assert argv[-2:] == ["--block_size", "1"]  # ATOM accepts snake spellings


@pytest.mark.parametrize(
    ("engine", "extra", "match"),
    [
        ("vllm", ("--tensor-parallel-size", "2"), "duplicates"),
        ("vllm", ("-tp", "2"), "duplicates"),  # alias of a rendered flag
        ("vllm", ("--port", "9000"), "duplicates"),
        ("sglang", ("--tp", "2"), "duplicates"),
        ("sglang", ("--host", "127.0.0.1"), "duplicates"),
        ("atom", ("--tensor_parallel_size", "2"), "duplicates"),
        ("vllm", ("--enable-prefix-caching",), "duplicates"),  # conflicts with --no-enable-prefix-caching
        ("vllm", ("--block-size",), "needs a value"),
        ("vllm", ("--enforce-eager", "yes"), "not preceded by a flag"),
        ("vllm", ("stray",), "not preceded by a flag"),
        ("vllm", ("--enforce-eager=true",), "takes no value"),
    ],
)
def test_bad_extra_args(engine, extra, match):
    kw = {"prefix_caching": False} if "--enable-prefix-caching" in extra else {}
    with pytest.raises(ValueError, match=match):
        engine_args(ServingConfig(engine, MODEL, AMD, Layout(tp=8), extra_args=extra, **kw))


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "gpu", "layout"), list(_combos()))
def test_deployment_resources_scheduling_probes(engine, gpu, layout):
    cfg = _full(engine, gpu, layout)
    g = get_gpu(gpu)
    dep = render_deployment(cfg, "chat-70b", "llm")
    assert dep["apiVersion"] == "apps/v1" and dep["kind"] == "Deployment"
    assert dep["metadata"]["namespace"] == "llm"
    assert dep["spec"]["replicas"] == 2
    c = _container(dep)
    port = default_port(engine)

    # GPUs: exactly the replica's GPUs of the vendor's resource, nothing of the other vendor's
    res = c["resources"]
    assert res["limits"][g.resource_name] == str(layout.gpus)
    assert res["requests"][g.resource_name] == str(layout.gpus)
    other = "nvidia.com/gpu" if g.vendor == "amd" else "amd.com/gpu"
    assert other not in res["limits"] and other not in res["requests"]
    assert "cpu" in res["requests"] and res["requests"]["memory"].endswith("Gi")

    # node selection from the catalogue
    pod = dep["spec"]["template"]["spec"]
    if g.vendor == "nvidia":
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": g.product_label}
    else:
        # The product name or the device id: the ROCm labeller's default flags emit only the second.
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        exprs = [t["matchExpressions"][0] for t in terms]
        assert {"key": "amd.com/gpu.product-name", "operator": "In", "values": [g.product_label]} in exprs
        assert any(e["key"] == "amd.com/gpu.device-id" and e["values"] for e in exprs) and "nodeSelector" not in pod
        assert read_deployment(dep).config.gpu == g.name  # the reader finds the GPU in the affinity
    assert {"key": g.resource_name, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]

    # argv split into command + args
    assert c["command"] + c["args"] == engine_args(cfg)
    assert c["command"] == launch_command(engine)
    assert c["image"] == default_image(engine, g.vendor, g.name)

    # port and probes
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/health"
        assert get["port"] == port

    # shared memory
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    shm = vols[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"].endswith("Gi")

    # labels and selector
    labels = dep["metadata"]["labels"]
    assert labels[LABEL_NAME] == "chat-70b"
    assert labels[LABEL_ENGINE] == engine
    assert labels[LABEL_LAYOUT] == layout.label()
    tmpl_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= tmpl_labels.items()

    # env: engine_env plus the optional HF token
    env = {e["name"]: e.get("value") for e in c["env"]}
    for k, v in engine_env(cfg).items():
        assert env[k] == v
    assert env["HF_HOME"] == HF_HOME


@pytest.mark.parametrize("engine", ["vllm", "sglang", "atom"])
def test_service_matches_container_port(engine):
    cfg = ServingConfig(engine, MODEL, AMD, Layout(tp=4))
    dep, svc, pdb = render_manifests(cfg, "svc-test", "ns1")
    assert pdb["kind"] == "PodDisruptionBudget" and pdb["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    c = _container(dep)
    assert svc["apiVersion"] == "v1" and svc["kind"] == "Service"
    assert svc["spec"]["type"] == "ClusterIP"
    (sport,) = svc["spec"]["ports"]
    assert sport["name"] == "http"
    assert sport["port"] == c["ports"][0]["containerPort"] == default_port(engine)
    assert sport["targetPort"] == c["ports"][0]["name"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] == "ns1"
    assert render_service(cfg, "svc-test", "ns1") == svc


@pytest.mark.parametrize(("engine", "gpu", "layout"), list(_combos()))
def test_yaml_round_trip(engine, gpu, layout):
    manifests = render_manifests(_full(engine, gpu, layout, draft_model=None), "rt")
    text = to_yaml(manifests)
    assert text.count("\n---\n") == 2  # Deployment, Service, PodDisruptionBudget
    assert list(yaml.safe_load_all(text)) == manifests


def test_env_per_vendor_and_engine():
    assert engine_env(ServingConfig("vllm", MODEL, AMD, Layout(tp=8)))["VLLM_ROCM_USE_AITER"] == "1"
    assert engine_env(ServingConfig("sglang", MODEL, AMD, Layout(tp=8)))["SGLANG_USE_AITER"] == "1"
    for engine in ("vllm", "sglang"):
        env = engine_env(ServingConfig(engine, MODEL, NVIDIA, Layout(tp=8)))
        assert "VLLM_ROCM_USE_AITER" not in env and "SGLANG_USE_AITER" not in env
        assert env["HF_HOME"] == HF_HOME


def test_user_labels_merge_but_cannot_break_selector():
    cfg = ServingConfig("vllm", MODEL, AMD, Layout(tp=8))
    dep = render_deployment(cfg, "m", labels={"team": "llm", LABEL_NAME: "other"})
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "llm"
    assert labels[LABEL_NAME] == "m" == dep["spec"]["selector"]["matchLabels"][LABEL_NAME]


def test_image_override_and_engine_version():
    cfg = ServingConfig("vllm", MODEL, AMD, Layout(tp=8), image="registry.local/vllm:dev")
    assert _container(render_deployment(cfg, "m"))["image"] == "registry.local/vllm:dev"
    cfg = ServingConfig("vllm", MODEL, AMD, Layout(tp=8), engine_version="0.10.1")
    assert _container(render_deployment(cfg, "m"))["image"] == "vllm/vllm-openai-rocm:v0.10.1"
    cfg = ServingConfig("sglang", MODEL, AMD, Layout(tp=8), engine_version="v0.5.9")
    assert _container(render_deployment(cfg, "m"))["image"] == "lmsysorg/sglang:v0.5.9-rocm720-mi35x"
    cfg = ServingConfig("atom", MODEL, AMD, Layout(tp=8), engine_version="9.9.9")
    with pytest.raises(ValueError, match="set image explicitly"):
        render_deployment(cfg, "m")


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "gpu", "layout"),
    [
        ("vllm", AMD, Layout(tp=8, pp=2)),
        ("sglang", NVIDIA, Layout(tp=8, dp=2)),
        ("atom", AMD, Layout(tp=4, pp=4)),
        ("vllm", "GB200", Layout(tp=8)),  # 4 GPUs per GB200 node
    ],
)
def test_a_multi_node_layout_is_no_single_pod(engine, gpu, layout):
    """One pod cannot hold a replica larger than a node: the single-pod renderers refuse it and say
    what renders it (a LeaderWorkerSet) or what to choose instead."""
    cfg = ServingConfig(engine, MODEL, gpu, layout)
    for render in (engine_args, lambda c: render_deployment(c, "m")):
        with pytest.raises(ValueError, match="LeaderWorkerSet") as err:
            render(cfg)
        msg = str(err.value)
        assert "layout.tp" in msg and "layout.pp" in msg and "layout.dp" in msg
        assert "gpus_per_node" in msg
    if engine == "atom":  # ATOM's launch across nodes is not catalogued: refused, naming the way out
        with pytest.raises(ValueError, match="atom multi-node serving is not rendered"):
            render_manifests(cfg, "m")
    else:
        assert render_manifests(cfg, "m")[0]["kind"] == "LeaderWorkerSet"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_multi_node_replica_renders_as_a_leader_worker_set(engine):
    """Llama-3.1-405B at tp8 x pp2 on 8-GPU H100 nodes: one LeaderWorkerSet group of 2 pods per replica,
    8 GPUs each; every pod runs the engine with its multi-node flags (the leader's address and the
    pod's rank from LWS's environment); only the leader serves HTTP, and the Service sends to it."""
    from inferasim.core.engine_args import LWS_LEADER_ADDRESS, LWS_WORKER_INDEX, MULTINODE_PORT
    from inferasim.render import LABEL_NODE_ROLE

    cfg = ServingConfig(engine, "meta-llama/Llama-3.1-405B-Instruct", NVIDIA, Layout(tp=8, pp=2), replicas=3)
    lws, svc, pdb = render_manifests(cfg, "big", "llm")
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["replicas"] == 3 and spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = spec["leaderWorkerTemplate"]["leaderTemplate"]
    worker = spec["leaderWorkerTemplate"]["workerTemplate"]
    for t in (leader, worker):
        c = t["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"  # a whole node, not the replica's 16
        args = c["args"]
        assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--node-rank") + 1] == LWS_WORKER_INDEX
        addr = "--master-addr" if engine == "vllm" else "--dist-init-addr"
        want = LWS_LEADER_ADDRESS if engine == "vllm" else f"{LWS_LEADER_ADDRESS}:{MULTINODE_PORT[engine]}"
        assert args[args.index(addr) + 1] == want
    lc, wc = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
    assert "readinessProbe" in lc and "readinessProbe" not in wc and "ports" not in wc
    assert ("--headless" in wc["args"]) == (engine == "vllm") and "--headless" not in lc["args"]
    assert leader["metadata"]["labels"][LABEL_NODE_ROLE] == "leader"
    assert worker["metadata"]["labels"][LABEL_NODE_ROLE] == "worker"
    assert svc["spec"]["selector"].items() <= leader["metadata"]["labels"].items()
    assert not svc["spec"]["selector"].items() <= worker["metadata"]["labels"].items()
    assert pdb["kind"] == "PodDisruptionBudget"


def test_a_replica_of_part_of_a_node_beyond_one_is_refused():
    """12 GPUs on 8-GPU nodes: a multi-node replica takes whole nodes; the error says so."""
    cfg = ServingConfig("vllm", "meta-llama/Llama-3.1-405B-Instruct", NVIDIA, Layout(tp=4, pp=3))
    with pytest.raises(ValueError, match="not a whole number of"):
        render_manifests(cfg, "m")


def test_atom_on_nvidia_is_rejected():
    with pytest.raises(ValueError, match="ATOM is ROCm-only"):
        ServingConfig("atom", MODEL, NVIDIA, Layout(tp=8))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"memory_fraction": 0.0}, r"memory_fraction .*\(0, 1\]"),
        ({"memory_fraction": 1.5}, r"memory_fraction .*\(0, 1\]"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"chunked_prefill": "yes"}, "chunked_prefill"),
        ({"precision": "fp7"}, "precision.*accepted: auto"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype.*accepted"),
        ({"spec_method": "medusa"}, "spec_method.*accepted"),
        ({"spec_method": "mtp"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 2}, "num_speculative_tokens"),
        ({"spec_method": "eagle3", "num_speculative_tokens": 2}, "draft_model"),
        ({"disagg_role": "both"}, "disagg_role.*prefill, decode"),
        ({"extra_args": ("--block-size", 16)}, "extra_args"),
        ({"extra_args": "--enforce-eager"}, "extra_args"),
    ],
)
def test_field_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        ServingConfig("vllm", MODEL, AMD, Layout(tp=8), **kw)


def test_engine_specific_validation():
    assert ServingConfig("vllm", MODEL, AMD, Layout(), memory_fraction=1.0).memory_fraction == 1.0
    with pytest.raises(ValueError, match="kv_cache_dtype.*atom"):
        ServingConfig("atom", MODEL, AMD, Layout(), kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="not supported by atom"):
        ServingConfig("atom", MODEL, AMD, Layout(), spec_method="ngram", num_speculative_tokens=3)
    with pytest.raises(ValueError, match="unknown serving engine"):
        ServingConfig("tgi", MODEL, AMD, Layout())
    with pytest.raises(ValueError, match="Unknown GPU"):
        ServingConfig("vllm", MODEL, "MI999X", Layout())
    with pytest.raises(ValueError, match="model"):
        ServingConfig("vllm", "--model", AMD, Layout())
    assert ServingConfig("vLLM", MODEL, AMD, Layout()).engine == "vllm"


@pytest.mark.parametrize("name", ["Bad_Name", "1abc", "a" * 64, ""])
def test_bad_names_are_rejected(name):
    cfg = ServingConfig("vllm", MODEL, AMD, Layout())
    with pytest.raises(ValueError, match="name"):
        render_manifests(cfg, name)


def test_render_does_not_import_kubernetes_or_kopf():
    code = (
        "import sys, inferasim.render as r; "
        "bad = [m for m in ('kubernetes', 'kopf') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "engine,model,precision,ok",
    [
        ("vllm", "meta-llama/Meta-Llama-3.1-70B", "fp8", True),  # online --quantization fp8
        ("sglang", "meta-llama/Meta-Llama-3.1-70B", "fp8", True),
        ("atom", "meta-llama/Meta-Llama-3.1-70B", "fp8", False),  # ATOM has no online quantization
        ("vllm", "deepseek-ai/DeepSeek-R1", "fp4", False),  # an FP8 checkpoint priced at fp4
        ("vllm", "deepseek-ai/DeepSeek-R1", "bf16", False),  # nor is it served at 16 bits
        ("vllm", "deepseek-ai/DeepSeek-R1", "fp8", True),
        ("vllm", "deepseek-ai/DeepSeek-R1", "auto", True),
        ("vllm", "nvidia/Qwen3.5-397B-A17B-NVFP4", "fp4", True),
        ("vllm", "openai/gpt-oss-120b", "fp4", True),  # MXFP4 is a 4-bit float checkpoint
        ("vllm", "Qwen/Qwen3.5-397B-A17B", "fp4", False),
        ("vllm", "someone/unknown-model", "fp4", True),  # not in the catalog: not judged
    ],
)
def test_precision_error_names_what_the_engine_would_run(engine: str, model: str, precision: str,
                                                         ok: bool) -> None:
    from inferasim.catalog.checkpoints import precision_error

    why = precision_error(engine, model, precision)
    assert (why is None) == ok, why
    if not ok:
        assert model in why and precision in why
    if model == "Qwen/Qwen3.5-397B-A17B" and not ok:
        assert "nvidia/Qwen3.5-397B-A17B-NVFP4" in why  # where the weights of that precision are


def test_render_refuses_a_precision_the_checkpoint_would_not_run() -> None:
    cfg = ServingConfig(engine="vllm", model="deepseek-ai/DeepSeek-R1", gpu="B200", layout=Layout(tp=8),
                        precision="fp4")
    with pytest.raises(ValueError, match="would serve deepseek-ai/DeepSeek-R1 at fp8, not fp4"):
        render_deployment(cfg, "r1")


def test_the_manifest_serves_the_checkpoint_the_user_named() -> None:
    from inferasim.render import served_model_id

    # A variant the catalog prices by its base (another org's FP8 build) is rendered as named, and
    # its own FP8 weights need no online quantization flag.
    cfg = ServingConfig(engine="vllm", model="RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", gpu="H100",
                        layout=Layout(tp=2), precision="fp8")
    args = render_deployment(cfg, "chat")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8" in args and "--quantization" not in args
    assert served_model_id("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B") == \
        "meta-llama/Llama-3.1-70B-Instruct"
    # A config.json path serves the id its file name spells, or is refused.
    assert served_model_id("/x/deepseek-ai--DeepSeek-R1_config.json", "deepseek-ai/DeepSeek-R1") == \
        "deepseek-ai/DeepSeek-R1"
    with pytest.raises(ValueError, match="names no Hugging Face id"):
        served_model_id("/x/config.json", "config")
