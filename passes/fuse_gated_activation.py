"""Gated activations written out as ``x · gate(x)`` become one activation node.

Exporters write SiLU and HardSwish as two branches that read the same tensor ``x``:

    Mul(x, Sigmoid(x))                                   → Swish(x)            (SiLU, YOLOv5/v8)
    Mul(x, HardSigmoid<1/6, 1/2>(x))                     → HardSwish(x)
    Mul(x, Clip(Add(x, 3), 0, 6))                        → Mul(HardSwish(x), 6)
    Mul(x, Mul(Clip(Add(x, 3), 0, 6), 1/6))              → HardSwish(x)        (MobileNetV3, PP-LCNet)
    Mul(x, DQ(Q(Add(x, 3))))  [Q's range [0, r]]        → Mul(HardSwish<1/r, 3/r>(x), r)

The last is what onnxruntime's quantize_static writes: it removes the Clip and lets the
quantizer's range [0, r] (r <= 6, from calibration) clamp instead. In general the gate is read
as g = m·clamp(x + a, lo, hi) (``_activation``) and with lo = 0 and a finite hi becomes
(m·hi)·hardswish(x; 1/hi, a/hi), which oneDNN's eltwise_hardswish computes with those alpha
and beta.

(``Div(·, 6)`` is already ``Mul(·, 1/6)``: canonicalize_arith runs first.) A conv or matmul can
absorb one activation as a oneDNN eltwise post-op (``eltwise_swish``, ``eltwise_hardswish``),
but not a Mul of two values derived from its own output: post-ops transform one value in
sequence. Written as one node, the whole pattern joins the producer's post-op chain
(passes/fuse_post_ops.py), and its inner quantizations before and after are kept there.

Identities (real arithmetic): x·sigmoid(x) = swish(x); x·hardsigmoid(x; 1/6, 1/2) = hardswish(x);
x·clip(x + 3, 0, 6) = 6·hardswish(x), since clip(x + 3, 0, 6) = 6·clip(x/6 + 1/2, 0, 1).

What the rewrite may drop — only with the composer option ``drop_gate_quantize``, off by
default: a quantizer on the gate branch (ONNX Runtime's quantize_static puts a
QuantizeLinear → DequantizeLinear after the Sigmoid or the Clip). The gate g(x) is then used
unquantized: with the gate's step s_g, the product moves by at most |x|·s_g/2 — for a sigmoid
gate quantized to u8 over [0, 1] that is |x|/510, under half a step of the product's own
quantization whenever that covers [min x, max x] — so the quantized result moves by at most
one step, at elements near a rounding tie (tests/passes/test_fuse_gated_activation.py measures
it on random data). Per layer that is small, but it compounds: on PP-LCNet quantized by
quantize_static (15 HardSwish layers) the orientation classifier's worst held-out input fell
from cosine 0.9976 to 0.939 against exact QDQ, so it is not the default. OpenVINO's CPU
plugin fuses these activations the same way. Gates with no
quantizer are rewritten exactly up to the activation's own float32 rounding. The dropped
quantizers are listed on the new node (``meta["dropped_quantize"]``) and by ``qfuse inspect``.

Preconditions, each declined with its reason: every node on the gate branch has a single
reader (so the branch can go); constants are scalars (quantize_static stores them as u8
initializers behind a DequantizeLinear, read here as ``(q - zp)·s``); the affine-clamp gate
reduces to lo = 0 and a finite hi; a quantizer after a sigmoid does not bind where x can be
(its range covers sigmoid over x's own dequantize range to within one step — see
``_activation``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import ClipAttrs, HardSigmoidAttrs, HardSwishAttrs, NoAttrs
from qfuse.passes.base import PassContext
from qfuse.passes.canonicalize_arith import constant_value
from qfuse.passes.quant_utils import dq_params, fq_ranges, quantize_only, readers, rebuild

log = logging.getLogger(__name__)
F32 = np.float32


@dataclass
class _Gate:
    """The gate branch from ``x`` to the Mul's other input: its nodes (read backwards), the
    steps x → gate in order, and the quantizers on it."""

    steps: list[tuple[str, float, float]] = field(default_factory=list)  # (kind, a, b)
    nodes: list[Node] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    step: float = 0.0  # the largest quantizer step on the gate


def _close(value: float, target: float) -> bool:
    return abs(value - target) <= 1e-6 * max(1.0, abs(target))


def _scalar(graph: Graph, node: Node) -> tuple[str, float] | None:
    """(the non-constant input, the scalar constant) of a binary node, else None."""
    a, b = node.inputs[:2]
    for x, c in ((a, b), (b, a)):
        value = constant_value(graph, c)
        if value is not None and constant_value(graph, x) is None and np.size(value) == 1:
            return x, float(np.asarray(value, F32).ravel()[0])
    return None


def _step_back(graph: Graph, node: Node, gate: _Gate) -> str | None:
    """Record ``node`` as a gate step; return the value it reads, or None if not a gate op."""
    if node.op is Op.SIGMOID:
        gate.steps.append(("sigmoid", 0.0, 0.0))
        return node.inputs[0]
    if node.op is Op.HARD_SIGMOID and isinstance(node.attrs, HardSigmoidAttrs):
        gate.steps.append(("hardsigmoid", node.attrs.alpha, node.attrs.beta))
        return node.inputs[0]
    if node.op is Op.RELU:
        gate.steps.append(("clamp", 0.0, math.inf))
        return node.inputs[0]
    if node.op is Op.CLIP and isinstance(node.attrs, ClipAttrs):
        gate.steps.append(("clamp", node.attrs.min, node.attrs.max))
        return node.inputs[0]
    if node.op in (Op.ADD, Op.MUL):
        found = _scalar(graph, node)
        if found is None:
            return None
        gate.steps.append(("add" if node.op is Op.ADD else "mul", found[1], 0.0))
        return found[0]
    if node.op is Op.DEQUANTIZE_LINEAR:
        fq = graph.producer(node.inputs[0])
        if quantize_only(graph, fq) is None or len(readers(graph, node.inputs[0])) != 1:
            return None
        assert fq is not None
        ranges = fq_ranges(graph, fq)
        if ranges is None or any(r.size != 1 for r in ranges):
            return None
        gate.nodes.append(fq)
        gate.dropped.append(fq.name)
        # the quantizer clamps to [il, ih] (then rounds, which the rewrite drops)
        il, ih = float(ranges[0].ravel()[0]), float(ranges[1].ravel()[0])
        gate.steps.append(("clamp", il, ih))
        gate.step = max(gate.step, (ih - il) / (fq.attrs.levels - 1))
        return fq.inputs[0]
    return None


def _gate_from(graph: Graph, x: str, g: str) -> _Gate | None:
    """The single-reader branch that computes ``g`` from ``x``, or None."""
    gate = _Gate()
    value = g
    for _ in range(10):
        node = graph.producer(value)
        if node is None or len(readers(graph, value)) != 1:
            return None
        gate.nodes.append(node)
        value = _step_back(graph, node, gate)
        if value is None:
            return None
        if value == x:
            gate.steps.reverse()
            return gate
    return None


def _bounds(graph: Graph, x: str) -> tuple[float, float]:
    """The values ``x`` can take: a per-tensor dequantize of an integer tensor reaches
    [(qmin - zp)·s, (qmax - zp)·s]; anything else is unbounded."""
    dq = graph.producer(x)
    if dq is None or dq.op is not Op.DEQUANTIZE_LINEAR:
        return -math.inf, math.inf
    params = dq_params(graph, dq)
    if params is None or not params.per_tensor:
        return -math.inf, math.inf
    lo, hi = params.dtype.range
    s, zp = float(params.scale[0]), int(params.zero_point[0])
    return (lo - zp) * s, (hi - zp) * s


def _activation(gate: _Gate, bounds: tuple[float, float]) -> tuple[Op, object, float] | str:
    """(activation op, its attrs, factor k) with x·gate(x) = k·act(x), or why not.

    Sigmoid gates: a clamp after the sigmoid (a quantizer's range) must not bind where x can
    be (``bounds``): [L, H] covers [sigmoid(x_lo), sigmoid(x_hi)] to within one gate step —
    quantize_static calibrates x's and the gate's ranges on the same data, so the gate's cap
    is sigmoid(max x) and x's own quantizer never lets x beyond max x. Affine-clamp gates are kept
    in the normal form g = m·clamp(x + a, lo, hi): ``add c`` (before any clamp) a += c/m;
    ``mul c`` (c > 0) m ·= c; ``clamp [L, H]`` lo = max(lo, L/m), hi = min(hi, H/m); a
    HardSigmoid(α, β) first is m = α, a = β/α, [0, 1/α]. With lo = 0 and a finite hi > 0:
    x·m·clamp(x + a, 0, hi) = (m·hi)·x·clamp(x/hi + a/hi, 0, 1) = (m·hi)·hardswish(x; 1/hi, a/hi).
    """
    kinds = [k for k, _, _ in gate.steps]
    if kinds and kinds[0] == "sigmoid":
        with np.errstate(over="ignore"):
            reach = [float(1 / (1 + np.exp(-np.float64(v)))) for v in bounds]
        for kind, lo, hi in gate.steps[1:]:
            if kind != "clamp":
                return f"the sigmoid's gate has a {kind} step after the sigmoid"
            if lo > reach[0] + gate.step or hi < reach[1] - gate.step:
                return (f"the sigmoid's quantizer [{lo:.6g}, {hi:.6g}] binds where x can be "
                        f"(sigmoid reaches [{reach[0]:.6g}, {reach[1]:.6g}])")
        return Op.SWISH, NoAttrs(), 1.0
    m, a, lo, hi = 1.0, 0.0, -math.inf, math.inf
    for i, (kind, c, d) in enumerate(gate.steps):
        if kind == "hardsigmoid" and i == 0 and c > 0:
            m, a, lo, hi = c, d / c, 0.0, 1.0 / c
        elif kind == "add" and lo == -math.inf and hi == math.inf:
            a += c / m
        elif kind == "mul" and c > 0:
            m *= c
        elif kind == "clamp":
            lo, hi = max(lo, c / m), min(hi, d / m)
        else:
            return f"gate step {kind} is not part of an affine clamp"
    if abs(lo) > 1e-6 or not 0 < hi < math.inf:
        return f"the gate clamps to [{lo:.6g}, {hi:.6g}] (x·clamp(x + a, 0, hi) is needed)"
    attrs = HardSwishAttrs(float(F32(1.0 / hi)), float(F32(a / hi)))
    if _close(attrs.alpha, 1 / 6) and _close(attrs.beta, 0.5):
        attrs = HardSwishAttrs()
    k = m * hi
    return Op.HARD_SWISH, attrs, 1.0 if _close(k, 1.0) else k


def run(graph: Graph, ctx: PassContext) -> int:
    count = 0
    for mul in [n for n in graph.topo_order() if n.op is Op.MUL and n.fused is None]:
        if not graph.has_node(mul.name):
            continue
        a, b = mul.inputs[:2]
        if not a or not b or graph.constant(a) is not None or graph.constant(b) is not None:
            continue
        ctx.visit(mul)
        found, why = None, None
        for x, g in ((a, b), (b, a)):
            gate = _gate_from(graph, x, g)
            if gate is None:
                continue
            act = _activation(gate, _bounds(graph, x))
            if gate.dropped and not ctx.composer.on("drop_gate_quantize"):
                act = (f"the gate is quantized ({', '.join(gate.dropped)}); fusing drops that "
                       "quantizer (<= 1 step per layer, compounding over layers): enable the "
                       "composer option drop_gate_quantize to fuse anyway")
            if isinstance(act, str):
                why = act
                continue
            found = x, gate, act
            break
        if found is None:
            if why is not None:
                ctx.decline(mul, f"x·gate(x): {why}")
            continue
        x, gate, (op, attrs, k) = found
        _rewrite(graph, mul, x, gate, op, attrs, k)
        count += 1
    if count:
        graph.remove_unused()
    return count


def _rewrite(graph: Graph, mul: Node, x: str, gate: _Gate, op: Op, attrs: object,
             k: float) -> None:
    y = mul.outputs[0]
    origin = [o for n in (*gate.nodes, mul) for o in n.origin]
    info = graph.info(x)
    made: list[Node] = []

    def build() -> None:
        if k == 1.0:
            made.append(graph.add_node(op, [x], [y], attrs, name=f"{mul.name}/{op.value}",
                                       infos=[info], origin=origin))
            return
        t = graph.unique_name(f"{y}/{op.value.lower()}")
        made.append(graph.add_node(op, [x], [t], attrs, name=f"{mul.name}/{op.value}",
                                   infos=[info], origin=origin))
        factor = graph.add_constant(graph.unique_name(f"{mul.name}/factor"), np.array(k, F32))
        graph.add_node(Op.MUL, [t, factor.name], [y], name=mul.name, infos=[info],
                       origin=[mul.name])

    rebuild(graph, [mul], build)
    made[0].meta["dropped_quantize"] = list(gate.dropped)
    log.debug("%s: x·gate(x) → %s%s; gate quantizers dropped: %s", mul, op.value,
              "" if k == 1.0 else f"·{k:g}", gate.dropped or "none")
