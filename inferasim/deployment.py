"""Read a Kubernetes Deployment of vLLM, SGLang or ATOM back into a serving configuration.

The inverse of :mod:`inferasim.render`: what a live deployment runs (engine, engine version,
model, GPU, precision, KV dtype, layout, replicas, scheduler knobs) is what names its kernel set
and layout, which is what a passive anchor or a prediction-error check needs.

Two kinds of manifests are read:

* rendered by inferasim (``inferasim.io/*`` annotations and labels): the annotations are
  authoritative, so ``read_deployment(render_deployment(cfg, name)).config == cfg``;
* hand-written: the engine container's command/args (``vllm serve MODEL --tensor-parallel-size 8``,
  ``python3 -m sglang.launch_server --model-path M --tp 8``, ``python3 -m
  atom.entrypoints.openai_server --model M -tp 8``, also inside ``sh -c "..."``), the image tag
  (engine version), the GPU resource (``amd.com/gpu`` / ``nvidia.com/gpu``) and the node product
  label (``amd.com/gpu.product-name``, ``nvidia.com/gpu.product``, ``amd.com/gpu.device-id``) in
  the nodeSelector or a required node affinity.

Nothing that decides the kernel set is guessed: an unknown GPU type, an image tag without a
version, an unknown quantization or an engine that cannot be told raise :class:`DeploymentError`
naming the field and the fix (usually a keyword override: ``gpu=``, ``engine_version=``,
``precision=``; on the command line ``--gpu``, ``--engine-version``, ``--precision``).

The engine's command line (its flags and the fields they decide) is read by
:mod:`inferasim.engine_cmdline`; this module reads the rest of the manifest (replicas, GPU resources
and node placement, image, annotations) and puts them together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferasim.catalog.engines import UnknownEngineError, default_port, flag_for, normalize_engine
from inferasim.catalog.gpus import GPU, UnknownGPUError, get_gpu
from inferasim.catalog.userfile import UserFileError, load_yaml_all, read_user_text
from inferasim.core.config import ServingConfig
from inferasim.core.layout import Layout
from inferasim.engine_cmdline import (
    ANN_MODEL,
    ANN_VERSION,
    ENTRYPOINT_IMAGE,
    DeploymentError,
    consumed_flags,
    container_argv,
    disagg_role_of,
    flag_int,
    kv_dtype_of,
    launch_of,
    layout_of,
    model_of,
    parse_flags,
    precision_of,
    role_float,
    role_int,
    spec_of,
)
from inferasim.model.anchors import KernelSet
from inferasim.render import AMD_DEVICE_IDS, LABEL_GPU, PRODUCT_LABEL_KEY, RENDERED_PD_DEFAULTS, image_of

__all__ = ["DeploymentError", "LiveDeployment", "engine_version_from_image", "kernel_set_of", "read_deployment"]

# GPU of each amd.com/gpu.device-id value (the table render selects nodes by).
_AMD_DEVICE_IDS: dict[str, str] = {i: name for name, ids in AMD_DEVICE_IDS.items() for i in ids}

_VERSION = r"\d+\.\d+(?:\.\d+)*(?:rc\d+|\.post\d+|\.dev\d+)?"


@dataclass(frozen=True)
class LiveDeployment:
    """What a Deployment runs. ``config`` is the :class:`~inferasim.render.ServingConfig` it renders
    from; the rest are facts the config does not carry but a kernel set or a Prometheus selector needs."""

    config: ServingConfig
    name: str
    namespace: str
    image: str
    container: str
    port: int
    served_model_name: str | None = None
    attention_backend: str = "auto"
    graph_mode: str = "default"
    pod_labels: tuple[tuple[str, str], ...] = ()
    unrecognized_args: tuple[str, ...] = ()  # flags not in the engine catalogue, passed over

    @property
    def engine(self) -> str:
        return self.config.engine

    @property
    def layout(self) -> Layout:
        return self.config.layout

    @property
    def gpu(self) -> GPU:
        return self.config.gpu_spec

    def kernel_set(self) -> KernelSet:
        """The kernel set this deployment runs, spelled as the harvester spells it (so a harvested
        and a passive anchor of one deployment compare equal): precision "" for the checkpoint's own,
        the KV dtype "fp8" for any fp8 cache, and for an unset cache dtype the benchmark rule of
        :func:`inferasim.model.predictor.benchmark_kv_dtype` that the harvester and the emulator use."""
        return kernel_set_of(self.config, self.attention_backend, self.graph_mode)


def kernel_set_of(cfg: ServingConfig, attention_backend: str = "auto", graph_mode: str = "default") -> KernelSet:
    """The kernel set of a serving configuration (see :meth:`LiveDeployment.kernel_set`)."""
    from inferasim.model.predictor import benchmark_kv_dtype

    precision = "" if cfg.precision == "auto" else cfg.precision
    kv = cfg.kv_cache_dtype.lower()
    if kv == "auto":
        kv = benchmark_kv_dtype(cfg.precision)
    elif kv.startswith("fp8"):
        kv = "fp8"
    elif kv in ("bf16", "bfloat16"):
        kv = "auto"
    return KernelSet(engine=cfg.engine, engine_version=cfg.engine_version, model=cfg.model,
                     gpu=cfg.gpu_spec.name, precision=precision, kv_dtype=kv, attention_backend=attention_backend,
                     graph_mode=graph_mode, spec_method=cfg.spec_method)


# --------------------------------------------------------------------------------------------------
# manifest -> Deployment dict
# --------------------------------------------------------------------------------------------------


def _load(manifest: Mapping[str, Any] | str | Path, name: str | None) -> dict[str, Any]:
    if isinstance(manifest, Mapping):
        docs: list[Any] = [dict(manifest)]
        where = "the manifest"
    else:
        path = Path(manifest)
        try:
            text = read_user_text(path, "--deployment")
        except UserFileError as exc:
            raise DeploymentError(str(exc)) from None
        try:
            docs = [d for d in load_yaml_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise DeploymentError(f"--deployment {path}: not valid YAML: {exc}") from None
        where = str(path)
    # A List (kubectl get -o yaml) holds its objects in items.
    flat: list[Any] = []
    for d in docs:
        if isinstance(d, Mapping) and d.get("kind") == "List":
            flat.extend(d.get("items") or [])
        else:
            flat.append(d)
    deps = [d for d in flat if isinstance(d, Mapping) and d.get("kind") == "Deployment"]
    if name is not None:
        deps = [d for d in deps if (d.get("metadata") or {}).get("name") == name]
    if not deps:
        kinds = sorted({str(d.get("kind")) for d in flat if isinstance(d, Mapping)})
        what = f" named {name!r}" if name else ""
        raise DeploymentError(f"{where}: no kind: Deployment{what} (found: {', '.join(kinds) or 'nothing'})")
    if len(deps) > 1:
        names = [(d.get("metadata") or {}).get("name") for d in deps]
        raise DeploymentError(f"{where}: {len(deps)} Deployments ({names}); pass name= to pick one")
    return dict(deps[0])


def _get(d: Mapping[str, Any], *path: str) -> Any:
    cur: Any = d
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def engine_version_from_image(image: str) -> str | None:
    """Engine release in an image tag: ``vllm/vllm-openai:v0.10.1`` -> 0.10.1,
    ``lmsysorg/sglang:v0.5.12-rocm720-mi30x`` -> 0.5.12, ``rocm/vllm:rocm6.4.1_vllm_0.9.1_20250715`` ->
    0.9.1, ``rocm/atom:..._atom0.1.4_...`` -> 0.1.4; None for tags without one (latest, nightly, digests)."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.rsplit(":", 1)[1]
    m = re.match(rf"^v?({_VERSION})(?:[-_+]|$)", tag)
    if m:
        return m.group(1)
    m = re.search(rf"(?:vllm|sglang|atom)[-_]?v?({_VERSION})", tag)
    return m.group(1) if m else None


