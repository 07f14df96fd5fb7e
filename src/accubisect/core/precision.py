"""Which compiled nodes run in reduced precision: precision modes, mixlists and keep_dtype, as the seeds.

Precision is assigned after fusion, per compiled node, as a real compiler does. Modes (ATC
`--precision_mode`): force_fp32 and must_keep_origin_dtype reduce nothing; force_fp16 reduces every float
node; allow_fp32_to_fp16 reduces only op types the device has no fp32 kernel for (`no_fp32_ops`, none by
default, so on ORT it equals fp32); allow_mix_precision reduces white ops, never black ops, and gray ops
follow the op feeding them (the producer of their first activation input; graph inputs count as fp32).
`keep_dtype` names — original or compiled — keep their nodes in fp32 (not under must_keep_origin_dtype,
where it has no effect, as in the seeds).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from accubisect.core.errors import PrecisionError
from accubisect.core.onnx_graph import CompiledNode

WHITE, BLACK, GRAY = "white", "black", "gray"
FLOATS = {"float32", "float16", "bfloat16", "float64"}


def list_of(lists: Mapping[str, Iterable[str]], op_type: str) -> str:
    for name in (WHITE, BLACK):
        if op_type in lists.get(name, ()):
            return name
    return GRAY


def apply_modify_mixlist(lists: Mapping[str, Iterable[str]], document: Any, where: str,
                         known: frozenset[str]) -> dict[str, set[str]]:
    """The seeds' modify_mixlist: `to-remove` moves an op type from that list to gray, `to-add` moves it
    into that list from wherever it was; removes apply first, so remove-from-white + add-to-black is black.
    `known`: the op types a name must be one of (the backend's, `runtime.op_schema.known_op_types`)."""
    if not isinstance(document, dict) or set(document) - {"black-list", "white-list"}:
        raise PrecisionError(f'{where}: expected {{"black-list": {{"to-add": [...], "to-remove": [...]}}, '
                             '"white-list": {...}}')
    result = {WHITE: set(lists.get(WHITE, ())), BLACK: set(lists.get(BLACK, ()))}
    changes = {(name.split("-")[0], action): check_op_types(ops, f"{where}: {name}.{action}", known)
               for name, section in document.items() for action, ops in _actions(section, f"{where}: {name}")}
    added_twice = changes.get((WHITE, "to-add"), set()) & changes.get((BLACK, "to-add"), set())
    if added_twice:
        raise PrecisionError(f"{where}: {sorted(added_twice)} added to both black-list and white-list")
    for (name, action), ops in sorted(changes.items(), key=lambda item: item[0][1] == "to-add"):
        if action == "to-remove":
            result[name] -= ops
        else:
            for other in (WHITE, BLACK):
                result[other] -= ops
            result[name] |= ops
    return result


def _actions(section: Any, where: str) -> list[tuple[str, Any]]:
    if not isinstance(section, dict) or set(section) - {"to-add", "to-remove"}:
        raise PrecisionError(f'{where}: expected {{"to-add": [...], "to-remove": [...]}}')
    return list(section.items())


def check_op_types(ops: Any, where: str, known: frozenset[str]) -> set[str]:
    if not isinstance(ops, list) or not all(isinstance(op, str) for op in ops):
        raise PrecisionError(f"{where}: expected a list of op type names")
    for op in ops:
        if op not in known:
            close = difflib.get_close_matches(op, sorted(known), n=3)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise PrecisionError(f"{where}: unknown op type '{op}'{hint}")
    return set(ops)


def resolve_keep_dtype(names: Sequence[str], nodes: Sequence[CompiledNode]) -> set[str]:
    """Compiled node names for `keep_dtype` entries, which may name original nodes absorbed by fusion; `nodes`
    are graph.json's."""
    compiled = {node.name for node in nodes}
    absorbed: dict[str, set[str]] = {}
    for node in nodes:
        for original in node.original_nodes:
            absorbed.setdefault(original, set()).add(node.name)
    chosen = set()
    for name in names:
        if name in compiled:
            chosen.add(name)
        elif name in absorbed:
            chosen |= absorbed[name]
        else:
            close = difflib.get_close_matches(name, sorted(compiled | set(absorbed)), n=3)
            raise PrecisionError(f"precision.keep_dtype: '{name}' matches no node of the model, original or compiled"
                                 + (f"; closest: {', '.join(close)}" if close else ""))
    return chosen


def reduced_nodes(nodes: Sequence[CompiledNode], dtypes: Mapping[str, str], mode: str,
                  lists: Mapping[str, set[str]], keep: set[str], no_fp32_ops: Iterable[str] = ()) -> list[str]:
    """Compiled nodes (names, in topological order; `nodes` are graph.json's) that run in reduced precision."""
    floating = [node for node in nodes if any(dtypes.get(t) in FLOATS for t in node.outputs)]
    if mode in ("force_fp32", "must_keep_origin_dtype"):
        return []
    if mode == "force_fp16":
        return [node.name for node in floating if node.name not in keep]
    if mode == "allow_fp32_to_fp16":
        return [node.name for node in floating if node.op_type in set(no_fp32_ops) and node.name not in keep]
    return _mixed(nodes, floating, dtypes, lists, keep)


def _mixed(nodes: Sequence[CompiledNode], floating: Sequence[CompiledNode], dtypes: Mapping[str, str],
           lists: Mapping[str, set[str]], keep: set[str]) -> list[str]:
    producer = {out: node.name for node in nodes for out in node.outputs}
    reduced: set[str] = set()
    for node in floating:
        kind = list_of(lists, node.op_type)
        if node.name in keep or kind == BLACK:
            continue
        feeder = next((producer[t] for t in node.inputs if t in producer and dtypes.get(t) in FLOATS), None)
        if kind == WHITE or feeder in reduced:
            reduced.add(node.name)
    return [node.name for node in floating if node.name in reduced]
