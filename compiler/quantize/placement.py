"""Where the quantizers go: placement that follows what the compiler fuses.

qfuse runs these int8 (docs/how-it-works.md; passes/post_op_match.py, fusion_report.py):

- compute ops Conv / ConvTranspose / MatMul / Gemm read int8 activations and absorb what
  follows them (bias, BatchNorm, activations, a residual Add as a ``sum`` post-op, the output
  quantization) into one kernel;
- pools (AveragePool, GlobalAveragePool) and Concat read and write int8; data movement
  (Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Split, Slice, Pad, MaxPool, nearest
  Resize, Identity) moves int8 values unchanged, at its input's scale.

So a quantizer is requested on the activation inputs of the compute ops (and of
LayerNormalization, which the compiler runs on int8 input: passes/fuse_quantized_norm.py), and
resolved upwards: through data movement to the tensor that produced the value (data movement
keeps the scale); at a pool's output (its own range) with a request on the pool's input; at a
Concat's output, with requests on its inputs, all in one *scale group* (one scale and zero
point: the concat then only copies bytes); anywhere else at the tensor itself. When that
tensor ends a chain of single-reader elementwise ops over a residual Add (``relu(a + b)``),
every Add input but one is requested too: the compiler fuses the Add as a ``sum`` post-op into
the kernel of the branch left out (the last produced input made by a compute op whose only
reader is the Add), and the sum reads the other input as int8. A requested tensor is
therefore the *output* of an activation / BatchNorm / bias chain, never between a conv and
what it absorbs; activation ranges are narrowed by what the chain ends in (a ReLU's output
starts at 0: DNNLOWP's ``followed_by``).

An ``x + f(x)`` (an Add of a value and something computed from it: PP-OCRv4 det's RSE
layers, ``x + x·gate(mean(x))``) stays float32: the compiler runs the sum as post-ops of f's
kernel reading x again in float32, so a quantizer on x would cost a dequantize kernel of its
own; x is not requested for the pool nor for the Add, and the pool's mean and the gate's
convolutions stay float32 too (as NNCF leaves a squeeze-excitation). The sum's output is
requested as any compute input. PP-OCRv4 det: 107 → 99 kernels (NNCF's model: 99), min
cosine 0.8345 → 0.8333 on 40 held-out pictures.

A tensor whose readers are all depthwise convolutions (Conv with ``group`` = input channels =
output channels, one input channel per group) gets one scale per channel (axis 1) and one zero
point, when weights are per channel: as NNCF's CPU configuration quantizes depthwise inputs
per channel (its hardware config allows per-channel activations for DepthwiseConvolution). A
depthwise conv's channel c reads only input channel c, so the compiler folds the input's
channel scale into the weight scale of channel c, and the producer writes the channels with a
per-channel output scale (a post-op), in the same kernels as per tensor; the zero point stays
common because oneDNN's convolution takes one source zero point (mask 0). The tensor must be
alone in its scale group, made by a node (not a graph input) and read directly by the convs.

Weights (initializers of compute ops): s8 symmetric, per output channel (Conv and Gemm with
transB: axis 0; ConvTranspose with group 1 and Gemm without transB: axis 1; MatMul: the last
axis) unless per tensor is asked for (and for grouped ConvTranspose, whose output channels
are not one axis of the weights). Biases stay float (the compiler quantizes them). Nodes
named in ``exclude`` stay float: their inputs are not requested, nothing is pushed through
them, and they read float values (writer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

COMPUTE = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
POOLS = frozenset({"AveragePool", "GlobalAveragePool"})
NORMS = frozenset({"LayerNormalization"})
DATA_MOVEMENT = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Split",
                           "Slice", "Pad", "MaxPool", "Identity", "Resize"})


@dataclass
class Placement:
    """``activations``: tensor → scale-group id (tensors sharing an id share one scale);
    ``weights``: initializer → quantization axis (None: per tensor); ``channel_axis``:
    activation tensor → the axis of its per-channel scales (depthwise inputs; module
    docstring), absent for per-tensor activations."""

    activations: dict[str, int] = field(default_factory=dict)
    weights: dict[str, int | None] = field(default_factory=dict)
    channel_axis: dict[str, int] = field(default_factory=dict)

    def groups(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for tensor, gid in self.activations.items():
            out.setdefault(gid, []).append(tensor)
        return out


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.inits = {t.name: t for t in g.initializer}
        self.consts = set(self.inits)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.order: dict[str, int] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for i, node in enumerate(g.node):
            if node.op_type == "Constant":
                self.consts.update(node.output)
            for o in node.output:
                self.producer[o] = node
                self.order[o] = i
            for v in node.input:
                if v:
                    self.readers.setdefault(v, []).append(node)
        self.outputs = {o.name for o in g.output}

    def activation(self, name: str) -> bool:
        return bool(name) and name not in self.consts

    def attr(self, node: onnx.NodeProto, name: str, default: object) -> object:
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


def _moves_data(g: _Graph, node: onnx.NodeProto) -> bool:
    if node.op_type not in DATA_MOVEMENT:
        return False
    if node.op_type == "Resize":
        mode = g.attr(node, "mode", b"nearest")
        return (mode.decode() if isinstance(mode, bytes) else str(mode)) == "nearest"
    return True


def _is_residual_add(g: _Graph, node: onnx.NodeProto) -> bool:
    return node.op_type in ("Add", "Sum") and len(node.input) >= 2 and all(
        g.activation(v) for v in node.input)


def _fused_branch(g: _Graph, add: onnx.NodeProto, exclude: set[str]) -> str | None:
    """The Add input the compiler absorbs as the sum's branch: made by a compute op (through
    BatchNorm / bias Add / activations with one reader each), read only by this Add; the
    last produced such input."""
    candidates = []
    for v in add.input:
        t = v
        while True:
            if len(g.readers.get(t, [])) != 1 or t in g.outputs:
                break
            p = g.producer.get(t)
            if p is None or p.name in exclude:
                break
            if p.op_type in COMPUTE:
                candidates.append(v)
                break
            if p.op_type not in POST_OPS or sum(g.activation(i) for i in p.input) != 1:
                break
            t = next(i for i in p.input if g.activation(i))
    if not candidates:
        return None
    return max(candidates, key=lambda v: g.order.get(v, -1))


POST_OPS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish",
                      "Gelu", "Tanh", "Elu", "Add", "Mul", "Sub", "Div", "BatchNormalization"})


def _residual_add_in_chain(g: _Graph, t: str, exclude: set[str]) -> onnx.NodeProto | None:
    """The residual Add that value ``t`` ends the post-op chain of (``t`` = act(Add(a, b))
    through single-reader elementwise ops), or None."""
    p = g.producer.get(t)
    while p is not None and p.name not in exclude:
        if _is_residual_add(g, p):
            return p
        if p.op_type not in POST_OPS or sum(g.activation(i) for i in p.input) != 1:
            return None
        src = next(i for i in p.input if g.activation(i))
        if len(g.readers.get(src, [])) != 1 or src in g.outputs:
            return None
        p = g.producer.get(src)
    return None


def _self_residual(g: _Graph, add: onnx.NodeProto) -> bool:
    """An Add of a value and something computed from it, ``x + f(x)`` (PP-OCRv4 det's RSE
    layers, ``x + x·gate(mean(x))``): the compiler runs it in float32 as the post-ops of f's
    kernel reading x again, so x needs no quantizer (one would be a dequantize kernel of its
    own, since the gate chain reads x in float32), nor does f(x)."""
    if not _is_residual_add(g, add) or len(add.input) != 2:
        return False
    a, b = add.input
    return any(p is not None and other in p.input
               for p, other in ((g.producer.get(b), a), (g.producer.get(a), b)))


def _feeds_self_residual(g: _Graph, t: str) -> bool:
    """Is ``t`` the x of an ``x + f(x)`` (``_self_residual``)?"""
    return any(_self_residual(g, r) and t in r.input for r in g.readers.get(t, []))


def _pools_float(g: _Graph, t: str) -> bool:
    """Is ``t`` computed from the mean a pool takes of the x of an ``x + f(x)`` (through
    convolutions and single-input elementwise ops: the squeeze-excitation gate)? x stays
    float32, so the pool runs in float32 and the gate's convolutions on its output too (as
    NNCF leaves them): a quantizer there would be a kernel of its own."""
    for _ in range(16):  # a squeeze-excitation branch is a few ops long
        p = g.producer.get(t)
        if p is None:
            return False
        if p.op_type in POOLS:
            return _feeds_self_residual(g, p.input[0])
        sources = [i for i in p.input if g.activation(i)]
        if len(sources) != 1 or (p.op_type not in COMPUTE and p.op_type not in POST_OPS):
            return False
        t = sources[0]
    return False


def _is_depthwise(g: _Graph, node: onnx.NodeProto) -> bool:
    """A Conv with one input and one output channel per group (weights [C, 1, ...], group
    C)."""
    if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in g.inits:
        return False
    dims = g.inits[node.input[1]].dims
    group = g.attr(node, "group", 1)
    return len(dims) >= 3 and dims[1] == 1 and group > 1 and group == dims[0]


def _depthwise_inputs(g: _Graph, activations: dict[str, int],
                      exclude: set[str]) -> dict[str, int]:
    """Placed tensors quantized per channel: read only by depthwise convs (module docstring)."""
    size: dict[int, int] = {}
    for gid in activations.values():
        size[gid] = size.get(gid, 0) + 1
    out = {}
    for t, gid in activations.items():
        readers = g.readers.get(t, [])
        if (size[gid] == 1 and t in g.producer and t not in g.outputs and readers
                and all(_is_depthwise(g, n) and n.name not in exclude and n.input[0] == t
                        for n in readers)):
            out[t] = 1
    return out


def _weight_axis(g: _Graph, node: onnx.NodeProto, per_channel: bool) -> int | None:
    """The output-channel axis of the node's weights (input 1), None for per tensor."""
    if not per_channel:
        return None
    if node.op_type == "Conv":
        return 0
    if node.op_type == "ConvTranspose":
        return 1 if g.attr(node, "group", 1) == 1 else None
    if node.op_type == "Gemm":
        return 0 if g.attr(node, "transB", 0) else 1
    return len(g.inits[node.input[1]].dims) - 1  # MatMul [..., K, N]: N


