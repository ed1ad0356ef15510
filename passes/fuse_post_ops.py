"""Post-op fusion (docs/design.md, pass 6): a fused compute node absorbs its single-consumer chain.

Walk forward from the node's output while the current value has exactly one reader and is
not a graph output, turning each reader into chain items (ir/chain.py):

    Mul(x, c) / Add(x, c), c constant per tensor or per channel   → Scale(c) / Shift(c)
    Relu, LeakyRelu(a), Clip(lo, hi), Sigmoid, Swish, Tanh, HardSigmoid(a, b), HardSwish, Gelu
                                                                   → Activation
    PRelu(x, slopes), constant slopes per tensor or per channel    → PRelu(slopes)
    Add(x, r), r non-constant of the output's shape                → Residual(port of r)
    Mul(x, r), r a float tensor broadcast to the output, not computed from the node
                                                                   → TensorOperand(port of r)
    Cast(acc) to float32 of an int32 accumulator (dynamic quantization's MatMulInteger /
    ConvInteger, compiler/onnx_import/convert_dynamic.py), first in the chain
                                                                   → nothing: x = f32(acc)
    (Add(x, r) of a gate chain, below: TensorOperand(port of r, "add"))

fuse_gate_chain (``run_gates``, after this pass) starts chains at float elementwise ops
whose chain ends in a quantize, or in its dequantize (``_fuse_gate``): a gate reading a second
tensor (x·Q(sigmoid(x))), a pre-activation BatchNorm (decomposed into Mul + Add) → Relu → Q,
an activation before its quantize. One binary primitive (compiler/lower/lower_gate.py) then
replaces the op, what follows and the quantize. On a dequantized 8-bit tensor, when the chain
ends in the quantize (``DQ → f(x) → ... → Q``: attention's q·(1/√d), a decomposed
LayerNorm's ·γ and +β, an activation between quantizers), the node reads the 8-bit source
with ``Fused.src_scale`` / ``src_zero_point``: ``x = f32(q − zp)·s`` is the DequantizeLinear
exactly, and the node is one binary primitive from int8 to int8 instead of three kernels.
    quantize-only FakeQuantize (integer output)                    → Quantize (ends the chain)

fuse_fake_quantize (``run_fake_quantize``, after every other fusion) takes a quantize left
standalone whose integers only its dequantize reads, and whose dequantized values only float
ops read: one kernel writing the float32 values (Q(x) − zp)·s (``_fuse_fake_quantize``).

A residual read through ``DequantizeLinear(r_q, s, zp)`` (per tensor) is summed from r_q:
``x + s·(r_q - zp)`` is exactly what the DequantizeLinear and the Add compute in float32,
and it is oneDNN's sum post-op with scale s and zero point zp. At most one residual per
chain (oneDNN allows one sum post-op), also when a ReLU precedes the Add. oneDNN's sum reads
the residual from the dst buffer, so its element size must equal the dst's: a chain that would
end with an f32 dst and an 8-bit residual (or the reverse) is cut before the Add.

A float32 Conv / MatMul (``float_compute``: NNCF's squeeze-excitation convs) takes a quantize
only together with its dequantize, which ends the chain's int8 part there: the node writes
(Q(x) − zp)·s in float32 (an int8 dst puts oneDNN's f32 convolutions off jit), the
dequantize's multiply exact as for a graph output (below).

After a Quantize the walk stops, except into ``DequantizeLinear`` of that value: it continues
as ``Shift(-zp), Scale(s)`` (exact: ``(q - zp)·s`` in float32) *only if* the walk then reaches
a residual Add — OpenVINO fake_quantize.md's residual block "FQ followed by SUM and another
FQ" — or another quantize (a requantization, e.g. into a Concat's common scale, optionally through
post-ops such as a Mul or GELU). When neither follows, the walk is rolled back to the Quantize: the
DequantizeLinear is then better moved into the next compute node. The requantize case goes
beyond the residual-only rule of the design brief: the DequantizeLinear → quantize pair would
otherwise stay as its own reorder kernel, and the inner quantize is kept (not dropped), so the
result is exactly the graph's. A fourth case: the DequantizeLinear's output is a graph output
(composer option ``fold_output_dequantize``): the node writes float32 ``(q - zp)·s`` itself,
the dequantize's multiply marked exact (ir/chain.Scale.exact: its own linear(s, 0) after the
round, + zp, clip and linear(1, -zp), never folded), which is bit for bit what the standalone
dequantize computes. A fifth, the same way (composer option ``fold_float_dequantize``): the
DequantizeLinear's output has two or more readers and every one computes in float32 from it
(activations, Mul, Add / Sub by a constant, Softmax: quantize_static's SiLU ``x·Q(sigmoid(x))``
and HardSwish ``x·Q(relu6(x + 3))/6`` read x twice, the gate chain below then reads the f32 x;
an Add x + g(x) whose other operand is computed from x, and an average pooling whose output
no quantize reads: a squeeze-excitation ``x·gate(mean(x)) + x``, PP-OCRv4 det NNCF's RSE
layers, 104 → 94 kernels); not when a reader is a compute node or an Add of x and another
run-time tensor, which could read the 8-bit source (a residual summed from it). And with one
reader, a Mul or Add broadcasting the dequantized value over a larger tensor: a
squeeze-excitation's gate (HardSigmoid → Q → DQ → Mul in quantize_static's models), which the
Mul's kernel reads as a float32 operand anyway (EfficientNet-V2-S QDQ 368 → 338 kernels,
MobileNetV3-L 112 → 104, PP-OCR cls 108 → 99). A third case keeps it: the dequantized value read
by a Softmax alone, which has no compute node to move into and no integer source in oneDNN (its src
scale multiplies the output: passes/fuse_quantized_norm.py); the node then writes the float32 values
``(Q(x) - zp)·s`` (one FakeQuantize in float32) instead of a standalone dequantize kernel.

A MatMul's chain also walks through a Reshape that keeps the last dim, the MatMul then reading
its source reshaped alike (passes/matmul_reshape.py: ONNX Runtime's MatMulAddFusion wraps
3-D MatMuls in Reshapes that would otherwise cut every transformer chain).

Every extension is judged by the composer first: ``compose()`` on the candidate chain (the
node's channels and the candidate's dst type); a ComposeError stops the walk there, and so does
a compute (or pooling, resize, norm) node's chain that would compose to more than
``CHAIN_POST_OPS`` post-ops: one oneDNN primitive holds at most MAX_POST_OPS (32), and
lowering may add up to ``LOWERING_POST_OPS`` of its own. What follows the cut is fused on its
own (a gate chain from the next node), the tensor between the two kernels the one the model
quantized there: six activations each with a Q / DQ pair after a MatMul compose to 36, three
kernels instead of a LoweringError. A gate chain has no limit here: its binary primitive's
chain runs in parts, each writing the float32 value where it stops (lower_gate.py). Each node
that stops a chain and is not absorbed gets its reason recorded (``ctx.decline``); compute
nodes reading a chain's value are kernels of their own and get none.

Rewire: the node is rebuilt producing the last absorbed value's name (retarget), the absorbed
nodes are removed, their origins appended to ``fused.absorbed``; residual inputs are appended
to the node's inputs (the Residual's port). A residual never depends on the node itself
(every value on the chain has one reader, so a path from the node to r would run through the
Add); this is asserted.

Numerics: every item evaluates in float32 exactly as the op it replaces (same operations, same
order), so the rewrite is bit-exact under the chain reference (runtime/reference/chain.py),
except Sigmoid and Tanh, which the chain reference (oneDNN's formulas) computes in float32
where the op reference computes in float64 and rounds once: ulps of difference, which a
following quantize turns into at most 1 LSB on near-ties.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qfuse.ir import DType, Graph, Node, Op, TensorInfo
from qfuse.ir.chain import (
    ChainOp,
    Fused,
    PRelu,
    Quantize,
    Residual,
    Scale,
    Shift,
    TensorOperand,
)
from qfuse.ir.postops import single_pixel_batch
from qfuse.passes import matmul_reshape
from qfuse.passes.base import PassContext
from qfuse.passes.composer import ComposeError, compose
from qfuse.passes.post_op_match import (
    COMPUTE_OPS,
    activation,
    channel_axis,
    channel_values,
    constant_operand,
    depends_on,
    float_compute,
    drop_if_unread,
    out_channels,
    retarget,
    sole_reader,
)
from qfuse.passes.quant_utils import dq_params
from qfuse.passes.signed_matmul_weights import MOVES
from qfuse.runtime.onednn.attr import MAX_POST_OPS

log = logging.getLogger(__name__)

# What lowering may add to a composed chain: as_float_post_ops on a float32 or binary
# primitive (weight scale and bias, the int8 store's scale and zero point, the s8 NaN clip)
# and the int8 store's rint after a float32 matmul (compiler/lower/lower_matmul.py), a padded
# depthwise source's compensation and the low half of split weights without VNNI
# (compiler/lower/padded_depthwise.py, no_vnni.py), a chain's dequantize of its 8-bit source
LOWERING_POST_OPS = 8
CHAIN_POST_OPS = MAX_POST_OPS - LOWERING_POST_OPS
_MOVE_OPS = frozenset({Op.TRANSPOSE, Op.CONCAT, Op.SPLIT, Op.SLICE, Op.PAD, Op.RESIZE})
_FLOAT_ONLY = frozenset({Op.SOFTMAX, Op.LOG_SOFTMAX})  # readers with no integer source in oneDNN


@dataclass
class _State:
    """A chain under construction; ``pending`` = inside a Quantize → DequantizeLinear that
    still needs a residual Add or a requantize to be worth keeping."""

    chain: list[ChainOp]
    inputs: list[str]
    value: str
    info: TensorInfo
    absorbed: list[Node] = field(default_factory=list)
    extra: list[Node] = field(default_factory=list)  # DequantizeLinear nodes read through
    pending: bool = False
    int_residual: bool = True  # sum a DequantizeLinear'd residual from its 8-bit source

    def extended(self, items: list[ChainOp], reader: Node, **changes: object) -> _State:
        out = reader.outputs[0]
        return dataclasses.replace(self, chain=[*self.chain, *items], inputs=list(self.inputs),
                                   absorbed=[*self.absorbed, reader], extra=list(self.extra),
                                   value=out, **changes)

    @property
    def residual(self) -> Residual | None:
        return next((i for i in self.chain if isinstance(i, Residual)), None)

    @property
    def quantized(self) -> bool:
        return bool(self.chain) and isinstance(self.chain[-1], Quantize)

    @property
    def writes_dequantized(self) -> bool:
        """Ends in a quantize and its dequantize (``_walk``'s stop at a float-only reader,
        a Softmax: the node writes the float32 values (Q(x) − zp)·s)."""
        return (len(self.chain) >= 3 and isinstance(self.chain[-3], Quantize)
                and isinstance(self.chain[-2], Shift) and isinstance(self.chain[-1], Scale))

    @property
    def output_dequantized(self) -> bool:
        """Ends in a graph output's dequantize (``_output_dequantize``)."""
        return bool(self.chain) and isinstance(self.chain[-1], Scale) and self.chain[-1].exact


