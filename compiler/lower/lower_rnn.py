"""A recurrent island (one ONNX LSTM, GRU or RNN node) as oneDNN's RNN primitive.

The importer keeps these ops as float islands (compiler/onnx_import/islands.py): the IR has no
op for them, and the reference, the emulation and the passes see onnxruntime's node. Run as
an island, onnxruntime steps through the sequence on its own thread pool, which does not spin
between runs (runtime/reference/ops_island.py) and so wakes its threads for every step: a
bidirectional LSTM of 20 steps, 512 channels, took 4.4 ms per run inside a compiled OCR model
(ddddocr) on 2 threads against 2.4 ms in an onnxruntime session of its own. oneDNN's RNN
primitive runs the whole layer on the OpenMP threads every other kernel uses.

How the ONNX operator (https://onnx.ai/onnx/operators/onnx__LSTM.html, GRU, RNN) maps onto
oneDNN's (oneDNN 3.2 developer guide, "RNN"; D directions, T steps, N batch, I input and H
hidden channels, G gates):

- gates: ONNX stacks LSTM's W, R and B rows as i, o, f, c; oneDNN's gate axis is i, f, c~, o.
  GRU's z, r, h are oneDNN's u, r, o, in that order. RNN has one gate.
- weights: W [D, G·H, I] becomes weights_layer {1, D, I, G, H} and R [D, G·H, H]
  weights_iter {1, D, H, G, H}, reordered once (packed by the primitive, or plain: ``_lower``).
- bias: B [D, 2·G·H] is Wb then Rb, each added to every step's gates; oneDNN adds one bias
  {1, D, G, H} = Wb + Rb. GRU with ``linear_before_reset`` (oneDNN's LBR GRU) keeps the
  recurrent candidate bias apart, as it is multiplied by the reset gate: a 4th gate Rbh.
- peepholes: P [D, 3·H] is i, o, f; oneDNN's {1, D, 3, H} is i, f, o.
- layout 0: X [T, N, I] is src_layer tnc; Y [T, D, N, H] is a strided view of dst_layer
  {T, N, D·H} (bidirectional: forward then backward channels); Y_h, Y_c and the initial
  states [D, N, H] are dst_iter / src_iter {1, D, N, H}, the same bytes.
- layout 1: X [N, T, I] is src_layer ntc, Y [N, T, D, H] dst_layer ntc (the same bytes);
  the states [N, D, H] are strided views of {1, D, N, H}.

Declined (the node stays an island, and inspect says why): activations other than oneDNN's
(LSTM Sigmoid, Tanh, Tanh; GRU Sigmoid, Tanh; RNN Tanh, Relu or Sigmoid, the same in both
directions), ``clip``, ``input_forget``, ``sequence_lens`` unless a constant equal to T
everywhere, weights or bias not constant, a type other than float32, a zero-size dim.

Numerics: float32 like onnxruntime, not bit-identical to it (oneDNN sums products in its own
blocking order, adds one folded bias, and uses its own vectorized logistic and tanh);
tests/compiler/test_lower_rnn.py bounds the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import is_row_major, plain_md
from qfuse.ir import Node
from qfuse.ir.ops import IslandAttrs
from qfuse.ir.types import DType
from qfuse.runtime.onednn import DataType, MemoryDesc, PrimitiveDesc, get_num_threads
from qfuse.runtime.onednn.enums import Alg, Arg, FormatTag, RnnDirection
from qfuse.runtime.onednn.memory import Memory
from qfuse.runtime.onednn.primitives import rnn
from qfuse.runtime.onednn.threads import team

_PACKED_FROM = 128  # hidden channels from which the weights are packed (``_lower``)
# Hidden channels up to which the GEMM-driven ("ref") RNN runs on one thread. Measured on a
# 2-core AMD EPYC (AVX-512 VNNI), 100 steps, 1 against 2 threads: GRU 64 → 96 105 / 161 µs,
# LSTM 64 → 96 135 / 181, GRU 128 → 128 175 / 205, bidirectional 704 / 810; 32 and 64 hidden
# channels the same either way; GRU 256 → 256 750 / 460 and 512 1989 / 1131 (two win).
ONE_THREAD_HIDDEN = 128
# ONNX's gate rows in oneDNN's gate order
_LSTM_GATES = (0, 2, 3, 1)  # i, o, f, c -> i, f, c, o
_PEEPHOLES = (0, 2, 1)  # i, o, f -> i, f, o
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}
_RNN_ACTIVATIONS = {"Tanh": Alg.eltwise_tanh, "Relu": Alg.eltwise_relu,
                    "Sigmoid": Alg.eltwise_logistic}
_DIRECTIONS = {"forward": RnnDirection.unidirectional_left2right,
               "reverse": RnnDirection.unidirectional_right2left,
               "bidirectional": RnnDirection.bidirectional_concat}


@dataclass(frozen=True)
class _Layer:
    """What the primitive needs from one recurrent node, in ONNX's terms."""

    op: str  # LSTM, GRU or RNN
    cell: Alg
    activation: Alg  # RNN's; the others' are fixed
    direction: str
    hidden: int
    layout: int
    inputs: dict[int, str]  # ONNX input index -> the IR value (non-constant inputs)
    consts: dict[int, np.ndarray]  # ONNX input index -> constant
    outputs: dict[int, str]  # ONNX output index -> the IR value