def place(model: onnx.ModelProto, *, per_channel: bool = True,
          exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
    """The Placement of quantizers in ``model`` (module docstring)."""
    g = _Graph(model)
    exclude = set(exclude)
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        while parent.get(t, t) != t:
            t = parent[t]
        return t

    def union(a: str, b: str) -> None:
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    placed: set[str] = set()
    resolved: dict[str, str] = {}

    def request(t: str) -> str:
        """Place (or find) the quantizer serving value ``t``; returns the quantized tensor."""
        if t in resolved:
            return resolved[t]
        resolved[t] = t  # cycles cannot occur in a DAG; this guards re-entry
        p = g.producer.get(t)
        if p is not None and p.name not in exclude:
            if _moves_data(g, p) and g.activation(p.input[0]):  # input 0: the data
                resolved[t] = request(p.input[0])
                return resolved[t]
            if p.op_type in POOLS:
                if not _feeds_self_residual(g, p.input[0]):
                    request(p.input[0])
            elif p.op_type == "Concat":
                parent.setdefault(t, t)
                for v in p.input:
                    if g.activation(v):
                        union(t, request(v))
            else:
                add = _residual_add_in_chain(g, t, exclude)
                if add is not None and not _self_residual(g, add):
                    branch = _fused_branch(g, add, exclude)
                    for v in add.input:
                        if v != branch:
                            request(v)
        placed.add(t)
        parent.setdefault(t, t)
        return t

    weights: dict[str, int | None] = {}
    for node in model.graph.node:
        if node.name in exclude:
            continue
        if node.op_type in NORMS and g.activation(node.input[0]):
            request(node.input[0])
        if node.op_type not in COMPUTE:
            continue
        for i, v in enumerate(node.input[:2]):
            if g.activation(v):
                if not _pools_float(g, v):
                    request(v)
            elif i == 1 and v in g.inits and len(g.inits[v].dims) >= 2:
                axis = _weight_axis(g, node, per_channel)
                if weights.get(v, axis) != axis:  # shared by readers with other axes
                    axis = None
                weights[v] = axis
    roots: dict[str, int] = {}
    activations = {}
    for t in sorted(placed, key=lambda v: g.order.get(v, -1)):
        activations[t] = roots.setdefault(find(t), len(roots))
    channels = _depthwise_inputs(g, activations, exclude) if per_channel else {}
    return Placement(activations, weights, channels)