class _Stop(Exception):
    """The walk cannot take ``reader`` (None: no single reader); ``reason`` says why, to be
    recorded on the nodes in ``decline`` (the reader, or the readers of a shared value)."""

    def __init__(self, reader: Node | None, reason: str,
                 decline: list[Node] | None = None) -> None:
        super().__init__(reason)
        self.reader, self.reason = reader, reason
        self.decline = decline if decline is not None else [] if reader is None else [reader]


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    names = [n.name for n in graph.topo_order() if n.fused is not None]
    for name in names:
        if graph.has_node(name) and _fuse(graph, ctx, ctx.visit(graph.node(name))):
            changed += 1
    return changed


def run_gates(graph: Graph, ctx: PassContext) -> int:
    """The fuse_gate_chain pass (after fuse_post_ops): ``_fuse_gate`` on every candidate."""
    changed = 0
    gates = [n.name for n in graph.topo_order() if n.fused is None and _gate_start(graph, n)]
    for name in gates:
        if graph.has_node(name) and _fuse_gate(graph, ctx, graph.node(name)):
            changed += 1
    return changed


def run_view_dequantize(graph: Graph, ctx: PassContext) -> int:
    """The fold_view_dequantize pass (after the gates): a per-tensor DequantizeLinear reading,
    through ops that only move values (Reshapes; a Transpose right after a MatMul, which
    writes its dst so that the Transpose is a view), the 8-bit output of a fused Conv /
    MatMul whose chain ends in the quantize it undoes, where every reader of the
    dequantized value computes in float32 (an activation, a gate chain: nothing that reads
    8 bits): the node's chain ends in that dequantize's exact multiply and writes float32, the
    views move float32, and the dequantize is no kernel. LeViT's attention output, P·V
    transposed and reshaped, then dequantized for its Hardswish: one reorder a block less
    (the P·V matmul writes the merged heads' float32 itself). Without views, where every
    reader is a fused node's chain reading the dequantized value as its float32 tensor
    operand (``_float_operand``): the second factor of a gated product, StarNet's
    ``relu6(f1(x))·f2(x)``, whose f2 convolution then writes the float32 values the binary
    post-op reads instead of 8 bits and a dequantize reorder (bit-exact: the same exact
    multiply)."""
    changed = 0
    for dq in [n for n in graph.topo_order() if n.op is Op.DEQUANTIZE_LINEAR]:
        if not graph.has_node(dq.name):
            continue
        found = _view_dequantize(graph, dq, ctx)
        if found is None:
            continue
        node, views, chain = found
        ctx.visit(dq)
        node.fused = dataclasses.replace(node.fused, chain=chain,
                                         absorbed=[*node.fused.absorbed, *dq.origin])
        for value in [node.outputs[0], *(v.outputs[0] for v in views)]:
            graph.set_info(value, TensorInfo(graph.info(value).shape, DType.F32))
        graph.replace_all_uses(dq.outputs[0], dq.inputs[0])
        graph.remove_node(dq)
        changed += 1
    return changed


