"""Which inputs and outputs of a node may hold fp16/bf16, by the op's schema.

A node "in reduced precision" cannot make every float tensor it touches low: `Resize` scales and `Range`
bounds are typed `tensor(float)` whatever the data is, and a type variable bound only by outputs
(`Cast`'s `to`, `ConstantOfShape`'s `value`) is chosen by an attribute, not by what flows in. Such
tensors keep their type; a node none of whose outputs may be low stays fp32 between Casts. The schemas
are ONNX Runtime's, which include ONNX's own and ORT's contrib domains (`com.microsoft`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

LOW_TYPE_STR = {"fp16": "tensor(float16)", "bf16": "tensor(bfloat16)"}


@dataclass(frozen=True)
class LowSlots:
    """Positions of a node's inputs and outputs that take the low type."""

    inputs: frozenset[int] = frozenset()
    outputs: frozenset[int] = frozenset()


def known_op_types() -> frozenset[str]:
    """Every op type the installed ONNX Runtime has a schema for, in any domain: the names a mixlist or
    `precision.no_fp32_ops` may use."""
    return frozenset(name for _, name in _schemas())


@functools.cache
def _schemas() -> dict[tuple[str, str], list]:
    """(domain, op type) -> ORT's schemas of every version, oldest first."""
    from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

    found: dict[tuple[str, str], list] = {}
    for schema in get_all_operator_schema():
        found.setdefault((_domain(schema.domain), schema.name), []).append(schema)
    for versions in found.values():
        versions.sort(key=lambda schema: schema.since_version)
    return found


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def opset_versions(model: onnx.ModelProto) -> dict[str, int]:
    return {_domain(entry.domain): entry.version for entry in model.opset_import}


def op_schema(op_type: str, domain: str, opsets: Mapping[str, int]):
    """The schema in force at the model's opset for that domain (the newest if the domain is not imported);
    None for an op ORT does not know."""
    versions = _schemas().get((_domain(domain), op_type), [])
    limit = opsets.get(_domain(domain))
    usable = [schema for schema in versions if limit is None or schema.since_version <= limit]
    return usable[-1] if usable else None


def low_slots(node: onnx.NodeProto, opsets: Mapping[str, int], dtypes: Mapping[str, str], dtype: str) -> LowSlots:
    """The float32 tensors of `node` that may become `dtype`: those bound to a type variable that allows
    it and that an input binds. Ops without a known schema keep everything fp32."""
    schema = op_schema(node.op_type, node.domain, opsets)
    if schema is None:
        return LowSlots()
    inputs, outputs = _bind(schema.inputs, node.input), _bind(schema.outputs, node.output)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound_by_input = {param for _, _, param in inputs}
    lowered = {param for param in bound_by_input
               if LOW_TYPE_STR[dtype] in allowed.get(param, ())
               and all(dtypes.get(tensor) == "float32" for _, tensor, p in (*inputs, *outputs) if p == param)}
    return LowSlots(frozenset(i for i, _, param in inputs if param in lowered),
                    frozenset(i for i, _, param in outputs if param in lowered))


def _bind(formals: Sequence, actual: Sequence[str]) -> list[tuple[int, str, str]]:
    """(position, tensor, type variable or literal type) of each named tensor; a variadic last formal
    parameter takes every remaining position."""
    bound = []
    for index, tensor in enumerate(actual):
        if not tensor:
            continue
        if index < len(formals):
            formal = formals[index]
        elif formals and formals[-1].option == type(formals[-1].option).Variadic:
            formal = formals[-1]
        else:
            continue
        bound.append((index, tensor, formal.typeStr))
    return bound
