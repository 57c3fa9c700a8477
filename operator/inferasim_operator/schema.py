"""pydantic JSON Schema -> Kubernetes structural OpenAPI v3 schema (valid for Kubernetes 1.20+).

pydantic emits JSON Schema 2020-12: `$ref`/`$defs`, `anyOf [X, null]` for optionals,
`exclusiveMinimum: <number>`, `additionalProperties: false`, `title`s and `default`s. A CRD's
openAPIV3Schema must be *structural*: no references, a `type` on every node, `nullable: true`
instead of a null branch, OpenAPI 3.0's boolean `exclusiveMinimum`, no `additionalProperties: false`
(pruning already drops unknown fields), and `x-kubernetes-preserve-unknown-fields` only where free
form values are allowed (e.g. tolerations). Defaults are dropped: the operator applies them with
the same pydantic models, and API-server defaulting would rewrite what users wrote.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["SchemaConversionError", "structural"]

# Keys a structural schema node may carry (value validations and metadata we keep).
# A tuple, not a set: the generated YAML must not depend on string hashing (the drift test).
_KEEP = ("description", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
         "uniqueItems", "multipleOf", "minProperties", "maxProperties")
# Formats Kubernetes 1.20 validates (others are rejected at CRD creation or ignored).
_FORMATS = {"date-time", "date", "byte", "int32", "int64", "float", "double", "uri", "email", "hostname",
            "ipv4", "ipv6", "uuid", "duration"}


class SchemaConversionError(ValueError):
    """A construct with no structural equivalent; the message names its path."""


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural form of a pydantic ``model_json_schema()`` output (not modified)."""
    defs = schema.get("$defs", {})
    root = {k: v for k, v in schema.items() if k != "$defs"}
    return _node(copy.deepcopy(root), defs, "", ())


def _resolve(node: dict[str, Any], defs: dict[str, Any], path: str, seen: tuple[str, ...]) -> tuple[dict, tuple]:
    ref = node.get("$ref")
    if ref is None:
        return node, seen
    name = ref.rsplit("/", 1)[-1]
    if not ref.startswith("#/$defs/") or name not in defs:
        raise SchemaConversionError(f"{path or '<root>'}: unresolvable $ref {ref}")
    if name in seen:
        raise SchemaConversionError(f"{path or '<root>'}: recursive model {name} cannot be inlined")
    merged = copy.deepcopy(defs[name])
    # Siblings of $ref (a field's own description) win over the referenced model's.
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged, seen + (name,)


def _node(node: dict[str, Any], defs: dict[str, Any], path: str, seen: tuple[str, ...]) -> dict[str, Any]:
    node, seen = _resolve(node, defs, path, seen)
    nullable = False
    for key in ("anyOf", "oneOf"):
        if key not in node:
            continue
        branches = node.pop(key)
        non_null = [b for b in branches if b.get("type") != "null"]
        nullable = len(non_null) < len(branches)
        if len(non_null) != 1:
            raise SchemaConversionError(f"{path or '<root>'}: {key} of {len(non_null)} non-null types has no "
                                        "structural form; use one type")
        inner, seen2 = _resolve(non_null[0], defs, path, seen)
        # The outer node's description/default belong to the field, the branch holds the type.
        outer = {k: v for k, v in node.items() if k not in ("default",)}
        node = {**inner, **outer}
        seen = seen2
        node, seen = _resolve(node, defs, path, seen)
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaConversionError(f"{path or '<root>'}: allOf of {len(parts)} schemas is not supported")
        inner, seen = _resolve(parts[0], defs, path, seen)
        node = {**inner, **node}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "prefixItems" in node:
        raise SchemaConversionError(f"{path}: tuples (prefixItems) have no structural form; annotate a fixed-length "
                                    "array with WithJsonSchema")

    out: dict[str, Any] = {}
    typ = node.get("type")
    if typ is None:
        if "properties" in node or "additionalProperties" in node:
            typ = "object"
        elif "items" in node:
            typ = "array"
        elif "enum" in node and all(isinstance(v, str) for v in node["enum"]):
            typ = "string"
        else:
            raise SchemaConversionError(f"{path or '<root>'}: no type (an untyped `Any` field); give it a type")
    if isinstance(typ, list):
        raise SchemaConversionError(f"{path or '<root>'}: a union of types {typ} has no structural form")
    out["type"] = typ
    for key in _KEEP:
        if key in node:
            out[key] = node[key]
    if "format" in node and node["format"] in _FORMATS:
        out["format"] = node["format"]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node:
            value = node[bound]
            if isinstance(value, bool):  # already OpenAPI 3.0 style
                out[bound] = value
            else:
                out[flag] = value
                out[bound] = True
    if nullable or node.get("nullable"):
        out["nullable"] = True

    if typ == "object":
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if props:
            out["properties"] = {name: _node(sub, defs, f"{path}.{name}" if path else name, seen)
                                 for name, sub in props.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
            # additionalProperties false: pruning drops unknown fields; properties + a schema for the
            # rest has no structural form, so the declared properties are kept.
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = _node(extra, defs, f"{path}.*", seen)
        else:
            # dict[str, Any] or an open object: free form, the only place unknown fields are kept.
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif typ == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise SchemaConversionError(f"{path or '<root>'}: an array needs one items schema")
        out["items"] = _node(items, defs, f"{path}[]", seen)
    return out
