"""What did not fuse, and why: the ``not_fused`` list of ``qfuse inspect`` and a summary.

Definitions used here (and by the zoo fusion tests):

- An *integer activation* is a non-constant value whose element type is u8 or s8.
- The *quantized region* is the set of nodes that have an integer activation upstream (among
  their inputs or anywhere before them) and one downstream (among their outputs or anywhere
  after them). The quantize of a graph input has none upstream and the dequantize of a graph
  output none downstream: both are outside, so they may stay standalone.
- A *fused compute node* is a Conv / ConvTranspose / MatMul with ``node.fused`` set (an int8
  kernel when it reads an integer activation); pools may carry a chain too, and Softmax /
  LayerNormalization an integer source or output (passes/fuse_quantized_norm.py).
- A *trivial integer data-movement op* moves or selects 8-bit values without arithmetic
  (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Pad, Identity,
  nearest Resize, MaxPool) with every non-constant input and output u8/s8: oneDNN runs it as
  a reorder / concat / pooling on int8 data, so nothing is missing there.
- A *float op* is an unfused node other than quantize / dequantize / Relu / Add / Mul whose
  non-constant inputs are all float (Softmax, LayerNormalization, a linear Resize, ...): it has
  no int8 form in qfuse. The dequantize feeding only float ops and the quantize right after
  one are its *boundary* and stay standalone by necessity.
- A *requantize* is a dequantize read only by quantize-only FakeQuantizes (or the reverse
  view: a quantize reading a dequantize): the pair is one reorder with scales, an int8 kernel
  of its own (a value read by two kernels at two scales, e.g. a U-Net skip into a Concat).
- *Standalone* nodes are the quantize / dequantize / Relu / Add nodes left in the quantized
  region that are neither boundaries nor requantizes: what the fusion passes should have
  absorbed.

``not_fused`` reports the last reason a pass recorded for a node; when none did, it derives
one from the structure above (float op, boundary, requantize, constant expression, graph
input quantize / output dequantize, the dequantized second operand of a fused binary chain,
a dynamic quantization's scale product), and only then says "no pass matched".
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from qfuse.ir import DType, Graph, Node, Op
from qfuse.ir.graph import scale_product
from qfuse.ir.chain import Quantize, Residual, TensorOperand
from qfuse.ir.ops import ResizeMode
from qfuse.passes.base import PassResult
from qfuse.passes.quant_utils import dq_params
from qfuse.passes.fuse_quantized_norm import NORM_OPS
from qfuse.passes.post_op_match import COMPUTE_OPS, POOL_OPS, float_compute

log = logging.getLogger(__name__)

DATA_MOVEMENT = frozenset({Op.RESHAPE, Op.FLATTEN, Op.SQUEEZE, Op.UNSQUEEZE, Op.TRANSPOSE,
                           Op.CONCAT, Op.SPLIT, Op.SLICE, Op.PAD, Op.IDENTITY, Op.RESIZE,
                           Op.MAX_POOL, Op.GLOBAL_MAX_POOL, Op.DEPTH_TO_SPACE})
_INT8_CAPABLE = frozenset({Op.DEQUANTIZE_LINEAR, Op.RELU, Op.ADD, Op.MUL})
QUANTIZERS = frozenset({Op.QUANTIZE_LINEAR, Op.FAKE_QUANTIZE})
STANDALONE_KINDS = (Op.QUANTIZE_LINEAR, Op.FAKE_QUANTIZE, Op.DEQUANTIZE_LINEAR, Op.RELU, Op.ADD)


_REQUANTIZED = ("requantize: read only by quantizes at other scales, each of which requantizes "
                "the integers in one kernel (no dequantize kernel: compiler/lower/lower_quant.py)")


def _requantized(graph: Graph, node: Node) -> bool:
    """A per-tensor DequantizeLinear read only by quantizes: the lowering defers it into each
    of them (lower_quant.lower_dequantize), so it is no kernel of its own."""
    if node.op is not Op.DEQUANTIZE_LINEAR or not is_requantize(graph, node):
        return False
    params = dq_params(graph, node)
    return params is not None and params.per_tensor


def _is_int_activation(graph: Graph, name: str) -> bool:
    value = graph.values.get(name)
    return (value is not None and not value.is_constant and value.info is not None
            and value.info.dtype.is_quantized)


def is_trivial_int_op(graph: Graph, node: Node) -> bool:
    if node.op not in DATA_MOVEMENT:
        return False
    if node.op is Op.RESIZE and node.attrs.mode is not ResizeMode.NEAREST:
        return False
    values = [v for v in node.inputs if v and graph.constant(v) is None] + node.outputs
    return all(_is_int_activation(graph, v) for v in values)


def not_fused(graph: Graph, results: list[PassResult]) -> list[dict[str, str]]:
    """Every node that is neither a fused kernel nor trivial int8 data movement, with the
    last reason a pass recorded for it ("no pass matched" when none did); and each Conv /
    MatMul left in float32, with why, though its post-ops joined it."""
    reasons: dict[str, str] = {}
    for result in results:
        for decline in result.declined:
            reasons[decline.node] = decline.reason
    found = []
    for node in graph.topo_order():
        if node.fused is not None and node.name in reasons and float_compute(graph, node):
            found.append({"node": node.name, "op": node.op.value,
                          "reason": "runs in float32, its post-ops fused (mark_float_compute): "
                                    + reasons[node.name]})
            continue
        if (node.fused is not None or node.op is Op.TABLE or is_trivial_int_op(graph, node)
                or node.meta.get("view_of")):
            continue  # a Table is a chain in one kernel (passes/table_lookup.py); a view a
            # pass made of a fused node's output is part of it (passes/widen_gate.py)
        reason = (_REQUANTIZED if _requantized(graph, node)
                  else reasons.get(node.name) or structural_reason(graph, node)
                  or "no pass matched")
        found.append({"node": node.name, "op": node.op.value, "reason": reason})
    return found


def quantized_region(graph: Graph) -> set[str]:
    """Names of the nodes in the quantized region (module docstring)."""
    order = graph.topo_order()
    # value → an integer activation is at or before it
    up = {name: _is_int_activation(graph, name) for name in graph.inputs}
    for node in order:
        before = any(up.get(v, False) for v in node.inputs if v)
        for out in node.outputs:
            up[out] = before or _is_int_activation(graph, out)
    down: dict[str, bool] = {}  # value → an integer activation is at or after it
    region = set()
    for node in reversed(order):
        after = any(down.get(o, False) or _is_int_activation(graph, o) for o in node.outputs)
        for v in node.inputs:
            if v:
                down[v] = down.get(v, False) or after or _is_int_activation(graph, v)
        if after and any(up.get(v, False) for v in node.inputs if v):
            region.add(node.name)
    return region


def is_float_op(graph: Graph, node: Node) -> bool:
    if node.op in QUANTIZERS or node.op in _INT8_CAPABLE:
        return False
    if node.fused is not None and not float_compute(graph, node):
        return False
    infos = [graph.values[v].info for v in node.inputs if v and graph.constant(v) is None]
    return bool(infos) and all(i is not None and i.dtype is DType.F32 for i in infos)


def is_float_boundary(graph: Graph, node: Node) -> bool:
    """A quantize right after a float op, or a dequantize feeding only float ops."""
    if node.op in QUANTIZERS:
        producer = graph.producer(node.inputs[0])
        return producer is not None and is_float_op(graph, producer)
    if node.op is Op.DEQUANTIZE_LINEAR:
        readers = graph.consumers(node.outputs[0])
        return bool(readers) and all(is_float_op(graph, r) for r, _ in readers)
    return False


def is_requantize(graph: Graph, node: Node) -> bool:
    """A dequantize read only by quantizes, or a quantize reading such a dequantize."""
    if node.op in QUANTIZERS:
        producer = graph.producer(node.inputs[0])
        return producer is not None and producer.op is Op.DEQUANTIZE_LINEAR and \
            is_requantize(graph, producer)
    if node.op is Op.DEQUANTIZE_LINEAR and graph.constant(node.inputs[0]) is None:
        readers = graph.consumers(node.outputs[0])
        return bool(readers) and node.outputs[0] not in graph.outputs and all(
            r.op in QUANTIZERS and _is_int_activation(graph, r.outputs[0]) for r, _ in readers)
    return False


def standalone(graph: Graph, region: set[str] | None = None) -> list[Node]:
    """Quantize / Dequantize / Relu / Add nodes left in the quantized region, float-op
    boundaries and requantizes excepted (module docstring)."""
    region = quantized_region(graph) if region is None else region
    return [n for n in graph.topo_order() if n.name in region and n.op in STANDALONE_KINDS
            and n.fused is None and not is_float_boundary(graph, n)
            and not is_requantize(graph, n)]


def structural_reason(graph: Graph, node: Node) -> str | None:
    """Why a node is left, derived from the graph when no pass said so."""
    if all(graph.constant(v) is not None for v in node.inputs if v):
        return "computes a constant (evaluated at compile time)"
    if node.op in QUANTIZERS and node.inputs[0] in graph.inputs:
        return f"quantizes the graph input '{node.inputs[0]}' (outside the quantized region)"
    if node.op is Op.DEQUANTIZE_LINEAR and node.outputs[0] in graph.outputs:
        return f"dequantizes the graph output '{node.outputs[0]}' (outside the quantized region)"
    if is_float_op(graph, node):
        return f"{node.op.value} runs in float32 (no int8 kernel)"
    if is_requantize(graph, node):
        # (a per-tensor dequantize of one: not_fused says _REQUANTIZED before asking here)
        return "requantize: one kernel with both scales (the value is read at another scale)"
    if is_float_boundary(graph, node):
        where = "after" if node.op in QUANTIZERS else "for"
        return f"quantization boundary {where} a float32 op"
    product = scale_product(graph, node.outputs[0]) if node.outputs else None
    source = graph.producer(product[0]) if product is not None else None
    if source is not None and source.op is Op.DYNAMIC_QUANTIZE_LINEAR:
        return (f"the scale product s_x·s_w of {source}: its scale-and-zero-point kernel "
                "computes it (compiler/lower/lower_dynamic.py)")
    return _float_operand_reason(graph, node) or _float_binary_reason(graph, node)


_BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})


def _float_binary_reason(graph: Graph, node: Node) -> str | None:
    """Why an elementwise binary op left in float32 stays, when it is read by several nodes
    (a post-op chain absorbs a value read once: passes/fuse_post_ops.py), and why a
    dequantize stays whose readers are all such unfused float32 binary ops (NNCF's residual
    Add in Swin: the attention's dequantized output plus the float32 stream, read by the
    next LayerNorm and quantize)."""
    def float_binary(reader: Node) -> bool:
        return (reader.op in _BINARY and reader.fused is None
                and graph.info(reader.outputs[0]).dtype is DType.F32)

    if float_binary(node):
        readers = graph.consumers(node.outputs[0])
        if len(readers) > 1:
            return (f"{node.op.value} in float32 whose result {len(readers)} nodes read: a "
                    "post-op chain takes a value read once, so it is a kernel of its own")
        return None
    if node.op is not Op.DEQUANTIZE_LINEAR:
        return None
    readers = [r for r, _ in graph.consumers(node.outputs[0])]
    if not readers or not all(float_binary(r) for r in readers):
        return None
    names = ", ".join(dict.fromkeys(str(r) for r in readers))
    return (f"dequantizes an input of {names}, which writes float32: oneDNN 3.2's jit "
            "binary reads an 8-bit input only when it writes 8-bit values")


def _float_operand_reason(graph: Graph, node: Node) -> str | None:
    """Why a DequantizeLinear stays whose readers are fused nodes reading it in float32 — the
    second run-time operand of a binary chain (a ``TensorOperand`` or float ``Residual``), or
    the source of a binary primitive whose own second operand is a broadcast (a broadcast
    binary post-op would run on ref:any, so the 8-bit source cannot be read with a
    dequantizing post-op: passes/fuse_post_ops.py ``_integer_source``) — and, besides such a
    reader, quantizes (YOLOv8's C2f: a map both added as a shortcut inside a SiLU gate's chain
    and requantized into the Concat)."""
    if node.op is not Op.DEQUANTIZE_LINEAR:
        return None
    readers = graph.consumers(node.outputs[0])
    reasons = []
    for reader, port in readers:
        if reader.op in QUANTIZERS and len(readers) > 1:
            continue
        why = _operand_reason(reader, port)
        if why is None:
            return None
        reasons.append(why)
    if not reasons:
        return None
    text = "; ".join(dict.fromkeys(reasons))
    if len(reasons) < len(readers):
        text += " (its quantize readers requantize those float32 values)"
    return text


def _operand_reason(reader: Node, port: int) -> str | None:
    fused = reader.fused
    if fused is None:
        return None
    chain = fused.chain
    if port > 0 and any(isinstance(i, TensorOperand | Residual) and i.port == port
                        for i in chain):
        return (f"dequantizes the second run-time operand of {reader}: its binary primitive "
                "reads one 8-bit source exactly (its own), the other in float32")
    if port == 0 and chain and isinstance(chain[0], TensorOperand) and reader.op in (
            Op.ADD, Op.MUL) and fused.src_scale is None:
        return (f"dequantizes the source of {reader}: its other operand broadcasts along "
                "other axes than the channels, which only the binary primitive's own second "
                "operand takes on jit kernels, so the source is read in float32")
    return None


def summary(graph: Graph) -> dict[str, Any]:
    """Counts for `inspect` and the zoo tests: fused kernels, their chains, what is left."""
    region = quantized_region(graph)
    compute = [n for n in graph.topo_order() if n.op in COMPUTE_OPS]
    fused = [n for n in compute if n.fused is not None]
    int8 = [n for n in fused if _is_int_activation(graph, n.inputs[0])]
    left = standalone(graph, region)
    in_region = [n for n in graph.topo_order() if n.name in region]
    boundary = [n for n in in_region if is_float_boundary(graph, n)]
    float_ops = [n for n in in_region if is_float_op(graph, n)]
    requantize = [n for n in in_region if is_requantize(graph, n)
                  and n.op is Op.DEQUANTIZE_LINEAR]
    return {
        "compute": len(compute),
        "fused_compute": len(fused),
        "int8_compute": len(int8),
        "fused_pools": sum(1 for n in graph.topo_order()
                           if n.fused is not None and n.op in POOL_OPS),
        "fused_norms": sum(1 for n in graph.topo_order()
                           if n.fused is not None and n.op in NORM_OPS),
        "chain_lengths": {n.name: len(n.fused.chain) for n in fused if n.fused is not None},
        "with_residual": sum(1 for n in fused if n.fused is not None
                             and any(isinstance(i, Residual) for i in n.fused.chain)),
        "with_output_quantize": sum(1 for n in fused if n.fused is not None and n.fused.chain
                                    and isinstance(n.fused.chain[-1], Quantize)),
        "region_nodes": len(region),
        "standalone": dict(Counter(n.op.value for n in left)),
        "float_ops": dict(Counter(n.op.value for n in float_ops)),
        "float_boundary": dict(Counter(n.op.value for n in boundary)),
        "requantize": len(requantize),
    }