def _recurrent(ctx: LowerContext, node: Node) -> _Layer | str | None:
    """The island's one recurrent node; a reason when oneDNN cannot run it; None when the
    island is something else."""
    attrs: IslandAttrs = node.attrs
    if len(attrs.ops) != 1 or attrs.ops[0] not in ("LSTM", "GRU", "RNN") or any(attrs.dynamic):
        return None
    model = onnx.load_from_string(attrs.model)
    (proto,) = model.graph.node
    op = proto.op_type
    if proto.domain not in ("", "ai.onnx"):
        return None
    values = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    ports = {i.name: port for port, i in enumerate(model.graph.input)}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    inputs: dict[int, str] = {}
    consts: dict[int, np.ndarray] = {}
    for index, name in enumerate(proto.input):
        if not name:
            continue
        if name in inits:
            consts[index] = inits[name]
        elif name in ports:
            value = node.inputs[ports[name]]
            data = ctx.const(value)
            if data is not None:
                consts[index] = np.asarray(data)
            else:
                inputs[index] = value
    outputs = {index: node.outputs[i] for i, index in enumerate(
        index for index, name in enumerate(proto.output) if name)}
    direction = values.get("direction", b"forward").decode()
    layout = int(values.get("layout", 0))
    x = inputs.get(0)
    if x is None or ctx.info(x).dtype is not DType.F32:
        return "X is not a float32 tensor"
    if any(k in consts and np.asarray(consts[k]).dtype != np.float32 for k in (1, 2, 3, 5, 6, 7)):
        return "its weights or states are not float32"
    for index, what in ((1, "W"), (2, "R"), (3, "B"), (7, "P")):
        if index in inputs:
            return f"{what} arrives at run time (oneDNN packs the weights once)"
    if "clip" in values:
        return "clip: oneDNN's cells do not clip"
    if int(values.get("input_forget", 0)):
        return "input_forget: oneDNN's LSTM has no coupled input and forget gates"
    if direction not in _DIRECTIONS or layout not in (0, 1):
        return f"direction {direction!r} / layout {layout}"
    shape = ctx.info(x).shape
    steps = shape[1] if layout else shape[0]
    if 4 in inputs:
        return "sequence_lens arrives at run time"
    if 4 in consts and not np.all(np.asarray(consts[4]) == steps):
        return "sequence_lens shorter than the sequence (oneDNN runs every step)"
    names = [a.decode() if isinstance(a, bytes) else a for a in values.get("activations", [])]
    directions = 2 if direction == "bidirectional" else 1
    activation = Alg.eltwise_tanh
    if op == "RNN":
        names = names or ["Tanh"] * directions
        if len(set(names)) != 1 or names[0] not in _RNN_ACTIVATIONS \
                or "activation_alpha" in values or "activation_beta" in values:
            return f"activations {names}: oneDNN's RNN cell takes one of Tanh, Relu, Sigmoid"
        activation = _RNN_ACTIVATIONS[names[0]]
    elif names and names != list(_DEFAULT_ACTIVATIONS[op]) * directions:
        return (f"activations {names}: oneDNN's {op} cell computes "
                f"{', '.join(_DEFAULT_ACTIVATIONS[op])}")
    if 1 not in consts or 2 not in consts or consts[2].ndim != 3:
        return "W or R missing"
    if 0 in (*shape, *consts[2].shape):
        return "a zero-size dimension"
    cell = {"LSTM": Alg.vanilla_lstm, "RNN": Alg.vanilla_rnn}.get(op) or (
        Alg.lbr_gru if int(values.get("linear_before_reset", 0)) else Alg.vanilla_gru)
    return _Layer(op, cell, activation, direction, int(consts[2].shape[-1]), layout, inputs,
                  consts, outputs)


def lower_recurrent(ctx: LowerContext, node: Node) -> tuple[bool, str]:
    """(lowered, why not): the island as oneDNN's RNN primitive when it is one recurrent
    node oneDNN can run; else nothing is emitted, with the reason for the island's note
    ("" when the island is not a recurrent node)."""
    layer = _recurrent(ctx, node)
    if layer is None:
        return False, ""
    if isinstance(layer, str):
        return False, f"not oneDNN's RNN: {layer}"
    _lower(ctx, node, layer)
    return True, ""


