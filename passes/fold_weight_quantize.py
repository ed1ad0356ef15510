"""FakeQuantize on constant float weights → s8 constant + DequantizeLinear (docs/design.md
"Passes" 3; OpenVINO-style models quantize weights with a FakeQuantize on the float
constant, ONNX Runtime stores them already quantized — after this pass both look alike).

The weights may be a DequantizeLinear of constants: one initializer shared by two layers
(tied or deduplicated weights, torch.onnx's ``Identity`` between them) that NNCF quantizes
once per layer, the first quantizer folded into an int8 initializer, the second a
``Q(DQ(w_q))`` on the first one's float values. Evaluated by the reference, it is a constant.

For each channel c of the ranges (FakeQuantize formula in OpenVINO fake_quantize.md, L levels):

    k = round((w - il)/(ih - il)·(L-1))           (0 below il, L-1 above ih)
    FQ(w) = k/(L-1)·(oh - ol) + ol = So·(k + T),   So = (oh - ol)/(L-1),  T = ol/So

so w_q = k + T is an s8 value with scale So and zero point 0 when T is an integer and
[T, T + L - 1] lies in [-128, 127]: symmetric ranges, L = 255 (T = -127) or 256 (T = -128).
k is computed with the reference interpreter's float32 expression, so w_q is exactly the level
the float FakeQuantize picks; So·w_q differs from FQ(w) by float32 rounding only. A
FakeQuantize that stands for an ONNX Q/DQ pair (``attrs.onnx``) takes ONNX's own levels,
``saturate(rint(w/s) + zp)``, as the reference computes them.

Preconditions (declined otherwise, with the reason): ranges constant; 2 <= L <= 256; ranges
per tensor or per channel along the output-channel axis of every reader (Conv weights: axis 0,
ConvTranspose: 1, MatMul B: the last); il < ih and ol < oh; T integral; and the s8 range
with zero point 0 — an asymmetric weight range needs a weight zero point, which oneDNN
convolution does not have (docs/onednn.md).
"""

from __future__ import annotations

import logging

import numpy as np

from qfuse.ir.graph import Graph, Node
from qfuse.ir.ops import Op
from qfuse.ir.types import DType, OnnxQuantize, QuantParams, TensorInfo
from qfuse.runtime.reference.ops_quant import quantize_onnx
from qfuse.passes.base import PassContext
from qfuse.passes.decompose_fake_quantize import INTEGRAL_TOLERANCE, channel_vector
from qfuse.passes.gemm_to_matmul import transpose_dequantized
from qfuse.passes.post_op_match import constant_operand
from qfuse.passes.quant_utils import add_dequantize, along, fq_ranges, range_axis, rebuild

log = logging.getLogger(__name__)

F32 = np.float32


def _gemm_transpose(node: Node) -> bool:
    return node.op is Op.TRANSPOSE and tuple(node.attrs.perm) == (1, 0)


def weight_axis(graph: Graph, value: str) -> int | None | str:
    """The output-channel axis every reader of weights ``value`` agrees on; None when no
    reader is a weight port; "mixed" when they disagree. Through a Transpose (gemm_to_matmul's
    of a Gemm's transB weights) the axis is its reader's, swapped back."""
    rank = graph.info(value).rank
    found: set[int | None | str] = set()
    for reader, port in graph.consumers(value):
        if port == 1 and reader.op is Op.CONV:
            found.add(0)
        elif port == 1 and reader.op is Op.CONV_TRANSPOSE:
            found.add(1)
        elif port == 1 and reader.op is Op.MATMUL:
            found.add(rank - 1)
        elif _gemm_transpose(reader):
            axis = weight_axis(graph, reader.outputs[0])
            found.add(1 - axis if isinstance(axis, int) else axis)
        else:
            found.add(None)
    if len(found) > 1:
        return "mixed"
    return found.pop() if found else None  # type: ignore[return-value]


