"""A small helper for writing ONNX graphs by hand, one readable line per layer.

`GraphBuilder` keeps the node list, the initializers and the static shape of every tensor it
creates, so a model reads like its PyTorch definition::

    b = GraphBuilder("tiny", opset=17, seed=0)
    x = b.input("input", (1, 3, 32, 32))
    with b.scope("stem"):
        x = b.conv_bn_act(x, 16, 3, act="relu")
    x = b.flatten(b.global_avgpool(x))
    b.output(b.gemm(x, 10), "logits")
    model = b.build()

Weights are deterministic functions of the builder's seed and the order in which layers are
added. They follow He initialisation (std = sqrt(2 / fan_in)), which keeps the second moment of
activations roughly constant through Conv+ReLU stacks, so a deep random network still produces
activations in a sane range (no overflow, no collapse to zero) — what a quantizer needs to
produce meaningful scales. BatchNormalization gets non-trivial statistics (gamma, beta, mean and
variance all away from 1/0) so that a compiler's BN folding is actually exercised.

Tensor names equal the name of the node that produces them (PyTorch-export style
``/layer1/0/conv1/Conv``); node names are unique.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = tuple[int, ...]


class GraphBuilder:
    """Accumulates nodes, initializers and shapes; `build()` returns a checked ModelProto."""

    def __init__(self, name: str, *, opset: int = 17, seed: int = 0) -> None:
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, Shape] = {}
        self._scopes: list[str] = []
        self._used_names: set[str] = set()

    # ---------------------------------------------------------------- naming and plumbing

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names of nodes created inside the block with ``/name``."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def _unique(self, base: str) -> str:
        name, i = base, 1
        while name in self._used_names:
            name = f"{base}_{i}"
            i += 1
        self._used_names.add(name)
        return name

    def _node_name(self, op: str) -> str:
        return self._unique("/" + "/".join([*self._scopes, op]))

    def shape(self, x: str) -> Shape:
        return self.shapes[x]

    def input(self, name: str, shape: Sequence[int]) -> str:
        self._used_names.add(name)
        self.shapes[name] = tuple(shape)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, x: str, name: str | None = None) -> str:
        """Declare `x` a graph output, renaming the tensor to `name` when given."""
        if name is not None and name != x:
            self._rename(x, name)
            x = name
        self.outputs.append(
            helper.make_tensor_value_info(x, TensorProto.FLOAT, list(self.shapes[x]))
        )
        return x

    def _rename(self, old: str, new: str) -> None:
        assert new not in self.shapes, f"tensor name {new!r} already used"
        for node in self.nodes:
            for seq in (node.input, node.output):
                for i, t in enumerate(seq):
                    if t == old:
                        seq[i] = new
        self.shapes[new] = self.shapes.pop(old)
        self._used_names.add(new)

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        shape: Shape | Sequence[Shape],
        *,
        n_out: int = 1,
        name: str | None = None,
        **attrs: object,
    ) -> str:
        """Add one node; returns its output name (for n_out > 1 use `node_multi`)."""
        outs = self.node_multi(op, inputs, [shape] if n_out == 1 else shape, name=name, **attrs)
        return outs[0]

    def node_multi(
        self,
        op: str,
        inputs: Sequence[str],
        shapes: Sequence[Shape],
        *,
        name: str | None = None,
        **attrs: object,
    ) -> list[str]:
        node_name = self._node_name(name or op)
        outs = (
            [node_name]
            if len(shapes) == 1
            else [f"{node_name}_output_{i}" for i in range(len(shapes))]
        )
        for o, s in zip(outs, shapes, strict=True):
            self.shapes[o] = tuple(int(d) for d in s)
            self._used_names.add(o)
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=node_name, **attrs))
        return outs

    def const(self, value: np.ndarray, name: str) -> str:
        """Add an initializer; `name` is made unique and scoped."""
        full = self._unique("/".join(["", *self._scopes, name]).lstrip("/") or name)
        arr = np.asarray(value)
        self.initializers.append(numpy_helper.from_array(arr, full))
        self.shapes[full] = tuple(arr.shape)
        return full

    # ---------------------------------------------------------------- random parameters

    def he_normal(self, shape: Sequence[int], fan_in: int, gain: float = 2.0) -> np.ndarray:
        std = math.sqrt(gain / fan_in)
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def small_bias(self, n: int, scale: float = 0.1) -> np.ndarray:
        return self.rng.uniform(-scale, scale, n).astype(np.float32)

    # ---------------------------------------------------------------- convolution family

    def conv(
        self,
        x: str,
        cout: int,
        k: int,
        *,
        stride: int = 1,
        pad: int | None = None,
        group: int = 1,
        dilation: int = 1,
        bias: bool = True,
        gain: float = 2.0,
        name: str = "Conv",
    ) -> str:
        n, cin, h, w = self.shapes[x]
        assert cin % group == 0 and cout % group == 0, (cin, cout, group)
        pad = dilation * (k - 1) // 2 if pad is None else pad
        fan_in = cin // group * k * k
        wt = self.const(self.he_normal((cout, cin // group, k, k), fan_in, gain), f"{name}.weight")
        ins = [x, wt]
        if bias:
            ins.append(self.const(self.small_bias(cout), f"{name}.bias"))
        ho = (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1
        wo = (w + 2 * pad - dilation * (k - 1) - 1) // stride + 1
        return self.node(
            "Conv",
            ins,
            (n, cout, ho, wo),
            name=name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[dilation, dilation],
            group=group,
        )

    def conv_transpose(
        self,
        x: str,
        cout: int,
        k: int,
        *,
        stride: int = 2,
        pad: int = 0,
        output_padding: int = 0,
        bias: bool = True,
        name: str = "ConvTranspose",
    ) -> str:
        n, cin, h, w = self.shapes[x]
        # ONNX ConvTranspose weight layout is [C_in, C_out / group, kH, kW]. Each output pixel of
        # a stride-s, kernel-s deconvolution sees cin inputs, hence fan_in = cin * (k/s)^2.
        fan_in = max(1, cin * (k // stride) ** 2)
        wt = self.const(self.he_normal((cin, cout, k, k), fan_in), f"{name}.weight")
        ins = [x, wt]
        if bias:
            ins.append(self.const(self.small_bias(cout), f"{name}.bias"))
        ho = (h - 1) * stride - 2 * pad + k + output_padding
        wo = (w - 1) * stride - 2 * pad + k + output_padding
        attrs: dict[str, object] = {}
        if output_padding:
            attrs["output_padding"] = [output_padding] * 2
        return self.node(
            "ConvTranspose",
            ins,
            (n, cout, ho, wo),
            name=name,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            **attrs,
        )

    def batchnorm(
        self, x: str, *, gamma: tuple[float, float] = (0.5, 1.5), name: str = "BatchNormalization"
    ) -> str:
        """Inference BatchNorm with non-trivial statistics (so folding it changes the weights)."""
        c = self.shapes[x][1]
        r = self.rng
        scale = self.const(r.uniform(*gamma, c).astype(np.float32), f"{name}.weight")
        beta = self.const(r.uniform(-0.2, 0.2, c).astype(np.float32), f"{name}.bias")
        mean = self.const(r.uniform(-0.3, 0.3, c).astype(np.float32), f"{name}.running_mean")
        var = self.const(r.uniform(0.5, 2.0, c).astype(np.float32), f"{name}.running_var")
        return self.node(
            "BatchNormalization",
            [x, scale, beta, mean, var],
            self.shapes[x],
            name=name,
            epsilon=1e-5,
        )

    def conv_bn_act(
        self,
        x: str,
        cout: int,
        k: int,
        *,
        stride: int = 1,
        group: int = 1,
        act: str | None = "relu",
        gamma: tuple[float, float] = (0.5, 1.5),
        name: str = "",
    ) -> str:
        """PyTorch's Conv2d(bias=False) -> BatchNorm2d -> activation ("relu", "relu6" or None).

        Without an activation the weights use gain 1 instead of He's 2 (no ReLU halves the
        second moment), so linear bottlenecks and depthwise-only layers do not grow activations.
        """
        with self.scope(name) if name else contextlib.nullcontext():
            gain = 2.0 if act else 1.0
            y = self.conv(x, cout, k, stride=stride, group=group, bias=False, gain=gain)
            y = self.batchnorm(y, gamma=gamma)
            return self.activation(y, act)

    def activation(self, x: str, act: str | None) -> str:
        if act is None:
            return x
        if act == "relu":
            return self.relu(x)
        if act == "relu6":
            return self.clip(x, 0.0, 6.0)
        raise ValueError(f"unknown activation {act!r}")

    # ---------------------------------------------------------------- elementwise

    def relu(self, x: str) -> str:
        return self.node("Relu", [x], self.shapes[x])

    def clip(self, x: str, lo: float, hi: float) -> str:
        lo_t = self.const(np.array(lo, np.float32), "clip_min")
        hi_t = self.const(np.array(hi, np.float32), "clip_max")
        return self.node("Clip", [x, lo_t, hi_t], self.shapes[x])

    def _binary(self, op: str, a: str, b: str | float | np.ndarray) -> str:
        if not isinstance(b, str):
            b = self.const(np.asarray(b, np.float32), f"{op.lower()}_const")
        shape = np.broadcast_shapes(self.shapes[a], self.shapes[b])
        return self.node(op, [a, b], shape)

    def add(self, a: str, b: str | float | np.ndarray) -> str:
        return self._binary("Add", a, b)

    def mul(self, a: str, b: str | float | np.ndarray) -> str:
        return self._binary("Mul", a, b)

    def div(self, a: str, b: str | float | np.ndarray) -> str:
        return self._binary("Div", a, b)

    def pow(self, a: str, b: str | float | np.ndarray) -> str:
        return self._binary("Pow", a, b)

    def unary(self, op: str, x: str, **attrs: object) -> str:
        """Any shape-preserving single-input op (Erf, Tanh, Sigmoid, Gelu, ...)."""
        return self.node(op, [x], self.shapes[x], **attrs)

    # ---------------------------------------------------------------- shape ops

    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        shapes = [self.shapes[x] for x in xs]
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        return self.node("Concat", list(xs), tuple(out), axis=axis)

    def split(self, x: str, sizes: Sequence[int], axis: int = 1) -> list[str]:
        assert self.opset >= 13, "split sizes as an input need opset 13"
        shape = self.shapes[x]
        assert sum(sizes) == shape[axis]
        split = self.const(np.array(sizes, np.int64), "split")
        outs = []
        for s in sizes:
            o = list(shape)
            o[axis] = s
            outs.append(tuple(o))
        return self.node_multi("Split", [x, split], outs, axis=axis)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        assert math.prod(shape) == math.prod(self.shapes[x]), (shape, self.shapes[x])
        s = self.const(np.array(shape, np.int64), "shape")
        return self.node("Reshape", [x, s], tuple(shape))

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        shape = self.shapes[x]
        return self.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))

    def flatten(self, x: str, axis: int = 1) -> str:
        s = self.shapes[x]
        return self.node("Flatten", [x], (math.prod(s[:axis]), math.prod(s[axis:])), axis=axis)

    def channel_shuffle(self, x: str, groups: int) -> str:
        """torchvision's channel_shuffle: view(n,g,c/g,h,w) -> transpose(1,2) -> view(n,c,h,w)."""
        n, c, h, w = self.shapes[x]
        with self.scope("shuffle"):
            y = self.reshape(x, (n, groups, c // groups, h, w))
            y = self.transpose(y, (0, 2, 1, 3, 4))
            return self.reshape(y, (n, c, h, w))

    # ---------------------------------------------------------------- pooling and resize

    def _pool(
        self, op: str, x: str, k: int, stride: int, pad: int, ceil: bool, **attrs: object
    ) -> str:
        n, c, h, w = self.shapes[x]
        rnd = math.ceil if ceil else math.floor
        ho = rnd((h + 2 * pad - k) / stride) + 1
        wo = rnd((w + 2 * pad - k) / stride) + 1
        if ceil:
            attrs["ceil_mode"] = 1
        return self.node(
            op,
            [x],
            (n, c, ho, wo),
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            **attrs,
        )

    def maxpool(
        self, x: str, k: int = 2, stride: int | None = None, pad: int = 0, ceil: bool = False
    ) -> str:
        return self._pool("MaxPool", x, k, stride or k, pad, ceil)

    def avgpool(
        self,
        x: str,
        k: int = 2,
        stride: int | None = None,
        pad: int = 0,
        *,
        count_include_pad: bool = False,
        ceil: bool = False,
    ) -> str:
        return self._pool(
            "AveragePool", x, k, stride or k, pad, ceil, count_include_pad=int(count_include_pad)
        )

    def global_avgpool(self, x: str) -> str:
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], (n, c, 1, 1))

    def resize(self, x: str, scale: int, mode: str = "nearest") -> str:
        """Upsample H and W by an integer factor, with the attributes PyTorch exports.

        nearest: coordinate_transformation_mode=asymmetric, nearest_mode=floor (nn.Upsample);
        linear: half_pixel (bilinear, align_corners=False).
        """
        n, c, h, w = self.shapes[x]
        scales = self.const(np.array([1, 1, scale, scale], np.float32), "scales")
        attrs: dict[str, object] = {"mode": mode}
        if mode == "nearest":
            attrs |= {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        else:
            attrs |= {"coordinate_transformation_mode": "half_pixel"}
        return self.node("Resize", [x, "", scales], (n, c, h * scale, w * scale), **attrs)

    # ---------------------------------------------------------------- dense layers

    def gemm(
        self, x: str, n_out: int, *, gain: float = 2.0, bias: bool = True, name: str = "Gemm"
    ) -> str:
        """nn.Linear as PyTorch exports it: Gemm(x, W[n_out, n_in], b, transB=1)."""
        m, k = self.shapes[x]
        wt = self.const(self.he_normal((n_out, k), k, gain), f"{name}.weight")
        ins = [x, wt]
        if bias:
            ins.append(self.const(self.small_bias(n_out), f"{name}.bias"))
        return self.node("Gemm", ins, (m, n_out), name=name, alpha=1.0, beta=1.0, transB=1)

    def matmul(self, a: str, b: str) -> str:
        sa, sb = self.shapes[a], self.shapes[b]
        assert sa[-1] == sb[-2], (sa, sb)
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.node("MatMul", [a, b], (*batch, sa[-2], sb[-1]))

    def linear(self, x: str, n_out: int, *, gain: float = 1.0, name: str = "linear") -> str:
        """nn.Linear on a 3-D tensor as PyTorch exports it: MatMul(x, W^T) then Add(bias)."""
        k = self.shapes[x][-1]
        with self.scope(name):
            wt = self.const(self.he_normal((k, n_out), k, gain), "weight")
            y = self.matmul(x, wt)
            return self.add(y, self.const(self.small_bias(n_out), "bias"))

    def layernorm(self, x: str, *, axis: int = -1, name: str = "LayerNormalization") -> str:
        assert self.opset >= 17, "LayerNormalization needs opset 17"
        c = self.shapes[x][axis]
        g = self.const(self.rng.uniform(0.8, 1.2, c).astype(np.float32), f"{name}.weight")
        b = self.const(self.small_bias(c), f"{name}.bias")
        return self.node(
            "LayerNormalization", [x, g, b], self.shapes[x], name=name, axis=axis, epsilon=1e-5
        )

    def softmax(self, x: str, axis: int = -1) -> str:
        return self.node("Softmax", [x], self.shapes[x], axis=axis)

    # ---------------------------------------------------------------- result

    def build(self, *, doc: str = "", check: bool = True) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            self.outputs,
            initializer=self.initializers,
        )
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(
            graph,
            opset_imports=opsets,
            producer_name="qfuse.examples.zoo",
            ir_version=helper.find_min_ir_version_for(opsets),
        )
        model.doc_string = doc
        if check:
            onnx.checker.check_model(model, full_check=True)
        return model
