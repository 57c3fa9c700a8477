"""The emulator's API errors in OpenAI's shape, and step-time parameter updates checked as stored
anchors are (`merge_params`)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from inferasim.errors import InferasimError
from inferasim.model.steptime import StepParams, param_error

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowedError",
                413: "BadRequestError", 431: "BadRequestError", 500: "InternalServerError",
                503: "ServiceUnavailableError"}


class ApiError(InferasimError):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        # OpenAI's error shape: the openai client reads body["error"]["message"].
        return json.dumps({"error": {"message": self.message, "type": _ERROR_TYPES.get(self.status, "Error"),
                                     "param": self.param, "code": self.status}}).encode()


def merge_params(current: StepParams, values: dict[str, Any]) -> StepParams:
    """`current` with `values` applied; ApiError naming unknown or out-of-range fields."""
    known = StepParams.__dataclass_fields__
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ApiError(400, f"unknown step-time parameters {unknown}; known: {sorted(known)}", unknown[0])
    clean: dict[str, float] = {}
    for name, value in values.items():
        error = param_error(name, value)  # the rule stored anchors follow too
        if error:
            raise ApiError(400, error, name)
        clean[name] = float(value)
    return replace(current, **clean)


def server_info(engine: str, model: str, config: Any) -> dict[str, Any]:
    """How the emulated engine was launched, as the engine itself says it: SGLang's GET
    /get_server_info (its ServerArgs) or vLLM's GET /server_info (dev mode: the text of its
    VllmConfig), with the emulated layout's widths under the engines' own names (`config`: the
    EmulatorConfig)."""
    if engine == "sglang":
        return {"model_path": model, "tp_size": config.tp, "dp_size": config.dp, "ep_size": config.ep,
                "pp_size": config.pp, "enable_dp_attention": config.dp > 1,
                "version": config.engine_version or "emulated"}
    return {"vllm_config": f"model='{model}', tensor_parallel_size={config.tp}, "
                           f"pipeline_parallel_size={config.pp}, data_parallel_size={config.dp}, "
                           f"enable_expert_parallel={config.ep > 1}"}