def levels_of(w: np.ndarray, il: np.ndarray, ih: np.ndarray, levels: int) -> np.ndarray:
    """The FakeQuantize level index k of every weight (reference float32 expression)."""
    steps = F32(levels - 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = np.rint((w - il) / (ih - il) * steps)
    k = np.where(w <= np.minimum(il, ih), F32(0), k)
    return np.where(w > np.maximum(il, ih), steps, k)


def plan(graph: Graph, fq: Node, w: np.ndarray) -> tuple[np.ndarray, QuantParams] | str:
    """(s8 weights, their QuantParams), or why the FakeQuantize of weights ``w`` cannot be
    folded."""
    ranges = fq_ranges(graph, fq)
    if ranges is None:
        return "input/output ranges are not constants"
    levels = fq.attrs.levels
    if not 2 <= levels <= 256:
        return f"levels={levels} does not fit 8 bits (want 2..256)"
    w = np.asarray(w, dtype=F32)
    rank = w.ndim
    axes = {range_axis(a.shape, rank) for a in ranges} - {None}
    if len(axes) > 1 or "many" in axes:
        return "ranges vary along more than one axis (not per tensor or per channel)"
    axis = axes.pop() if axes else None
    wanted = weight_axis(graph, fq.outputs[0])
    if axis is not None and axis != wanted:
        return (f"ranges are per channel along axis {axis}, not along the output-channel "
                f"axis of the weights' readers ({wanted})")
    channels = w.shape[axis] if isinstance(axis, int) else 1
    il, ih, ol, oh = (channel_vector(a, rank, axis, channels) for a in ranges)  # type: ignore
    if np.any(il >= ih) or np.any(oh <= ol):
        return "input_low >= input_high or output_low >= output_high"
    step = (oh.astype(np.float64) - ol) / (levels - 1)
    t = ol / step
    t_int = np.rint(t)
    if float(np.max(np.abs(t - t_int))) > INTEGRAL_TOLERANCE:
        return "output range is not a dequantization with an integer zero point"
    if t_int.min() < -128 or t_int.max() + levels - 1 > 127:
        return (f"asymmetric weight range (levels {int(t_int.min())}..."
                f"{int(t_int.max()) + levels - 1} do not fit s8 with zero point 0): oneDNN "
                "has no weight zero points for conv")
    ax = axis if channels > 1 else None
    if fq.attrs.onnx is not None:
        return _onnx_levels(w, fq.attrs.onnx)
    k = levels_of(w, *(along(v, rank, ax) for v in (il, ih)), levels)  # type: ignore[arg-type]
    q = (k + along(t_int.astype(F32), rank, ax)).astype(np.int8)
    scale = step.astype(F32)
    quant = (QuantParams.make(scale[0], 0) if ax is None
             else QuantParams.make(scale, np.zeros(channels, np.int64), ax))
    return q, quant


def _onnx_levels(w: np.ndarray, form: OnnxQuantize) -> tuple[np.ndarray, QuantParams]:
    """ONNX's ``saturate(rint(w/s) + zp)`` (the reference's QuantizeLinear) as s8 with zero
    point 0: ``q − zp``, which ``plan``'s range checks put in s8; the model's own scales, so
    ``(q − zp)·s`` is the same float32 product as the pair's DequantizeLinear."""
    quant = form.quant
    axis = quant.axis % w.ndim if quant.axis is not None else None
    zp = quant.zero_point_array()
    q = quantize_onnx(w, quant.scale_array(), zp, form.dtype, 1 if axis is None else axis)
    q = (q - along(zp.astype(F32), w.ndim, axis if zp.size > 1 else None)).astype(np.int8)
    scale = quant.scale_array().astype(F32)
    params = (QuantParams.make(scale.reshape(-1)[0], 0) if scale.size == 1
              else QuantParams.make(scale, np.zeros(scale.size, np.int64), axis))
    return q, params


def _transpose_folded(graph: Graph, transpose: Node) -> None:
    """``Transpose(DQ(q, axis))`` of 2-D weights (gemm_to_matmul's, of a Gemm's transB,
    inserted before this pass made them constant) as ``DQ(qᵀ, 1 − axis)``, as gemm_to_matmul
    transposes the weights it finds constant."""
    dq = graph.producer(transpose.inputs[0])
    assert dq is not None
    value = transpose_dequantized(graph, dq, transpose.inputs[0])
    graph.replace_all_uses(transpose.outputs[0], value)
    graph.remove_node(transpose)


def run(graph: Graph, ctx: PassContext) -> int:
    changed = 0
    for fq in graph.topo_order():
        if fq.op is not Op.FAKE_QUANTIZE:
            continue
        w, _ = constant_operand(graph, fq.inputs[0])
        if w is None:
            continue
        ctx.visit(fq)
        if graph.info(fq.outputs[0]).dtype.is_integer:
            continue
        found = plan(graph, fq, w)
        if isinstance(found, str):
            ctx.decline(fq, found)
            continue
        q, quant = found
        name = graph.unique_name(f"{fq.inputs[0]}_quantized")
        graph.add_constant(name, q, TensorInfo(tuple(q.shape), DType.S8, quant))
        out = fq.outputs[0]

        def build(fq: Node = fq, name: str = name, quant: QuantParams = quant,
                  out: str = out) -> None:
            add_dequantize(graph, name, quant, out, origin=fq.origin,
                           name=f"{fq.name}/dequantize")

        rebuild(graph, [fq], build)
        for reader in [r for r, _ in graph.consumers(out) if _gemm_transpose(r)]:
            _transpose_folded(graph, reader)
        changed += 1
    if changed:
        graph.remove_unused()
    return changed
