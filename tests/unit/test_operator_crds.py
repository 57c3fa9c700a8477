"""The CRDs are generated from the pydantic models, structural, and in sync with crds/ and the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from inferasim_operator import crds
from inferasim_operator.rbac import CLUSTER_RULES, NAMESPACE_RULES, OPERATOR_NAMESPACE_RULES, RULE_FILES
from inferasim_operator.schema import SchemaConversionError, structural
from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]


def test_generated_files_match_the_models() -> None:
    # Drift: someone changed a model (spec.py, anchors.py, models.py, rbac.py) without `make crds`.
    assert crds.main(["--check"]) == 0, "run `make crds`"


def test_check_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crds.main(["--out", str(tmp_path)]) == 0
    assert crds.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "servingtunings.inferasim.io.yaml").write_text("stale\n")
    (tmp_path / "old.yaml").write_text("x: 1\n")
    assert crds.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "servingtunings" in err and "old.yaml (not generated)" in err


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in (node.get("properties") or {}).items():
        out += walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        out += walk(node["items"], f"{path}[]")
    return out


# No free-form value left in either CRD: tolerations are typed (core/v1 Toleration's fields).
@pytest.mark.parametrize("crd,free_form", [(crds.tuning_crd(), []), (crds.anchor_crd(), [])], ids=["tuning", "anchor"])
def test_structural(crd: dict[str, Any], free_form: list[str]) -> None:
    v = crd["spec"]["versions"][0]
    assert v["subresources"] == {"status": {}}
    schema = v["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "type" in node, f"{path} has no type"
        for bad in ("$ref", "$defs", "anyOf", "allOf", "title", "default", "prefixItems", "const"):
            assert bad not in node, f"{path} has {bad}"
        if node.get("additionalProperties") is False:
            pytest.fail(f"{path}: additionalProperties false")
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # only free-form values (maps of Any)
            assert node["type"] == "object" and "properties" not in node, path
    # unknown fields are kept only where values are free form
    assert [p for p, n in walk(schema) if n.get("x-kubernetes-preserve-unknown-fields")] == free_form


def test_tuning_spec_validation() -> None:
    spec = crds.tuning_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert set(spec["required"]) >= {"target", "model", "hardware", "workload"}
    assert "nullable" not in props["target"]
    assert props["engines"]["items"]["enum"] == ["vllm", "sglang", "atom"]
    assert props["hardware"]["properties"]["maxGPUs"]["minimum"] == 1
    slo = props["objective"]["properties"]["slo"]["properties"]["ttftP90Ms"]
    assert slo == {"type": "number", "description": slo["description"], "minimum": 0, "exclusiveMinimum": True,
                   "maximum": 86_400_000, "nullable": True}
    assert props["confirmation"]["properties"]["mode"]["enum"] == ["none", "canary", "argo-rollouts"]
    assert props["workload"]["oneOf"] == [{"required": ["static"]}, {"required": ["prometheus"]},
                                          {"required": ["trace"]}]
    tol = props["harvest"]["properties"]["tolerations"]
    assert tol["maxItems"] == 32 and "x-kubernetes-preserve-unknown-fields" not in tol["items"]
    assert set(tol["items"]["properties"]) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    assert tol["items"]["properties"]["operator"]["enum"] == ["Exists", "Equal"]
    assert tol["items"]["properties"]["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule", "NoExecute"]
    assert tol["items"]["properties"]["tolerationSeconds"]["minimum"] == 0


def test_the_api_server_bounds_what_once_broke_the_operator() -> None:
    """Strings, maps and numbers that made a pass fail (a 100,000-character model, 2,000 selector
    labels, a 5,000-digit window) are bounded in the schema, so the API server refuses them."""
    props = crds.tuning_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    from inferasim.catalog.models import MODEL_ID_PATTERN

    assert props["model"]["maxLength"] == 200 and props["model"]["pattern"] == MODEL_ID_PATTERN
    prom = props["workload"]["properties"]["prometheus"]["properties"]
    assert prom["selector"]["maxProperties"] == 32 and prom["selector"]["additionalProperties"]["maxLength"] == 256
    assert prom["url"]["maxLength"] == 2048 and prom["window"]["maxLength"] == 32
    conf = props["confirmation"]["properties"]
    assert conf["window"]["maxLength"] == 32 and conf["startupTimeout"]["maxLength"] == 32
    assert props["retune"]["properties"]["every"]["maxLength"] == 32
    assert props["target"]["properties"]["name"]["maxLength"] == 253
    hw = props["hardware"]["properties"]
    assert hw["maxGPUs"]["maximum"] == 65536 and hw["gpusPerNode"]["maximum"] == 1024
    assert hw["pricePerGpuHour"]["maximum"] == 10_000
    static = props["workload"]["properties"]["static"]["properties"]
    assert static["requestRate"]["maximum"] == 1e6 and static["inputTokens"]["maximum"] == 10_000_000
    harvest = props["harvest"]["properties"]
    assert harvest["nodeSelector"]["maxProperties"] == 32 and harvest["images"]["maxProperties"] == 3
    assert harvest["deadlineMinutes"]["maximum"] == 10_080
    # Every string, number, map and list of the spec carries a bound (an enum bounds itself).
    spec = crds.tuning_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in walk(spec):
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") in ("number", "integer"):
            assert "maximum" in node, path


def test_printer_columns_and_names() -> None:
    t = crds.tuning_crd()
    cols = {c["name"]: c["jsonPath"] for c in t["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["Target"] == ".spec.target.name" and cols["Phase"] == ".status.phase"
    assert cols["Engine"] == ".status.recommendation.engine" and cols["Layout"] == ".status.recommendation.layoutLabel"
    assert cols["Tok/s/GPU"] == ".status.recommendation.predicted.throughputPerGpu" and "Age" in cols
    status = t["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    # every printer column's path exists in the status schema
    assert "layoutLabel" in status["recommendation"]["properties"]
    assert "throughputPerGpu" in status["recommendation"]["properties"]["predicted"]["properties"]
    assert status["shortlist"]["maxItems"] == 5 and status["history"]["maxItems"] == 10
    assert t["spec"]["scope"] == "Namespaced" and t["metadata"]["name"] == "servingtunings.inferasim.io"
    a = crds.anchor_crd()
    assert a["spec"]["scope"] == "Cluster" and a["spec"]["names"]["kind"] == "ServingAnchor"
    kernel = a["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["kernel_set"]
    assert kernel["properties"]["engine"]["enum"] == ["vllm", "sglang", "atom"]


def test_chart_holds_the_same_crds_and_rules() -> None:
    chart = REPO / "charts" / "inferasim-operator"
    for f in (REPO / "crds").glob("*.yaml"):
        assert (chart / "crds" / f.name).read_text() == f.read_text()
    for name, rules in RULE_FILES.items():
        assert yaml.safe_load((chart / "files" / name).read_text()) == rules
    assert '.Files.Get "files/clusterrole-rules.yaml"' in (chart / "templates" / "clusterrole.yaml").read_text()
    roles = (chart / "templates" / "roles.yaml").read_text()
    assert '.Files.Get "files/namespace-rules.yaml"' in roles
    assert '.Files.Get "files/operator-namespace-rules.yaml"' in roles
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["metrics"]["serviceMonitor"]["enabled"] is False
    for t in ("deployment.yaml", "service.yaml", "serviceaccount.yaml", "servicemonitor.yaml"):
        assert (chart / "templates" / t).exists()


def test_rbac_is_least_privilege() -> None:
    for rule in CLUSTER_RULES + NAMESPACE_RULES + OPERATOR_NAMESPACE_RULES:
        assert "secrets" not in rule["resources"], rule
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
    # Cluster-wide: reads, and writes only to the cluster-scoped ServingAnchors.
    writes = {"create", "update", "patch", "delete"}
    for rule in CLUSTER_RULES:
        assert not writes & set(rule["verbs"]) or rule["resources"][0].startswith("servinganchors"), rule
    jobs = next(r for r in NAMESPACE_RULES if r["resources"] == ["jobs"])
    # One at a time (a tuning's own running Job when its harvesting is switched off), never a
    # collection; finished Jobs go with the garbage collector.
    assert "deletecollection" not in jobs["verbs"]


# -- the converter on its own ------------------------------------------------------------------


class Inner(BaseModel):
    x: int = Field(1, gt=0, lt=10, description="x")


class Outer(BaseModel):
    a: Inner | None = Field(None, description="optional inner")
    b: list[Inner] = Field(default_factory=list)
    c: dict[str, float] = Field(default_factory=dict)
    d: dict[str, object] = Field(default_factory=dict)
    e: str = "k"


def test_converter_inlines_and_flattens() -> None:
    s = structural(Outer.model_json_schema())
    a = s["properties"]["a"]
    assert a["nullable"] is True and a["description"] == "optional inner" and a["type"] == "object"
    assert a["properties"]["x"] == {"type": "integer", "description": "x", "minimum": 0, "maximum": 10,
                                    "exclusiveMinimum": True, "exclusiveMaximum": True}
    assert s["properties"]["b"]["items"]["properties"]["x"]["type"] == "integer"
    assert s["properties"]["c"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert s["properties"]["d"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert s["properties"]["e"] == {"type": "string"}


class Union(BaseModel):
    u: int | str


def test_converter_refuses_what_has_no_structural_form() -> None:
    with pytest.raises(SchemaConversionError, match="u"):
        structural(Union.model_json_schema())
