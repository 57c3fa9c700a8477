"""An OpenAI-compatible server whose token timing follows the step-time model (DESIGN.md section 2).

`inferasim emulate` (or `start_emulator(EmulatorConfig(...))` from Python) serves `/v1/models`,
`/v1/completions`, `/v1/chat/completions` (streamed or not), `/health` and `/metrics` with the
real engine's metric names (vLLM `vllm:*` or SGLang `sglang:*`), at `speedup` times real speed:
GPU-free tests of the harvester, the observer and the operator, and demos.
"""

from inferasim.emulator.config import EmulatorConfig, resolve
from inferasim.emulator.process import EmulatorProcess, spawn_emulator
from inferasim.emulator.server import Emulator, EmulatorHandle, run_foreground, start_emulator

__all__ = ["Emulator", "EmulatorConfig", "EmulatorHandle", "EmulatorProcess", "resolve",
           "run_foreground", "spawn_emulator",
           "start_emulator"]