def _weights(layer: _Layer, array: np.ndarray, gates: int) -> np.ndarray:
    """ONNX's W or R [D, G·H, C] as oneDNN's {1, D, C, G, H}, gates in oneDNN's order."""
    d, _, c = array.shape
    w = array.reshape(d, -1, layer.hidden, c)[:, :gates]
    if layer.op == "LSTM":
        w = w[:, list(_LSTM_GATES)]
    return np.ascontiguousarray(w.transpose(0, 3, 1, 2))[None]


def _bias(layer: _Layer, gates: int, directions: int) -> np.ndarray:
    """oneDNN's bias {1, D, G, H} from ONNX's B (zero when absent)."""
    h = layer.hidden
    onnx_gates = gates - (layer.cell == Alg.lbr_gru)
    b = layer.consts.get(3)
    if b is None:
        return np.zeros((1, directions, gates, h), np.float32)
    b = np.asarray(b, np.float32).reshape(directions, 2, onnx_gates, h)
    if layer.cell == Alg.lbr_gru:  # Wb + Rb for z and r, then Wbh, then Rbh on its own
        folded = np.concatenate([b[:, 0, :2] + b[:, 1, :2], b[:, 0, 2:], b[:, 1, 2:]], axis=1)
    else:
        folded = b[:, 0] + b[:, 1]
        if layer.op == "LSTM":
            folded = folded[:, list(_LSTM_GATES)]
    return np.ascontiguousarray(folded, np.float32)[None]


def _lower(ctx: LowerContext, node: Node, layer: _Layer) -> None:
    f32 = DataType.f32
    x = layer.inputs[0]
    shape = ctx.info(x).shape
    steps, batch = (shape[1], shape[0]) if layer.layout else (shape[0], shape[1])
    channels, h = shape[2], layer.hidden
    directions = 2 if layer.direction == "bidirectional" else 1
    onnx_gates = layer.consts[1].shape[1] // h
    gates = onnx_gates + (layer.cell == Alg.lbr_gru)  # LBR GRU's bias has a 4th gate
    lstm = layer.op == "LSTM"
    # src_layer / dst_layer: tnc over {T, N, C}, or ntc (layout 1: the batch outermost)
    seq_tag = FormatTag.bac if layer.layout else FormatTag.abc
    src_md = MemoryDesc.from_tag((steps, batch, channels), f32, seq_tag)
    dst_md = MemoryDesc.from_tag((steps, batch, directions * h), f32, seq_tag)
    state_md = MemoryDesc.from_tag((1, directions, batch, h), f32, FormatTag.abcd)
    # Weights the primitive lays out itself pick its brgemm kernels, plain ldigo weights its
    # GEMM-driven one ("ref", which calls the jit GEMM per step). Measured on 2 threads, AVX2,
    # 40 steps, against the island: LSTM brgemm 0.97-1.40x (slower) at 32-64 hidden channels
    # where the GEMM-driven one is 0.66-0.87x (two runs); both 0.55-0.60x at 128; brgemm
    # 0.74x against 0.81x at 512.
    tag = FormatTag.any if h >= _PACKED_FROM else FormatTag.abcde
    def make() -> PrimitiveDesc:
        return rnn(layer.cell, _DIRECTIONS[layer.direction], src_md,
                   MemoryDesc.from_tag((1, directions, channels, onnx_gates, h), f32, tag),
                   MemoryDesc.from_tag((1, directions, h, onnx_gates, h), f32, tag), dst_md,
                   src_iter=state_md, src_iter_c=state_md if lstm else None,
                   bias=MemoryDesc.from_tag((1, directions, gates, h), f32, FormatTag.abcd),
                   dst_iter=state_md, dst_iter_c=state_md if lstm else None,
                   weights_peephole=MemoryDesc.from_tag((1, directions, 3, h), f32,
                                                        FormatTag.abcd)
                   if 7 in layer.consts else None,
                   activation=layer.activation)

    pd = make()
    threads = None
    if (pd.impl_name.startswith("ref") and h <= ONE_THREAD_HIDDEN
            and (ctx.options.threads or get_num_threads()) > 1):
        threads = 1
        with team(threads):  # made for the one thread it runs with
            pd = make()
    fixed: dict[int, Memory] = {
        int(Arg.WEIGHTS): ctx.weights(_weights(layer, layer.consts[1], onnx_gates),
                                      pd.arg_md(Arg.WEIGHTS)),
        int(Arg.WEIGHTS_1): ctx.weights(_weights(layer, layer.consts[2], onnx_gates),
                                        pd.arg_md(Arg.WEIGHTS_1)),
        int(Arg.BIAS): Memory.from_array(_bias(layer, gates, directions)),
    }
    if 7 in layer.consts:
        p = np.asarray(layer.consts[7], np.float32).reshape(directions, 3, h)
        fixed[int(Arg.WEIGHTS_2)] = Memory.from_array(
            np.ascontiguousarray(p[:, list(_PEEPHOLES)])[None])
    args: dict[int, str] = {int(Arg.SRC): ctx.temp(f"{x}@tnc", src_md,
                                                   alias=ctx.source(x, plain_md(shape, f32)))}
    reads = [args[int(Arg.SRC)]]
    for index, arg in ((5, Arg.SRC_1), (6, Arg.SRC_2)):
        if index == 6 and not lstm:
            continue
        if index in layer.inputs:
            value = layer.inputs[index]
            viewed = ctx.source(value, _state_md(layer, directions, batch, h))
            args[int(arg)] = ctx.temp(f"{value}@ldnc", state_md, alias=viewed)
            reads.append(args[int(arg)])
        else:
            fixed[int(arg)] = Memory.from_array(_state(layer, index, directions, batch, h))
    writes: list[str] = []
    outputs = ((0, Arg.DST, _y_md(layer, steps, directions, batch, h), dst_md),
               (1, Arg.DST_1, _state_md(layer, directions, batch, h), state_md),
               (2, Arg.DST_2, _state_md(layer, directions, batch, h), state_md))
    for index, arg, onnx_md, dnnl_md in outputs:
        if index == 2 and not lstm:
            continue
        # the slot oneDNN writes; the ONNX output (if the model reads it: oneDNN writes
        # Y_h and Y_c together, and always Y) is a view of its bytes
        args[int(arg)] = ctx.temp(f"{node.name}:{Arg(arg).name.lower()}", dnnl_md)
        writes.append(args[int(arg)])
        if (value := layer.outputs.get(index)) is not None:
            ctx.define(value, onnx_md, alias=args[int(arg)])
    note = (f"{layer.op} as oneDNN's RNN primitive ({layer.cell.name}, {layer.direction}, "
            f"T={steps}, N={batch}, {channels} -> {h} channels)")
    if pd.impl_name.startswith("ref"):
        note += "; oneDNN's GEMM-driven RNN implementation (its name is 'ref')"
    if threads is not None:
        note += (f"; on one thread: its steps' GEMMs ({h} hidden channels) are too small to "
                 "share")
    ctx.add_primitive(node.name, pd, args, fixed, info=ctx.info_for(node, note=note),
                      reads=reads, writes=writes, threads=threads)