def _view_dequantize(graph: Graph, dq: Node, ctx: PassContext
                     ) -> tuple[Node, list[Node], list[ChainOp]] | None:
    """(the fused node, the views between it and ``dq``, its chain ending in the dequantize)
    when ``run_view_dequantize`` applies to ``dq``, else None."""
    views: list[Node] = []
    value = dq.inputs[0]
    while (producer := graph.producer(value)) is not None and producer.op in MOVES:
        if len(graph.consumers(value)) != 1 or value in graph.outputs:
            return None
        views.append(producer)
        value = producer.inputs[0]
    node = producer
    # only a MatMul's first view may permute: lower_matmul writes its dst in the strides
    # that make that Transpose a view; a Transpose copying float32 would cost more than the
    # 8-bit copy merge_copies merges with the dequantize (a convolution's, or a later one)
    if any(v.op is Op.TRANSPOSE for v in views[:-1]) or (
            views and views[-1].op is Op.TRANSPOSE and (node is None or node.op is not Op.MATMUL)):
        return None
    if (node is None or node.fused is None or node.op not in COMPUTE_OPS
            or len(graph.consumers(value)) != 1 or value in graph.outputs
            or not node.fused.chain or not isinstance(node.fused.chain[-1], Quantize)):
        return None
    params = dq_params(graph, dq)
    info = graph.info(value)
    if (params is None or not params.per_tensor or params.dtype is not info.dtype
            or params.quant() != info.quant):
        return None
    readers = graph.consumers(dq.outputs[0])
    operands = [_float_operand(reader, port) for reader, port in readers]
    if not views and not (readers and all(operands)):
        return None  # without views: only where chains read it as their float32 operand
    for (reader, _), operand in zip(readers, operands, strict=True):
        # elementwise float ops only: a LayerNorm or Softmax reads 8 bits itself later
        # (fuse_quantized_norm), a compute node or a quantize reads the integers
        elementwise = activation(reader) is not None or reader.op in (
            Op.MUL, Op.ADD, Op.SUB, Op.DIV)
        if not operand and (not elementwise or (
                reader.fused is not None and reader.fused.src_scale is not None)):
            return None
    if dq.outputs[0] in graph.outputs:
        return None
    chain = [*node.fused.chain,
             *_dequantize(params.scale.tolist(), params.zero_point.tolist(), exact=True)]
    try:
        compose(chain, channels=info.shape[channel_axis(node, info.rank)], dst_dtype=DType.F32,
                options=ctx.composer)
    except ComposeError:
        return None
    return node, views, chain


def _float_operand(reader: Node, port: int) -> bool:
    """``reader`` is a fused Conv / MatMul whose chain reads its input ``port`` as a float32
    tensor operand (a binary post-op), not as its source or a residual: the second factor
    of a gated product ``act(x1)·x2`` (StarNet's star blocks, gated MLPs), which oneDNN's
    binary post-op reads dequantized, having no scale for it."""
    fused = reader.fused
    return (fused is not None and reader.op in COMPUTE_OPS
            and any(isinstance(op, TensorOperand) and op.port == port for op in fused.chain)
            and not any(isinstance(op, Residual) and op.port == port for op in fused.chain))


#: readers that, left unfused after the other fusion passes, compute in float32 from a value
_FLOAT_READERS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.LAYER_NORM, Op.SOFTMAX,
                            Op.LOG_SOFTMAX})


def run_fake_quantize(graph: Graph, ctx: PassContext) -> int:
    """The fuse_fake_quantize pass (after every other fusion): ``_fuse_fake_quantize`` on
    every quantize left standalone."""
    changed = 0
    names = [n.name for n in graph.topo_order()
             if n.op is Op.FAKE_QUANTIZE and n.fused is None]
    for name in names:
        if graph.has_node(name) and _fuse_fake_quantize(graph, ctx, graph.node(name)):
            changed += 1
    return changed


def _fuse_fake_quantize(graph: Graph, ctx: PassContext, fq: Node) -> bool:
    """A quantize of a float32 x whose integers only its DequantizeLinear reads, and whose
    dequantized values only float ops read (LayerNorm, Add, Mul, activations, Softmax, fused
    nodes taking them as a float32 operand; not a graph output), becomes a fused node with
    chain [Quantize, Shift(−zp), Scale(s) exact]: one binary primitive writing the float32
    values (Q(x) − zp)·s (compiler/lower/lower_gate.py) instead of a quantize and a dequantize
    kernel. NNCF quantizes a transformer's residual stream this way: x feeds the next
    LayerNorm in float32 and, through Q → DQ, the next residual Add. Exact: the items are
    the two ops' own float32 arithmetic (module docstring, ``_output_dequantize``)."""
    x, q = fq.inputs[0], fq.outputs[0]
    xinfo = graph.info(x)
    if xinfo.dtype is not DType.F32 or xinfo.rank < 2 or single_pixel_batch(xinfo.shape):
        return False
    source = graph.producer(x)
    if source is not None and source.op is Op.DEQUANTIZE_LINEAR:
        return False  # a requantize, which reads the integers (compiler/lower/lower_quant.py)
    start = _State([], list(fq.inputs), x, xinfo)
    if graph.info(q).dtype is DType.F32:  # a whole pair with no 8-bit form (``_quantize``)
        try:
            state = _quantize(graph, fq, start, fq, graph.info(q))
        except _Stop:
            return False
        if not _commit_quantize(graph, ctx, fq, state, []):
            return False
        _fuse(graph, ctx, graph.node(fq.name))  # and the float ops after it, as post-ops
        return True
    dq, _ = sole_reader(graph, q)
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR or dq.fused is not None:
        return False
    y = dq.outputs[0]
    readers = graph.consumers(y)
    if y in graph.outputs or not readers or not all(
            r.fused is not None or r.op in _FLOAT_READERS or activation(r) is not None
            for r, _ in readers):
        return False
    try:
        state = _after_quantize(graph, fq, _quantize(graph, fq, start, fq, graph.info(q)), dq,
                                graph.info(y))
    except _Stop:
        return False
    return _commit_quantize(graph, ctx, fq, state, [dq])


