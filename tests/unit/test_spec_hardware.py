"""hardware.gpusPerNode is held to what a node of the GPU holds (issue 27 item 5)."""

import pytest

from inferasim.core.spec import SpecError, parse_spec

WORKLOAD = {"static": {"kind": "poisson", "requestRate": 1, "inputTokens": 512, "outputTokens": 128}}


def _spec(hardware: dict) -> dict:
    return {"model": "meta-llama/Llama-3.1-70B", "hardware": hardware, "workload": WORKLOAD}


def test_more_gpus_per_node_than_the_platform_holds_is_refused() -> None:
    with pytest.raises(SpecError, match="gpusPerNode=64 exceeds the 8 GPUs a node of MI355X holds"):
        parse_spec(_spec({"gpu": "MI355X", "gpusPerNode": 64, "maxGPUs": 64}))


def test_unset_it_is_the_platforms_own_and_fewer_is_fine() -> None:
    assert parse_spec(_spec({"gpu": "MI355X", "maxGPUs": 16})).hardware.gpus_per_node == 8
    assert parse_spec(_spec({"gpu": "GB200", "maxGPUs": 16})).hardware.gpus_per_node == 4
    assert parse_spec(_spec({"gpu": "MI355X", "gpusPerNode": 4, "maxGPUs": 16})).hardware.gpus_per_node == 4