def _state_md(layer: _Layer, directions: int, batch: int, h: int) -> MemoryDesc:
    """An ONNX state ([D, N, H], layout 1 [N, D, H]) over oneDNN's {1, D, N, H} bytes."""
    if not layer.layout:
        return plain_md((directions, batch, h), DataType.f32)
    return _strided((batch, directions, h), (h, batch * h, 1))


def _y_md(layer: _Layer, steps: int, directions: int, batch: int, h: int) -> MemoryDesc:
    """ONNX's Y over oneDNN's dst_layer bytes: [T, D, N, H] over {T, N, D·H}, or (layout 1)
    [N, T, D, H] over ntc, which is row-major."""
    if layer.layout:
        return plain_md((batch, steps, directions, h), DataType.f32)
    return _strided((steps, directions, batch, h), (batch * directions * h, h, directions * h, 1))


def _strided(dims: tuple[int, ...], strides: tuple[int, ...]) -> MemoryDesc:
    """A view's descriptor, row-major when its bytes are (a size-1 dim's stride can be
    anything). Measured: oneDNN 3.2's jit binary, reading ``[8, 2, 1, 8]`` with strides
    ``(16, 8, 16, 1)`` (the same bytes as row-major) into a row-major dst, computes wrong
    values (docs/onednn.md); the quantize after an LSTM of batch 1 did."""
    md = MemoryDesc.from_strides(dims, DataType.f32, strides)
    return plain_md(dims, DataType.f32) if is_row_major(md) else md


def _state(layer: _Layer, index: int, directions: int, batch: int, h: int) -> np.ndarray:
    """A constant initial state (zeros when absent) as oneDNN's {1, D, N, H}."""
    data = layer.consts.get(index)
    if data is None:
        return np.zeros((1, directions, batch, h), np.float32)
    data = np.asarray(data, np.float32)
    if layer.layout:
        data = data.transpose(1, 0, 2)
    return np.array(np.broadcast_to(data, (directions, batch, h)), order="C")[None]
