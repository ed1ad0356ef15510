"""How each Concat input reaches the Concat's output: ``qfuse inspect``'s ``concats``.

Per input (docs/design.md, "In-place Concat"): the scale it arrives in — already the output's,
requantized inside its producer's kernel (post-op fusion: the producer's chain keeps its own
quantize and adds the Concat's, bit-exact), or requantized by a kernel of its own, with the
reason the requantize did not fold (passes/eliminate_requantize.py) — and how its bytes get
there: written in place by its producer, copied by a reorder, or copied by the concat kernel,
with the reason it could not be written in place (compiler/lower/in_place_concat.py).
"""

from __future__ import annotations

from typing import Any

from qfuse.ir import Graph, Op
from qfuse.ir.chain import Quantize, Scale, Shift


def _scale(graph: Graph, value: str,
           declined: dict[str, str]) -> tuple[str, str]:
    """(how the input gets the output's type and scale, why not in its producer)."""
    producer = graph.producer(value)
    if producer is None:
        return "graph input", ""
    if producer.op is Op.FAKE_QUANTIZE and producer.fused is None:
        source = graph.producer(producer.inputs[0])
        if source is not None and source.op is Op.DEQUANTIZE_LINEAR:
            return (f"requantized by its own kernel '{producer.name}'",
                    declined.get(producer.name, "no reason recorded"))
        return f"quantized by its own kernel '{producer.name}'", declined.get(producer.name, "")
    if producer.fused is not None and _ends_in_requantize(producer.fused.chain):
        return f"requantized inside '{producer.name}' (both roundings kept)", ""
    return f"written in the output's scale by '{producer.name}'", ""


def _ends_in_requantize(chain: list[Any]) -> bool:
    """The chain ends Quantize, Shift / Scale only (its dequantize), Quantize."""
    marks = [i for i, item in enumerate(chain) if isinstance(item, Quantize)]
    return (len(marks) > 1 and marks[-1] == len(chain) - 1
            and all(isinstance(item, (Shift, Scale)) for item in chain[marks[-2] + 1:-1]))


def concat_report(graph: Graph, plan_concats: list[dict[str, Any]],
                  not_fused: list[dict[str, Any]]) -> list[dict[str, Any]]:
    declined = {item["node"]: item["reason"] for item in not_fused}
    layout = {c["concat"]: c for c in plan_concats}
    out = []
    for node in graph.topo_order():
        if node.op is not Op.CONCAT:
            continue
        placed = layout.get(node.name)
        inputs = []
        for i, value in enumerate(node.inputs):
            scale, why = _scale(graph, value, declined)
            if placed is None:
                bytes_ = "not a oneDNN concat kernel"
            elif i in placed["in_place"] and placed["removed"]:
                bytes_ = "written in place by its producer"
            elif i in placed["moved"]:
                bytes_ = ("written into its region by the copy that produces it (a reorder, "
                          "or a nearest Resize as a reorder repeating its source)")
            elif i in placed["copied"]:
                words = " as 4-byte words" if placed["words"] else ""
                bytes_ = f"copied by a reorder{words} into its region of the output"
            else:
                reason = placed["reasons"].get(i) or placed["reasons"].get(str(i))
                if reason is None:  # placeable, but too many others were not
                    reason = "other inputs are not: the concat kernel stays"
                bytes_ = f"copied by the concat kernel ({reason})"
            inputs.append({"value": value, "scale": scale, "requantize_reason": why,
                           "bytes": bytes_})
        out.append({"concat": node.name, "in_place": bool(placed and placed["removed"]),
                    "inputs": inputs})
    return out