def _engine_version(image: str, annotations: Mapping[str, str], rendered: bool, override: str | None) -> str:
    if override is not None:
        return override
    if ANN_VERSION in annotations:
        return str(annotations[ANN_VERSION])
    if rendered:
        return ""  # rendered from a config whose engine_version was empty: the image is the default one
    version = engine_version_from_image(image)
    if version is None:
        raise DeploymentError(f"image {image!r}: its tag names no engine version (the version is part of the "
                              "kernel set); pass engine_version= (--engine-version), e.g. 0.10.1")
    return version


def _gpu(spec: Mapping[str, Any], container: Mapping[str, Any], labels: Mapping[str, str],
         override: str | None) -> tuple[str, int | None]:
    """(GPU name, GPUs the container requests or None)."""
    resources = container.get("resources") or {}
    count: int | None = None
    vendor: str | None = None
    for section in ("limits", "requests"):
        for key, value in (resources.get(section) or {}).items():
            if key in ("amd.com/gpu", "nvidia.com/gpu"):
                try:
                    count = int(str(value))
                except ValueError:
                    raise DeploymentError(f"resources.{section}[{key}]={value!r} is not a whole number of GPUs") \
                        from None
                vendor = "amd" if key.startswith("amd") else "nvidia"
        if count is not None:
            break
    if override:
        try:
            return get_gpu(override).name, count
        except UnknownGPUError as exc:
            raise DeploymentError(f"--gpu: {exc}") from None
    candidates: list[tuple[str, str]] = []
    if labels.get(LABEL_GPU):
        candidates.append((f"label {LABEL_GPU}", labels[LABEL_GPU]))
    node_sel = spec.get("nodeSelector") or {}
    for key in (*PRODUCT_LABEL_KEY.values(), "amd.com/gpu.device-id"):
        if key in node_sel:
            candidates.append((f"nodeSelector {key}", str(node_sel[key])))
    terms = _get(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                 "nodeSelectorTerms") or []
    for term in terms:
        for expr in (term or {}).get("matchExpressions") or []:
            key = expr.get("key")
            values = expr.get("values") or []
            if key in (*PRODUCT_LABEL_KEY.values(), "amd.com/gpu.device-id") and expr.get("operator") == "In" \
                    and len(values) == 1:
                candidates.append((f"nodeAffinity {key}", str(values[0])))
    for where, value in candidates:
        name = _AMD_DEVICE_IDS.get(value.lower(), value) if "device-id" in where else value
        try:
            gpu = get_gpu(name)
        except UnknownGPUError:
            raise DeploymentError(f"{where}={value!r} is not a GPU inferasim knows; pass gpu= (--gpu), see "
                                  "`inferasim gpus`") from None
        if vendor is not None and gpu.vendor != vendor:
            raise DeploymentError(f"{where}={value!r} is an {gpu.vendor} GPU but the container requests "
                                  f"{vendor}.com/gpu")
        return gpu.name, count
    if count is None:
        raise DeploymentError("the engine container requests no amd.com/gpu or nvidia.com/gpu and the pod names no "
                              "GPU product label; pass gpu= (--gpu)")
    raise DeploymentError(f"GPU type unknown: the container requests {count} {vendor}.com/gpu but the pod selects no "
                          f"product ({PRODUCT_LABEL_KEY[vendor]} in nodeSelector or a required node affinity); "
                          "pass gpu= (--gpu), e.g. --gpu MI300X")