def _commit_quantize(graph: Graph, ctx: PassContext, fq: Node, state: _State,
                     absorbed: list[Node]) -> bool:
    """``fq`` becomes a fused node writing the float32 values of ``state`` (a chain ending in
    the exact dequantize), having absorbed ``absorbed``; False when the composer cannot."""
    best = _output_dequantize(state, graph.info(fq.inputs[0]).shape[1], ctx)
    if best is None:
        return False
    ctx.visit(fq)
    fq.fused = Fused()
    _commit(graph, fq, dataclasses.replace(best, absorbed=absorbed))  # fq itself is the node
    return True


def _gate_start(graph: Graph, node: Node) -> tuple[list[str], list[ChainOp]] | None:
    """(inputs with x first, first chain items) when ``node`` is a float elementwise op on
    one tensor x that a gate chain can start with: an activation, an Add / Mul by a
    constant (per tensor or per channel; the constant stays as input 1, unread) — x + 3 of
    x·relu6(x + 3)/6 —, or an Add / Mul / Sub / Div of two run-time tensors."""
    out = node.outputs[0]
    info = graph.info(out)
    if info.dtype is not DType.F32 or info.rank < 2 or not node.inputs:
        return None
    if single_pixel_batch(info.shape):  # oneDNN's binary post-op bug (docs/onednn.md)
        return None
    act = activation(node)
    items: list[ChainOp]
    if act is not None:
        x, items, inputs = node.inputs[0], [act], list(node.inputs)
    elif node.op in (Op.ADD, Op.MUL, Op.SUB, Op.DIV) and len(node.inputs) == 2:
        a, b = node.inputs
        # a constant is a plain one or a DequantizeLinear of constants (ResMLP's γ · x)
        data = constant_operand(graph, b)[0]
        if node.op in (Op.SUB, Op.DIV):
            # x − r, x / r with r a run-time tensor (F.normalize's x / max(‖x‖, ε), XCiT's
            # and Swin-V2's q and k; YOLOv8's anchors − distances): the binary primitive's own
            # operation, r broadcast or not; a constant r is canonicalize_arith's Add / Mul
            if (graph.constant(a) is not None or data is not None
                    or graph.info(a).shape != info.shape
                    or not _broadcast_f32(graph.info(b), info.shape)):
                return None
            items = [TensorOperand(1, "sub" if node.op is Op.SUB else "div")]
        else:
            data_a = constant_operand(graph, a)[0]
            if data_a is not None:  # a constant first goes second
                if data is not None:
                    return None
                a, b, data = b, a, data_a
            alg = "add" if node.op is Op.ADD else "mul"
            values = channel_values(data, info.shape, 1)[0] if data is not None else None
            if values is not None:
                items = [Shift.of(values) if alg == "add" else Scale.of(values)]
            elif data is not None:
                # a constant along other axes (attention's position bias [1, H, N, N],
                # LayerNorm's γ / β on [N, T, C]): the binary primitive's own second operand,
                # broadcast (compiler/lower/lower_gate.py), as a standalone Add / Mul reads it
                if graph.info(a).shape != info.shape or not _broadcast_f32(
                        graph.info(b), info.shape, lower_rank=True):
                    return None
                items = [TensorOperand(1, alg)]  # a lower-rank one is padded (_fuse_gate)
            else:  # two run-time tensors: x is the one of the output's shape
                if graph.info(a).shape != info.shape:
                    a, b = b, a
                if not _broadcast_f32(graph.info(b), info.shape):
                    return None
                items = [TensorOperand(1, alg)]
        x, inputs = a, [a, b]
    else:
        return None
    xinfo = graph.info(x)
    if xinfo.dtype is not DType.F32 or xinfo.shape != info.shape:
        return None
    return inputs, items


def _is_gate(node: Node) -> bool:
    """A node whose chain ``_fuse_gate`` builds (an activation or Add / Mul / Sub / Div
    start)."""
    return node.op in (Op.ADD, Op.MUL, Op.SUB, Op.DIV) or activation(node) is not None


def _fuse_gate(graph: Graph, ctx: PassContext, node: Node) -> bool:
    """A float elementwise op g = f(x) whose chain multiplies by x itself — x·Q(sigmoid(x))
    (SiLU), x·Q(hardsigmoid(x)) or x·Q(relu6(x + 3))/6 (HardSwish) with the gate's quantizer
    kept — and ends in a quantize becomes a fused node reading x with chain [f, Quantize,
    dequantize, TensorOperand(x), Quantize, ...]: one binary primitive with post-ops instead of
    f, its quantize and dequantize reorders, the Mul and the output quantize
    (compiler/lower/lower_gate.py); any other float elementwise op whose chain ends in a
    quantize (or its dequantize) alike (module docstring). Exact: every item is the op it
    replaces, in the same float32 order; the activation is oneDNN's eltwise, as the
    standalone kernel was."""
    start_items = _gate_start(graph, node)
    if start_items is None:
        return False
    inputs, items = start_items
    out = node.outputs[0]
    info = graph.info(out)
    node.fused = Fused()
    start = _State(items, inputs, out, info)
    # no limit: lower_gate.py runs a binary primitive's chain past 32 post-ops in parts
    best, _, _ = _walk(graph, ctx, node, start, info.shape[1], limit=None)
    source = _integer_source(graph, best)
    # worth a kernel when the chain ends in a quantize (or its dequantize: read by a Softmax
    # — attention's score + position bias → Q → DQ → Softmax —, by float ops only, or a
    # graph output): one kernel for the op, what follows and the quantize (a pre-activation
    # BatchNorm → Relu → Q, a gate x·Q(sigmoid(x))); it reads an 8-bit source itself when
    # the chain ends in the quantize (an int8 → int8 kernel also replaces the dequantize)
    if source is None and not (best.quantized or best.output_dequantized
                               or best.writes_dequantized or _past_dequantize(best)):
        node.fused = None
        return False
    ctx.visit(node)
    if source is not None:
        dq, (scale, zero_point), prefix = source
        node.fused = dataclasses.replace(node.fused, src_scale=scale,
                                         src_zero_point=zero_point)
        best = dataclasses.replace(best, chain=[*prefix, *best.chain],
                                   inputs=[dq.inputs[0], *best.inputs[1:]],
                                   extra=[*best.extra, dq])
    _commit(graph, node, _same_rank_operands(graph, best))
    return True


