"""GPU prices for costs: the spec's hardware.pricePerGpuHour, else the operator's prices ConfigMap.

A missing, unreadable or bad price leaves a tuning unpriced (the Priced condition says why), never failed.
"""

from __future__ import annotations

import asyncio
import math

from inferasim.core.spec import TuningSpec
from inferasim_operator.kube import ApiException, Kube
from inferasim_operator.settings import Settings


class PriceError(ValueError):
    """A price entry that is not a usable number; ``key`` names the ConfigMap key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


def price_from_data(data: dict[str, str], gpu: str, where: str) -> tuple[float, str] | None:
    """($/GPU-hour, key) for ``gpu`` from a prices ConfigMap's data, keys matched after
    normalize_gpu_name (so `MI300X`, `mi300x` and `AMD_Instinct_MI300X_OAM` are one GPU); None when
    no key names it. PriceError naming the key when its value is not a positive finite number."""
    from inferasim.catalog.gpus import UnknownGPUError, normalize_gpu_name

    want = normalize_gpu_name(gpu)
    for key in sorted(data):
        try:
            if normalize_gpu_name(key) != want:
                continue
        except UnknownGPUError:
            continue  # a GPU this catalog does not know cannot be the tuning's
        raw = data[key]
        try:
            value = float(str(raw).strip().lstrip("$"))
        except ValueError:
            raise PriceError(key, f"{where} key {key!r}: {raw!r} is not a number ($/GPU-hour)") from None
        if not math.isfinite(value) or value <= 0:
            raise PriceError(key, f"{where} key {key!r}: {raw!r} is not a positive price ($/GPU-hour)")
        return value, key
    return None


async def resolve_price(spec: TuningSpec, kube: Kube, settings: Settings) -> tuple[float | None, str, str, str]:
    """(price, condition status, reason, message) of the Priced condition. The spec wins; a
    missing, unreadable or bad ConfigMap entry leaves the tuning unpriced, never failed."""
    if spec.hardware.price_per_gpu_hour is not None:
        p = spec.hardware.price_per_gpu_hour
        return p, "True", "SpecPrice", f"${p:g}/GPU-hour from hardware.pricePerGpuHour"
    ns, name = settings.prices.namespace, settings.prices.config_map
    where = f"ConfigMap {ns}/{name}"
    if not name:
        return None, "False", "NoPrice", "no hardware.pricePerGpuHour and no prices ConfigMap configured"
    try:
        cm = await asyncio.to_thread(kube.get_config_map, ns, name)
    except ApiException as exc:
        return None, "False", "PriceConfigMapUnreadable", f"cannot read {where}: HTTP {exc.status} {exc.reason}"
    if cm is None:
        return None, "False", "NoPrice", f"no hardware.pricePerGpuHour and no {where}: costs are not shown"
    try:
        found = price_from_data(dict(cm.get("data") or {}), spec.hardware.gpu, where)
    except PriceError as exc:
        return None, "False", "BadPrice", str(exc)
    if found is None:
        return None, "False", "NoPrice", f"no hardware.pricePerGpuHour and {where} has no entry for " \
                                         f"{spec.hardware.gpu}: costs are not shown"
    price, key = found
    return price, "True", "ConfigMapPrice", f"${price:g}/GPU-hour from {where} key {key!r}"