# --------------------------------------------------------------------------------------------------
# the reader
# --------------------------------------------------------------------------------------------------


def read_deployment(manifest: Mapping[str, Any] | str | Path, *, gpu: str | None = None,
                    engine_version: str | None = None, precision: str | None = None,
                    name: str | None = None) -> LiveDeployment:
    """Read a Deployment (a dict, or a YAML file with one or more documents) into a LiveDeployment.

    ``gpu``, ``engine_version`` and ``precision`` override what the manifest says (and are the fix
    the error messages name when it says nothing); ``name`` picks one Deployment of several.
    Raises :class:`DeploymentError` (a ValueError) naming the missing or bad field.
    """
    dep = _load(manifest, name)
    meta = dep.get("metadata") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    pod = _get(dep, "spec", "template") or {}
    pod_spec = pod.get("spec") or {}
    labels = {str(k): str(v) for k, v in ((pod.get("metadata") or {}).get("labels") or {}).items()}
    containers = pod_spec.get("containers") or []
    if not containers:
        raise DeploymentError("spec.template.spec.containers is empty: no engine container")
    found = []
    for c in containers:
        argv = container_argv(c)
        launch = launch_of(argv)
        if launch is not None:
            found.append((c, argv, launch))
    if not found:
        # The vLLM OpenAI image starts the server itself (its ENTRYPOINT): a container that gives
        # only `args` (the server's flags) is the usual way to run it.
        for c in containers:
            if not c.get("command") and ENTRYPOINT_IMAGE.search(str(c.get("image") or "")):
                found.append((c, container_argv(c), ("vllm", 0)))
    if not found:
        names = [c.get("name") for c in containers]
        raise DeploymentError(f"no container of {names} starts vllm (`vllm serve MODEL`), SGLang (`python3 -m "
                              "sglang.launch_server`) or ATOM (`python3 -m atom.entrypoints.openai_server`); "
                              "check the container's command/args")
    container, argv, (engine, start) = found[0]
    try:
        engine = normalize_engine(engine)
    except UnknownEngineError as exc:  # pragma: no cover - _LAUNCH_MODULES holds canonical names
        raise DeploymentError(str(exc)) from None
    image = str(container.get("image") or "")
    if not image:
        raise DeploymentError(f"container {container.get('name')!r} has no image")
    flags = parse_flags(engine, argv[start:])
    rendered = ANN_MODEL in annotations
    layout, copies = layout_of(flags)
    gpu_name, count = _gpu(pod_spec, container, labels, gpu)
    gpus_per_pod = layout.gpus * copies
    if count is not None and count != gpus_per_pod:
        raise DeploymentError(f"the container requests {count} GPUs but its engine flags use {gpus_per_pod} "
                              f"(layout {layout.label()}{f' x {copies} DP copies' if copies > 1 else ''}); "
                              "fix the resources or the parallel flags")
    replicas_raw = _get(dep, "spec", "replicas")
    replicas = 1 if replicas_raw is None else replicas_raw  # the Kubernetes API's own default
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise DeploymentError(f"spec.replicas={replicas_raw!r}: a live deployment needs at least one replica")

    chunked: bool | None = None
    mnbt: int | None = None
    if engine == "sglang":
        cps = flag_int(flags, "--chunked-prefill-size", "chunked prefill size")
        mpt = flag_int(flags, "--max-prefill-tokens", "max prefill tokens")
        if cps == -1:
            chunked, mnbt = False, mpt
        else:
            mnbt = cps
    else:
        mnbt = role_int(flags, "max_num_batched_tokens")
        if flags.has("--enable-chunked-prefill"):
            chunked = True
        elif flags.has("--no-enable-chunked-prefill"):
            chunked = False
    prefix: bool | None = None
    if flags.has_role("disable_prefix_caching"):
        prefix = False
    elif flags.has_role("enable_prefix_caching"):
        prefix = True
    spec_method, k, draft = spec_of(flags)

    consumed = consumed_flags(engine)
    extra: list[str] = []
    for canon, tokens in flags.order:
        value = tokens[0].split("=", 1)[1] if "=" in tokens[0] else (tokens[1] if len(tokens) > 1 else None)
        if canon not in consumed and RENDERED_PD_DEFAULTS.get((engine, canon), object()) != value:
            extra.extend(tokens)
    served = flags.get("--served-model-name")
    if engine == "vllm":
        graph_mode = "eager" if flags.has("--enforce-eager") else "default"
    elif engine == "sglang":
        graph_mode = "eager" if flags.has("--disable-cuda-graph") else "default"
    else:
        graph_mode = "eager" if flags.has("--enforce-eager") else "default"
    attention = flags.get("--attention-backend") or "auto"
    port_raw = flags.role("port")
    try:
        port = int(port_raw) if port_raw is not None else default_port(engine)
    except ValueError:
        raise DeploymentError(f"{engine} {flag_for(engine, 'port')}={port_raw!r} is not a port number") from None

    fields: dict[str, Any] = dict(
        engine=engine, model=model_of(flags, annotations), gpu=gpu_name, layout=layout, replicas=replicas * copies,
        precision=precision_of(flags, annotations, precision), kv_cache_dtype=kv_dtype_of(flags),
        max_num_seqs=role_int(flags, "max_num_seqs"), max_num_batched_tokens=mnbt, chunked_prefill=chunked,
        prefix_caching=prefix, memory_fraction=role_float(flags, "memory_fraction"), spec_method=spec_method,
        num_speculative_tokens=k, max_model_len=role_int(flags, "max_model_len"),
        engine_version=_engine_version(image, annotations, rendered, engine_version),
        disagg_role=disagg_role_of(flags, labels), extra_args=tuple(extra), draft_model=draft)
    try:
        cfg = ServingConfig(**fields)
        # The image is a config field only when it is not the one the renderer would pick anyway.
        try:
            same = image_of(cfg, cfg.gpu_spec) == image
        except ValueError:  # no image derivable for this version: keep the manifest's
            same = False
        if not same:
            cfg = ServingConfig(**fields, image=image)
    except ValueError as exc:
        raise DeploymentError(f"deployment {meta.get('name')!r}: {exc}") from None
    return LiveDeployment(
        config=cfg, name=str(meta.get("name") or ""), namespace=str(meta.get("namespace") or "default"),
        image=image, container=str(container.get("name") or ""), port=port, served_model_name=served,
        attention_backend=attention, graph_mode=graph_mode, pod_labels=tuple(sorted(labels.items())),
        unrecognized_args=tuple(flags.unknown))