def _aligned(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """``shape`` left-padded with 1s to ``rank``: how ONNX broadcasting aligns a lower rank."""
    return (1,) * (rank - len(shape)) + tuple(shape)


def _post_op_operand(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Does a binary post-op read an operand of ``shape`` on jit kernels: the output's own
    shape, or one value per channel (dim 1, after ``_aligned``)? Other broadcasts run on
    ref:any."""
    shape = _aligned(shape, len(out))
    return shape == tuple(out) or all(d == 1 for i, d in enumerate(shape) if i != 1)


def _integer_source(graph: Graph, best: _State
                    ) -> tuple[Node, tuple[float, int], list[ChainOp]] | None:
    """The DequantizeLinear the chain's source x comes from, its (scale, zero point) and
    chain items to put first, when the node can read the 8-bit tensor instead (module
    docstring): x = DQ(q) of a non-constant u8/s8 q, the chain ending in a quantize (an 8-bit
    dst: oneDNN's jit binary takes an 8-bit source only with an 8-bit dst) and no chain item
    reading x itself. A DQ per channel along axis 1 (an integer Concat of inputs with their
    own scales and zero points, propagate_dequantize.py) reads q as it is (scale 1, zero point
    0) and starts the chain with Shift(-zp) and an exact Scale(s) per channel: the same
    f32(q - zp)·s, q - zp an exact integer."""
    if not best.quantized or not best.info.dtype.is_quantized:
        return None
    if any(isinstance(i, Residual | TensorOperand) and i.port == 0 for i in best.chain):
        return None
    first = best.chain[0]
    if isinstance(first, TensorOperand) and not _post_op_operand(
            graph.info(best.inputs[first.port]).shape, best.info.shape):
        return None  # a broadcast the binary primitive's own operand takes (lower_gate)
    dq = graph.producer(best.inputs[0])
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR or graph.constant(dq.inputs[0]) is not None:
        return None
    p = dq_params(graph, dq)
    if p is None or not p.dtype.is_quantized or not np.all(np.isfinite(p.scale)) or np.any(
            p.scale == 0):
        return None
    if not p.per_tensor:
        if p.axis != 1 or p.scale.size != best.info.shape[1]:
            return None
        prefix: list[ChainOp] = [Shift.of(-p.zero_point.astype(np.float32))] if np.any(
            p.zero_point) else []
        return dq, (1.0, 0), [*prefix, Scale(tuple(float(v) for v in p.scale), exact=True)]
    if p.zero_point.size != 1:
        return None
    return dq, (float(p.scale[0]), int(p.zero_point[0])), []


def _fuse(graph: Graph, ctx: PassContext, node: Node) -> bool:
    assert node.fused is not None
    out = node.outputs[0]
    start = _State(list(node.fused.chain), list(node.inputs), out, graph.info(out))
    channels = out_channels(graph, node)
    best, state, stop = _walk(graph, ctx, node, start, channels, limit=CHAIN_POST_OPS)
    if _lost_int_residual(state, best):
        # The dst stayed f32: sum the dequantized residual (f32) instead of its 8-bit source.
        retry = _walk(graph, ctx, node, dataclasses.replace(start, int_residual=False),
                      channels, limit=CHAIN_POST_OPS)
        if len(retry[0].absorbed) > len(best.absorbed):
            best, state, stop = retry
    note = f"chain ends: {stop.reason}"
    if stop.reader is None and note not in node.fused.notes:
        node.fused.notes.append(note)
    if len(state.absorbed) > len(best.absorbed):
        first = state.absorbed[len(best.absorbed)]
        ctx.decline(first, _rollback_reason(graph, node, first, state, best, stop))
    else:
        for reader in stop.decline:
            ctx.decline(reader, stop.reason)
    if not best.absorbed:
        return False
    _commit(graph, node, best)
    return True


def _walk(
    graph: Graph, ctx: PassContext, node: Node, start: _State, channels: int, *,
    limit: int | None
) -> tuple[_State, _State, _Stop]:
    """(the longest valid state, the last state reached, why the walk stopped); ``limit``:
    the most post-ops the chain may compose to (module docstring)."""
    best = state = start
    while True:
        try:
            new = _step(graph, node, state)
        except _Stop as stop:
            if state.pending and stop.reader is not None and stop.reader.op in _FLOAT_ONLY \
                    and not state.quantized and _valid(dataclasses.replace(state, pending=False)):
                best = state  # module docstring: the node writes the dequantized values
            elif state.pending and stop.reader is None and state.value in graph.outputs \
                    and ctx.composer.on("fold_output_dequantize"):
                best = _output_dequantize(state, channels, ctx) or best
            elif state.pending and _past_dequantize(state) and not state.quantized \
                    and _valid(dataclasses.replace(state, pending=False)) \
                    and ctx.composer.on("fold_float_dequantize"):
                # float ops after the dequantize (a residual stream's Add): the value is
                # float32 whatever the kernel writes, so it ends there (one kernel, not a
                # dequantize and an add)
                best = dataclasses.replace(state, pending=False)
            elif state.pending and (
                    (stop.reader is None and _float_readers(graph, state.value))
                    or _broadcast_operand(graph, stop.reader, state.value)) \
                    and ctx.composer.on("fold_float_dequantize"):
                best = _output_dequantize(state, channels, ctx) or best
            # without its traceback: its frames would hold the whole compile in a cycle
            return best, state, stop.with_traceback(None)
        reader = new.absorbed[-1]
        try:
            composed = compose(new.chain, channels=channels, dst_dtype=new.info.dtype,
                               options=ctx.composer)
        except ComposeError as exc:
            return best, state, _Stop(reader, f"post-op: the composer cannot take {reader}: "
                                              f"{exc}")
        if limit is not None and len(composed.post_ops) > limit:
            return best, state, _Stop(reader, f"post-op: with {reader} the chain of {node} "
                                      f"composes to {len(composed.post_ops)} post-ops, more "
                                      f"than {limit} (oneDNN's {MAX_POST_OPS} a primitive, "
                                      "less what lowering adds): a kernel of its own")
        state = new
        if _valid(state):
            best = state


def _past_dequantize(state: _State) -> bool:
    """The chain went on past its last dequantize into float ops of other operands (a
    tensor operand): its value is no longer the dequantized integers."""
    last = max((i for i, item in enumerate(state.chain)
                if isinstance(item, Scale) and i > 0 and isinstance(state.chain[i - 1], Shift)),
               default=None)
    return last is not None and any(isinstance(item, TensorOperand)
                                    for item in state.chain[last + 1:])


def _output_dequantize(state: _State, channels: int, ctx: PassContext) -> _State | None:
    """The pending state ending in a graph output's DequantizeLinear, its multiply made
    exact (module docstring), or None when the composer cannot take it, the state is not
    valid (an 8-bit residual summed into what is now a float32 dst), or the walk went on past
    the dequantize (a float op after it: the chain then does not end in its multiply)."""
    *head, scale = state.chain
    if not isinstance(scale, Scale) or not head or not isinstance(head[-1], Shift):
        return None
    new = dataclasses.replace(state, chain=[*head, dataclasses.replace(scale, exact=True)],
                              pending=False)
    if not _valid(new):
        return None
    try:
        compose(new.chain, channels=channels, dst_dtype=new.info.dtype, options=ctx.composer)
    except ComposeError:
        return None
    return new


def _float_readers(graph: Graph, value: str) -> bool:
    """Every reader of ``value`` (two or more) computes in float32 from it and none could read
    its integer source instead: activations, Mul, Add / Sub by a constant, Softmax — a
    SiLU's Sigmoid and Mul, a HardSwish's Add(x, 3) and Mul. Not an Add of two run-time
    tensors (another node's chain may sum its 8-bit source as a residual) and not a compute
    node (it takes the integer source)."""
    readers = graph.consumers(value)
    if len(readers) < 2:
        return False
    source = graph.producer(value)
    for reader, _ in readers:
        if reader.fused is not None or reader.op in COMPUTE_OPS:
            return False
        if activation(reader) is not None or reader.op in (Op.MUL, *_FLOAT_ONLY):
            continue
        others = [v for v in reader.inputs if v != value]
        if reader.op in (Op.ADD, Op.SUB) and any(
                constant_operand(graph, v)[0] is not None for v in others):
            continue
        # x + g(x), g computed from x (a squeeze-excitation's x + x·gate, PP-OCRv4 det's RSE
        # layers): the chain that computes g reads x as its float32 operand anyway
        if reader.op in (Op.ADD, Op.SUB) and source is not None and all(
                depends_on(graph, v, source) for v in others):
            continue
        # an average whose output no quantize reads runs in float32 (the int8 one needs an
        # output scale): a squeeze-excitation's pooling
        if reader.op in (Op.GLOBAL_AVG_POOL, Op.AVG_POOL, Op.REDUCE_MEAN) and not any(
                c.op is Op.FAKE_QUANTIZE for c, _ in graph.consumers(reader.outputs[0])):
            continue
        return False
    return True


def _broadcast_operand(graph: Graph, reader: Node | None, value: str) -> bool:
    """``value`` is read only by ``reader``, a Mul or Add that broadcasts it over a larger
    tensor, or a Div or Sub that takes it as its second operand so: a squeeze-excitation's
    gate (quantize_static's HardSigmoid → Q → DQ → Mul), F.normalize's clipped norm (NNCF's
    XCiT: ReduceL2 → Clip → Q → DQ → Div), which that node's kernel reads as a float32
    binary operand."""
    if reader is None or value in graph.outputs or not (
            reader.op in (Op.MUL, Op.ADD) or (reader.op in (Op.DIV, Op.SUB)
                                              and reader.inputs[1:] == [value])):
        return False
    readers = graph.consumers(value)
    return (len(readers) == 1 and reader.inputs.count(value) == 1
            and graph.info(value).shape != graph.info(reader.outputs[0]).shape)


def _lost_int_residual(state: _State, best: _State) -> bool:
    residual = state.residual
    return (residual is not None and residual.dtype.is_quantized and best.residual is None
            and not state.info.dtype.is_quantized)


def _valid(state: _State) -> bool:
    """Not inside a quantize → dequantize pair, and a residual the primitive can add: oneDNN's
    sum reads it from the dst buffer (equal element sizes); a float32 residual into an 8-bit
    dst is a binary_add post-op reading it (attrs._residual: the same float32 add; TensorRT-
    style models, whose residual Add of two float32 convolution outputs is then quantized)."""
    residual = state.residual
    if state.pending:
        return False
    return (residual is None or residual.dtype.np.itemsize == state.info.dtype.np.itemsize
            or (residual.dtype is DType.F32 and state.info.dtype.is_quantized))


def _rollback_reason(graph: Graph, node: Node, first: Node, state: _State, best: _State,
                     stop: _Stop) -> str:
    why = stop.reason
    if first.op is Op.FAKE_QUANTIZE and float_compute(graph, node):
        return (f"post-op: {node} computes in float32 and oneDNN's float32 convolutions and "
                "matmuls write float32 only on jit kernels: it takes a quantize only with "
                f"the dequantize after it ({why})")
    if first.op is Op.DEQUANTIZE_LINEAR and first.outputs[0] in graph.outputs:
        return (f"post-op: dequantizes the graph output '{first.outputs[0]}' (stays standalone, "
                "outside the quantized region)")
    if any(n.op is Op.DEQUANTIZE_LINEAR for n in state.absorbed[len(best.absorbed):]) and (
            best.quantized):
        return ("post-op: a DequantizeLinear after the output quantize continues a chain only "
                f"into a residual Add or a requantize, and neither followed ({why})")
    residual = state.residual
    if residual is not None:
        return (f"post-op: a {residual.dtype.name} residual cannot be summed into a "
                f"{state.info.dtype.name} output: oneDNN's sum needs equal element sizes "
                f"({why})")
    return f"post-op: rolled back ({why})"


def _commit(graph: Graph, node: Node, best: _State) -> None:
    for port in range(len(node.inputs), len(best.inputs)):
        assert not depends_on(graph, best.inputs[port], node), "residual depends on the node"
    assert node.fused is not None
    old_src = None
    if best.info.shape[:-1] != graph.info(node.outputs[0]).shape[:-1]:
        best.inputs[0], old_src = matmul_reshape.reshaped_source(graph, node, best.info.shape)
    absorbed = [o for n in [*best.absorbed, *best.extra] for o in n.origin]
    fused = dataclasses.replace(node.fused, chain=best.chain,
                                absorbed=[*node.fused.absorbed, *absorbed])
    new = retarget(graph, node, inputs=best.inputs, output=best.value, absorbed=best.absorbed,
                   fused=fused, info=best.info)
    constants = [p for n in best.absorbed for v in n.inputs if v
                 if (p := graph.producer(v)) is not None and p.op is Op.DEQUANTIZE_LINEAR]
    drop_if_unread(graph, [*best.extra, *constants, *([old_src] if old_src else [])])
    log.debug("%s: chain of %d item(s), absorbed %s", new, len(fused.chain), absorbed)


# ------------------------------------------------------------------------------ one step
def _step(graph: Graph, node: Node, state: _State) -> _State:
    """The state after absorbing the reader of ``state.value``; raises _Stop otherwise."""
    reader, why = sole_reader(graph, state.value)
    if reader is None:
        multi = graph.consumers(state.value) if "readers" in why else []
        others = [r for r, _ in multi if r.op not in COMPUTE_OPS and r.fused is None]
        raise _Stop(None, f"post-op: {why} (the chain of {node} stops there)", others)
    if reader.op in COMPUTE_OPS or reader.fused is not None:
        raise _Stop(None, f"'{state.value}' feeds the compute node {reader}")
    out_info = graph.info(reader.outputs[0])
    if reader.op in matmul_reshape.SHAPE_OPS:
        why = matmul_reshape.why_not(graph, node, state.chain, state.info, out_info)
        if why:
            raise _Stop(reader, f"post-op: {reader.op.value} {why} (no oneDNN post-op)")
        return state.extended([], reader, info=out_info)
    if state.quantized:
        return _after_quantize(graph, node, state, reader, out_info)
    if (reader.op is Op.CAST and state.info.dtype is DType.S32 and not state.chain
            and out_info.dtype is DType.F32):
        return state.extended([], reader, info=out_info)  # x = f32(acc): the chain's start
    if state.info.dtype is not DType.F32:
        raise _Stop(reader, f"post-op: {reader} reads {state.info.dtype.name}, not float32")
    if out_info.shape != state.info.shape:
        raise _Stop(reader, f"post-op: {reader} changes the shape {list(state.info.shape)} "
                            f"→ {list(out_info.shape)}")
    return _absorb(graph, node, state, reader, out_info)


def _after_quantize(
    graph: Graph, node: Node, state: _State, reader: Node, out_info: TensorInfo
) -> _State:
    if reader.op is not Op.DEQUANTIZE_LINEAR or reader.inputs[0] != state.value:
        raise _Stop(reader, _no_post_op(reader, quantized=True))
    axis = channel_axis(node, state.info.rank)
    scale, zero_point = _dq_params(graph, reader, state.info, axis)
    if scale is None:
        raise _Stop(reader, f"post-op: {reader}: {zero_point}")
    if float_compute(graph, node):  # the float32 values (Q(x) − zp)·s: the node's dst
        return state.extended(_dequantize(scale, zero_point, exact=True), reader,
                              info=out_info, pending=False)
    return state.extended(_dequantize(scale, zero_point, exact=False), reader, info=out_info,
                          pending=True)


def _dequantize(scale: Sequence[float], zero_point: Sequence[float], *, exact: bool
                ) -> list[ChainOp]:
    """A dequantize's chain items, ``(q − zp)·s``; ``exact``: the multiply as the standalone
    op rounds it (the chain's end writes it), not folded into what follows."""
    return [Shift.of([-float(z) for z in zero_point]),
            dataclasses.replace(Scale.of(scale), exact=exact)]


def _dq_params(
    graph: Graph, dq: Node, info: TensorInfo, axis: int | None
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | str]:
    """(scales, zero points) of a DequantizeLinear per tensor or along ``axis`` (None: per
    tensor only), or (None, why not)."""
    scale = graph.constant(dq.inputs[1])
    zp = graph.constant(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] else None
    if scale is None or (len(dq.inputs) > 2 and dq.inputs[2] and zp is None):
        return None, "scale or zero point is not a constant"
    if scale.size > 1 and (axis is None or dq.attrs.axis % info.rank != axis):
        return None, f"per-axis along {dq.attrs.axis}, not the channel axis {axis}"
    s = tuple(float(v) for v in scale.astype("float32").ravel())
    z = tuple(float(v) for v in (zp.ravel() if zp is not None else [0] * len(s)))
    return s, z


def _absorb(graph: Graph, node: Node, state: _State, reader: Node, out_info: TensorInfo
            ) -> _State:
    op, value = reader.op, state.value
    if op is Op.FAKE_QUANTIZE:
        return _quantize(graph, node, state, reader, out_info)
    act = activation(reader)
    if act is not None:
        return state.extended([act], reader, info=out_info)
    if op in (Op.ADD, Op.MUL, Op.PRELU):
        port = reader.inputs.index(value)
        if op is Op.PRELU and port != 0:
            raise _Stop(reader, f"post-op: {reader} reads the chain as its slopes")
        other = reader.inputs[1 - port]
        data, _ = constant_operand(graph, other)
        if data is None and op is Op.ADD and not _is_gate(node):
            return _residual(graph, state, reader, other, out_info)
        if data is None and op in (Op.MUL, Op.ADD):  # a gate's residual is a binary add
            return _tensor_operand(graph, node, state, reader, other, out_info)
        if data is None:
            raise _Stop(reader, f"post-op: {reader}: operand '{other}' is not a constant")
        values, why = channel_values(data, state.info.shape,
                                     channel_axis(node, state.info.rank))
        if values is None and op in (Op.MUL, Op.ADD):
            whole = _whole_constant(graph, node, data, state.info.shape, other)
            if whole is not None:
                return _tensor_operand(graph, node, state, reader, whole, out_info)
        if values is None:
            raise _Stop(reader, f"post-op: {reader}: operand '{other}' {why}")
        item: ChainOp = (Shift.of(values) if op is Op.ADD else Scale.of(values)
                         if op is Op.MUL else PRelu(tuple(float(v) for v in values)))
        return state.extended([item], reader, info=out_info)
    raise _Stop(reader, _no_post_op(reader, quantized=False))


def _quantize(graph: Graph, node: Node, state: _State, fq: Node, out_info: TensorInfo
              ) -> _State:
    pair = fq.attrs.onnx
    whole_pair = out_info.dtype is DType.F32 and pair is not None and pair.dequantize
    if not out_info.dtype.is_quantized and not whole_pair:
        raise _Stop(fq, f"post-op: {fq} outputs {out_info.dtype.name} (not a quantize-only "
                        "FakeQuantize)")
    axis = channel_axis(node, state.info.rank)
    ranges = []
    for port in range(1, 5):
        data = graph.constant(fq.inputs[port])
        if data is None:
            raise _Stop(fq, f"post-op: {fq}: range input {port} is not a constant")
        values, why = channel_values(data, state.info.shape, axis)
        if values is None:
            raise _Stop(fq, f"post-op: {fq}: range input {port} {why}")
        ranges.append(tuple(float(v) for v in values))
    if whole_pair:  # a Q/DQ pair with no 8-bit form (16-bit): its float values (Q(x) − zp)·s
        assert pair is not None
        quant = pair.quant
        if quant.axis is not None and quant.axis % state.info.rank != axis:
            raise _Stop(fq, f"post-op: {fq}: per-axis along {quant.axis}, not the channel "
                            f"axis {axis}")
        item = Quantize(*ranges, levels=fq.attrs.levels, dtype=pair.dtype,
                        scale=quant.scale[0] if quant.per_tensor else None, onnx=pair)
        return state.extended([item, *_dequantize(quant.scale, quant.zero_point, exact=True)],
                              fq, info=out_info, pending=False)
    known = out_info.quant.scale[0] if out_info.quant and out_info.quant.per_tensor else None
    item = Quantize(*ranges, levels=fq.attrs.levels, dtype=out_info.dtype, scale=known,
                    onnx=fq.attrs.onnx)
    # a float node's 8-bit dst is not valid (pending) until its dequantize follows
    return state.extended([item], fq, info=out_info, pending=float_compute(graph, node))


def _residual(graph: Graph, state: _State, add: Node, other: str, out_info: TensorInfo
              ) -> _State:
    if state.residual is not None:
        raise _Stop(add, "post-op: the chain already has a residual sum (oneDNN allows one "
                         "sum post-op)")
    info = graph.info(other)
    if info.shape != state.info.shape:
        raise _Stop(add, f"post-op: {add}: residual '{other}' of shape {list(info.shape)} "
                         f"broadcasts against {list(state.info.shape)}")
    port = len(state.inputs)
    item, source, extra = Residual(port), other, []
    dq = graph.producer(other)
    if state.int_residual and dq is not None and dq.op is Op.DEQUANTIZE_LINEAR:
        r_info = graph.info(dq.inputs[0])
        scale, zero_point = _dq_params(graph, dq, r_info, None)
        if (scale is not None and len(scale) == 1 and r_info.dtype.is_quantized
                and graph.constant(dq.inputs[0]) is None):
            item = Residual(port, scale[0], int(zero_point[0]), r_info.dtype)
            source, extra = dq.inputs[0], [dq]
    if item.dtype is DType.F32 and info.dtype is not DType.F32:
        raise _Stop(add, f"post-op: {add}: residual '{other}' is {info.dtype.name}")
    new = state.extended([item], add, info=out_info, pending=False)
    new.inputs.append(source)
    new.extra.extend(extra)
    return new


def _tensor_operand(graph: Graph, node: Node, state: _State, mul: Node, other: str,
                    out_info: TensorInfo) -> _State:
    """``x · r`` / ``x + r`` with r a float tensor read at run time (TensorOperand): r of the
    chain's shape or broadcast to it, and not computed from the node itself."""
    if node.op not in COMPUTE_OPS and not _is_gate(node):
        raise _Stop(mul, f"post-op: {mul}: a {node.op.value} kernel takes no run-time operand")
    info = graph.info(other)
    shape = state.info.shape
    if not _broadcast_f32(info, shape, lower_rank=node.op in COMPUTE_OPS):
        raise _Stop(mul, f"post-op: {mul}: operand '{other}' ({info.dtype.name} "
                         f"{list(info.shape)}) is not a float32 tensor broadcast to "
                         f"{list(shape)}")
    if other not in state.inputs and depends_on(graph, other, node):
        raise _Stop(mul, f"post-op: {mul}: operand '{other}' is computed from {node}")
    new = state.extended([], mul, info=out_info)
    if other not in new.inputs:
        new.inputs.append(other)
    new.chain.append(TensorOperand(new.inputs.index(other),
                                   "add" if mul.op is Op.ADD else "mul"))
    return new


# Largest constant operand stored at the chain's full size (``_whole_constant``).
WHOLE_CONSTANT_BYTES = 16 << 20


def _whole_constant(graph: Graph, node: Node, data: np.ndarray, shape: tuple[int, ...],
                    value: str) -> str | None:
    """A constant Mul / Add operand of a matmul's chain that varies along other dims than
    the channels (attention's position bias, [h, N, N] on the scores [B, h, N, N]: LeViT,
    Swin): a float32 constant of the chain's full shape, read by a binary post-op without
    broadcast (oneDNN's jit kernels take that; a broadcast along the batch would not be).
    None for another node, or when the stored copy would pass WHOLE_CONSTANT_BYTES."""
    if node.op is not Op.MATMUL or np.ndim(data) > len(shape):
        return None
    dims = _aligned(tuple(np.shape(data)), len(shape))
    if any(d not in (1, s) for d, s in zip(dims, shape, strict=True)) or \
            math.prod(shape) * 4 > WHOLE_CONSTANT_BYTES:
        return None
    whole = np.ascontiguousarray(np.broadcast_to(
        np.asarray(data, np.float32).reshape(dims), shape))
    return graph.add_constant(graph.unique_name(f"{value}@whole"), whole).name


def _broadcast_f32(info: TensorInfo, shape: tuple[int, ...], *, lower_rank: bool = False
                   ) -> bool:
    """A float32 tensor of ``shape`` or one that broadcasts to it dim by dim (``lower_rank``:
    also one of lower rank, aligned on the trailing dims as ONNX broadcasts)."""
    dims = _aligned(info.shape, len(shape)) if lower_rank else tuple(info.shape)
    return info.dtype is DType.F32 and len(dims) == len(shape) and all(
        d in (1, s) for d, s in zip(dims, shape, strict=True))


def _same_rank_operands(graph: Graph, best: _State) -> _State:
    """A constant operand of lower rank than the chain (a LayerNorm's γ [C] on [N, T, C]) as a
    new constant of the chain's rank, left-padded with 1s: ONNX broadcasting's own alignment,
    the same values, so the primitive and the unfused mode read a same-rank operand."""
    rank = len(best.info.shape)
    inputs = list(best.inputs)
    for item in best.chain:
        if not isinstance(item, TensorOperand):
            continue
        value = inputs[item.port]
        info = graph.info(value)
        data, _ = constant_operand(graph, value)
        if data is None or info.rank >= rank:
            continue
        padded = np.asarray(data, np.float32).reshape(_aligned(info.shape, rank))
        inputs[item.port] = graph.add_constant(graph.unique_name(f"{value}@rank{rank}"),
                                               padded).name
    return dataclasses.replace(best, inputs=inputs)


def _no_post_op(reader: Node, *, quantized: bool) -> str:
    name = reader.op.value
    if reader.op in _MOVE_OPS:
        return f"post-op: {name} moves data (no oneDNN post-op)"
    if quantized:
        return (f"post-op: {name} reads the quantized output (after the output quantize only a "
                "DequantizeLinear into a residual Add or a requantize continues a chain)")
    return f"post-op: {name} has no oneDNN post-op"
