"""Random small QDQ models, one per seed, for the fuzzing campaign (tests/fuzz/README.md).

A model is described by a ``Spec`` — the input shape, a list of op *intents* and a quantizer
recipe — drawn from ``numpy.random.default_rng(seed)``. ``float_model(spec)`` resolves each
intent against the shape it meets (a Conv's groups become a divisor of the channels it reads,
a kernel shrinks to fit, an op that cannot apply to the current rank is skipped), so any
sub-list of ops and any smaller input shape still builds a valid model: that is what lets the
minimiser (tests/fuzz/minimize.py) drop ops and shrink shapes freely. Every random number an
op needs comes from ``default_rng((seed, key))``, the op's own stream, so dropping one op does
not change the weights of the others. 15 % of the seeds (a draw of their own stream,
``default_rng((seed, 4))``, so the other seeds keep their models) get an inference-mode
BatchNormalization inserted among their ops.

Quantizers (``Spec.quant``):

- ``ort``: onnxruntime's ``quantize_static`` in QDQ format, MinMax calibration on 4 random
  batches, with random ``per_channel``, ``activation_type`` / ``weight_type`` (QUInt8 / QInt8),
  ``reduce_range``, ``ActivationSymmetric`` / ``WeightSymmetric`` and
  ``ForceQuantizeNoInputCheck`` (quantize pools, Reshape, ... even after a float op);
- ``dynamic`` (a draw of its own stream, ``default_rng((seed, 3))``, so the other seeds keep
  their models): onnxruntime's ``quantize_dynamic`` with random ``per_channel``,
  ``weight_type`` and ``reduce_range``: DynamicQuantizeLinear → MatMulInteger / ConvInteger
  → Cast → Mul → Add, the scale and zero point computed at run time; no calibration;
- ``hand``: Q → DQ written directly on most float values (graph input and node outputs) with a
  random dtype, a scale from the calibrated range times a random factor in [0.5, 1.5] (so some
  values saturate) and a random zero point; weights stored as int8 / uint8 initializers behind
  a DequantizeLinear (per tensor or per output channel, symmetric or not), biases as int32 at
  scale ``s_x·s_w`` when the input is quantized.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8

#: share of seeds quantized by quantize_dynamic
DYNAMIC_SHARE = 0.15
#: share of seeds with a BatchNormalization inserted among their ops
BATCHNORM_SHARE = 0.15
BATCHNORM_KEY = 50  # its op key (node names, weight stream): apart from the drawn ops' 0..5
#: op kind -> weight when drawing a random intent
KINDS: dict[str, float] = {
    "Conv": 4, "ConvTranspose": 1.5, "MatMul": 1.5, "Gemm": 1.5,
    "Relu": 1.5, "Clip": 1, "LeakyRelu": 1, "Sigmoid": 0.7, "HardSwish": 0.7,
    "Add": 2, "Mul": 1, "MaxPool": 1, "AveragePool": 1.5, "GlobalAveragePool": 0.7,
    "Concat": 1, "Reshape": 0.7, "Transpose": 0.7, "Flatten": 0.5, "Resize": 1, "Softmax": 0.7,
}


@dataclass
class Spec:
    seed: int
    input_shape: list[int]
    ops: list[dict[str, Any]]
    quant: dict[str, Any]
    outputs: int = 1  # how many of the last values are graph outputs
    notes: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Spec:
        return Spec(**json.loads(text))


# --------------------------------------------------------------------------- random specs

def random_spec(seed: int) -> Spec:
    rng = np.random.default_rng(seed)
    rank = int(rng.choice([4, 2, 3], p=[0.7, 0.15, 0.15]))
    if rank == 4:
        shape = [int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(2, 11)),
                 int(rng.integers(2, 11))]
    elif rank == 3:
        shape = [int(rng.integers(1, 3)), int(rng.integers(2, 9)), int(rng.integers(2, 17))]
    else:
        shape = [int(rng.integers(1, 5)), int(rng.integers(2, 33))]
    kinds, weights = list(KINDS), np.array(list(KINDS.values()))
    ops = []
    for key in range(int(rng.integers(1, 7))):
        kind = str(rng.choice(kinds, p=weights / weights.sum()))
        ops.append({"op": kind, "key": key, **_intent(kind, rng)})
    if rng.random() < 0.5:
        quant = {"kind": "ort", "per_channel": bool(rng.random() < 0.5),
                 "activation": str(rng.choice(["u8", "s8"])),
                 "weight": str(rng.choice(["s8", "u8"], p=[0.6, 0.4])),
                 "reduce_range": bool(rng.random() < 0.3),
                 "act_sym": bool(rng.random() < 0.3), "w_sym": bool(rng.random() < 0.5),
                 "force": bool(rng.random() < 0.5)}
        if quant["activation"] == "s8":  # quantize_static refuses s8 activations, u8 weights
            quant["weight"] = "s8"
    else:
        quant = {"kind": "hand", "per_channel": bool(rng.random() < 0.5),
                 "weight": str(rng.choice(["s8", "u8"], p=[0.6, 0.4])),
                 "coverage": float(rng.choice([1.0, 0.85]))}
    outputs = 1 + int(rng.random() < 0.1)
    dynamic = np.random.default_rng((seed, 3))
    if dynamic.random() < DYNAMIC_SHARE:
        quant = {"kind": "dynamic", "per_channel": bool(dynamic.random() < 0.5),
                 "weight": str(dynamic.choice(["s8", "u8"], p=[0.7, 0.3])),
                 "reduce_range": bool(dynamic.random() < 0.3)}
    norm = np.random.default_rng((seed, 4))
    if norm.random() < BATCHNORM_SHARE:
        ops.insert(int(norm.integers(0, len(ops) + 1)),
                   {"op": "BatchNormalization", "key": BATCHNORM_KEY})
    return Spec(seed, shape, ops, quant, outputs=outputs)


def _intent(kind: str, rng: np.random.Generator) -> dict[str, Any]:
    """The op's parameters before they meet a shape (resolved by ``_Builder``)."""
    r = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    if kind == "Conv":
        k = [r(1, 3), r(1, 3)]
        return {"out": r(1, 8), "k": k, "stride": [r(1, 2), r(1, 2)],
                "dil": [r(1, 2) if rng.random() < 0.2 else 1 for _ in k],
                "pads": [r(0, 2) for _ in range(4)],
                "groups": str(rng.choice(["1", "dw", "g"], p=[0.6, 0.2, 0.2])),
                "bias": bool(rng.random() < 0.8)}
    if kind == "ConvTranspose":
        s = r(1, 3)
        return {"out": r(1, 6), "k": [r(1, 4), r(1, 4)], "stride": [s, s],
                "out_pad": [r(0, s - 1), r(0, s - 1)] if rng.random() < 0.4 else [0, 0],
                "pads": [r(0, 2) for _ in range(4)] if rng.random() < 0.5 else [0, 0, 0, 0],
                "groups": str(rng.choice(["1", "g"], p=[0.75, 0.25])),
                "bias": bool(rng.random() < 0.8)}
    if kind == "MatMul":
        return {"n": r(1, 16)}
    if kind == "Gemm":
        return {"n": r(1, 16), "trans_b": bool(rng.random() < 0.5),
                "bias": bool(rng.random() < 0.7)}
    if kind == "Clip":
        lo, hi = [(0.0, 6.0), (-1.0, 1.0), (0.0, 1.0), (-0.5, 3.0)][r(0, 3)]
        return {"min": lo, "max": hi}
    if kind == "LeakyRelu":
        return {"alpha": float(np.round(rng.uniform(0.01, 0.3), 3))}
    if kind in ("Add", "Mul"):
        return {"mode": str(rng.choice(["residual", "channel", "scalar", "full"],
                                       p=[0.5, 0.25, 0.15, 0.1]))}
    if kind in ("MaxPool", "AveragePool"):
        k = [r(1, 3), r(1, 3)]
        return {"k": k, "stride": [r(1, 2), r(1, 2)], "pads": [r(0, 2) for _ in range(4)],
                "ceil": bool(rng.random() < 0.4), "include_pad": bool(rng.random() < 0.5)}
    if kind == "Concat":
        return {"with": str(rng.choice(["earlier", "self"]))}
    if kind in ("Reshape", "Transpose"):
        return {"choice": r(0, 5)}
    if kind == "Resize":
        return {"mode": str(rng.choice(["nearest", "linear"])),
                "coord": str(rng.choice(["asymmetric", "half_pixel", "align_corners"])),
                "nearest": str(rng.choice(["floor", "round_prefer_floor"])),
                "scale": [float(rng.choice([1, 2, 3, 0.5])) for _ in range(2)]}
    if kind == "Softmax":
        return {"axis": int(rng.choice([-1, 1]))}
    return {}


# --------------------------------------------------------------------------- float model

class _Builder:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.values: list[tuple[str, list[int]]] = [("x", list(spec.input_shape))]
        self.weights: dict[str, str] = {}  # weight initializer -> op kind reading it
        self.biases: dict[str, tuple[str, str]] = {}  # bias -> (input, weight)

    @property
    def cur(self) -> tuple[str, list[int]]:
        return self.values[-1]

    def rng(self, op: dict[str, Any]) -> np.random.Generator:
        return np.random.default_rng((self.spec.seed, 1000 + op["key"]))

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op_type: str, inputs: list[str], shape: list[int], key: int,
             **attrs: Any) -> None:
        out = f"t{key}_{op_type.lower()}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{key}_{op_type}",
                                           **attrs))
        self.values.append((out, shape))

    def add(self, op: dict[str, Any]) -> None:
        getattr(self, "op_" + op["op"])(op, *self.cur)

    # ---- compute
    def op_Conv(self, op: dict, x: str, shape: list[int]) -> None:
        """A 2-D convolution of a rank-4 value; of a rank-3 one, a 1-D convolution with the
        intent's second (width) kernel, stride, dilation and pads."""
        if len(shape) not in (3, 4):
            return
        cin, spatial = shape[1], shape[2:]
        groups = {"1": 1, "dw": cin, "g": _divisor(cin)}[op["groups"]]
        out = op["out"] if op["groups"] != "dw" else cin * (1 + op["out"] % 2)
        out = max(groups, out // groups * groups)
        pads, k, d, s = list(op["pads"]), list(op["k"]), list(op["dil"]), list(op["stride"])
        if len(shape) == 3:
            pads, k, d, s = [pads[1], pads[3]], k[1:], d[1:], s[1:]
        n = len(spatial)
        dims = []
        for i, size in enumerate(spatial):
            k[i] = min(k[i], size + pads[i] + pads[i + n])
            if (k[i] - 1) * d[i] + 1 > size + pads[i] + pads[i + n]:
                d[i] = 1
            pads[i], pads[i + n] = min(pads[i], k[i] - 1), min(pads[i + n], k[i] - 1)
            dims.append((size + pads[i] + pads[i + n] - (k[i] - 1) * d[i] - 1) // s[i] + 1)
        if min(dims) < 1:
            return
        rng = self.rng(op)
        fan_in = cin // groups * math.prod(k)
        wname = self.init(f"w{op['key']}", (rng.standard_normal((out, cin // groups, *k))
                                            / math.sqrt(fan_in)).astype(np.float32))
        inputs = [x, wname]
        if op["bias"]:
            inputs.append(self.init(f"b{op['key']}",
                                    (0.2 * rng.standard_normal(out)).astype(np.float32)))
            self.biases[inputs[2]] = (x, wname)
        self.weights[wname] = "Conv"
        self.node("Conv", inputs, [shape[0], out, *dims], op["key"], kernel_shape=k,
                  strides=s, dilations=d, pads=pads, group=groups)

    def op_ConvTranspose(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) != 4:
            return
        cin = shape[1]
        groups = _divisor(cin) if op["groups"] == "g" else 1
        out_per_group = max(1, op["out"] // groups)
        k, s, op_pad = list(op["k"]), op["stride"], list(op["out_pad"])
        pads = [min(p, k[i % 2] - 1) for i, p in enumerate(op["pads"])]
        op_pad = [min(p, s[i] - 1) for i, p in enumerate(op_pad)]
        dims = [(size - 1) * s[i] - pads[i] - pads[i + 2] + k[i] + op_pad[i]
                for i, size in enumerate(shape[2:])]
        if min(dims) < 1 or dims[0] * dims[1] > 4096:
            return
        rng = self.rng(op)
        wname = self.init(f"w{op['key']}", (rng.standard_normal((cin, out_per_group, *k))
                                            / math.sqrt(cin // groups * k[0] * k[1])
                                            ).astype(np.float32))
        inputs = [x, wname]
        if op["bias"]:
            inputs.append(self.init(f"b{op['key']}", (0.2 * rng.standard_normal(
                out_per_group * groups)).astype(np.float32)))
            self.biases[inputs[2]] = (x, wname)
        self.weights[wname] = "ConvTranspose"
        self.node("ConvTranspose", inputs, [shape[0], out_per_group * groups, *dims],
                  op["key"], kernel_shape=k, strides=s, pads=pads, output_padding=op_pad,
                  group=groups)

    def op_MatMul(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) < 2:
            return
        kdim = shape[-1]
        rng = self.rng(op)
        wname = self.init(f"w{op['key']}", (rng.standard_normal((kdim, op["n"]))
                                            / math.sqrt(kdim)).astype(np.float32))
        self.weights[wname] = "MatMul"
        self.node("MatMul", [x, wname], [*shape[:-1], op["n"]], op["key"])

    def op_Gemm(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) != 2:
            return
        kdim, n = shape[1], op["n"]
        rng = self.rng(op)
        w = (rng.standard_normal((kdim, n)) / math.sqrt(kdim)).astype(np.float32)
        wname = self.init(f"w{op['key']}", w.T.copy() if op["trans_b"] else w)
        inputs = [x, wname]
        if op["bias"]:
            inputs.append(self.init(f"b{op['key']}",
                                    (0.2 * rng.standard_normal(n)).astype(np.float32)))
            self.biases[inputs[2]] = (x, wname)
        self.weights[wname] = "Gemm_t" if op["trans_b"] else "Gemm"
        self.node("Gemm", inputs, [shape[0], n], op["key"], transB=int(op["trans_b"]))

    # ---- activations
    def op_Relu(self, op: dict, x: str, shape: list[int]) -> None:
        self.node("Relu", [x], shape, op["key"])

    def op_Sigmoid(self, op: dict, x: str, shape: list[int]) -> None:
        self.node("Sigmoid", [x], shape, op["key"])

    def op_HardSwish(self, op: dict, x: str, shape: list[int]) -> None:
        self.node("HardSwish", [x], shape, op["key"])

    def op_LeakyRelu(self, op: dict, x: str, shape: list[int]) -> None:
        self.node("LeakyRelu", [x], shape, op["key"], alpha=op["alpha"])

    def op_Clip(self, op: dict, x: str, shape: list[int]) -> None:
        lo = self.init(f"lo{op['key']}", np.array(op["min"], np.float32))
        hi = self.init(f"hi{op['key']}", np.array(op["max"], np.float32))
        self.node("Clip", [x, lo, hi], shape, op["key"])

    def op_BatchNormalization(self, op: dict, x: str, shape: list[int]) -> None:
        """Inference-mode BN over dim 1 (a pre-activation one, as DenseNet's, or after a
        conv): γ of both signs, running statistics of a trained net's magnitudes."""
        rng = self.rng(op)
        c = shape[1]
        gamma = rng.uniform(0.5, 1.5, c) * rng.choice([-1, 1], c, p=[0.15, 0.85])
        params = [self.init(f"{name}{op['key']}", np.asarray(v, np.float32)) for name, v in (
            ("gamma", gamma), ("beta", 0.3 * rng.standard_normal(c)),
            ("mean", 0.3 * rng.standard_normal(c)), ("var", rng.uniform(0.3, 2.0, c)))]
        self.node("BatchNormalization", [x, *params], shape, op["key"], epsilon=1e-5)

    # ---- binary
    def _binary(self, kind: str, op: dict, x: str, shape: list[int]) -> None:
        mode = op["mode"]
        if mode == "residual":
            same = [n for n, s in self.values[:-1] if s == shape]
            if same:
                self.node(kind, [x, same[-1]], shape, op["key"])
                return
            mode = "channel"
        rng = self.rng(op)
        cshape = {"channel": [shape[1], *[1] * (len(shape) - 2)] if len(shape) > 2
                  else [shape[-1]], "scalar": [], "full": shape[1:]}[mode]
        if kind == "Mul":
            value = rng.uniform(0.5, 1.5, cshape) * rng.choice([-1, 1], cshape, p=[0.2, 0.8])
        else:
            value = rng.standard_normal(cshape)
        c = self.init(f"c{op['key']}", np.asarray(value, np.float32))
        self.node(kind, [x, c], shape, op["key"])

    def op_Add(self, op: dict, x: str, shape: list[int]) -> None:
        self._binary("Add", op, x, shape)

    def op_Mul(self, op: dict, x: str, shape: list[int]) -> None:
        self._binary("Mul", op, x, shape)

    # ---- pooling
    def _pool(self, kind: str, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) != 4:
            return
        k, s = [min(op["k"][i], shape[2 + i]) for i in range(2)], op["stride"]
        pads = [min(p, k[i % 2] - 1) for i, p in enumerate(op["pads"])]
        dims, ceil = [], op["ceil"]
        for i, size in enumerate(shape[2:]):
            span = size + pads[i] + pads[i + 2] - k[i]
            if ceil and -(-span // s[i]) * s[i] >= size + pads[i]:
                # a last window starting in the end pad: onnxruntime drops it, onnx's shape
                # inference keeps it; the model would be ambiguous, so no ceil_mode here
                ceil = False
        for i, size in enumerate(shape[2:]):
            span = size + pads[i] + pads[i + 2] - k[i]
            dims.append((-(-span // s[i]) if ceil else span // s[i]) + 1)
        if min(dims) < 1:
            return
        attrs: dict[str, Any] = {"kernel_shape": k, "strides": s, "pads": pads,
                                 "ceil_mode": int(ceil)}
        if kind == "AveragePool":
            attrs["count_include_pad"] = int(op["include_pad"])
        self.node(kind, [x], [shape[0], shape[1], *dims], op["key"], **attrs)

    def op_MaxPool(self, op: dict, x: str, shape: list[int]) -> None:
        self._pool("MaxPool", op, x, shape)

    def op_AveragePool(self, op: dict, x: str, shape: list[int]) -> None:
        self._pool("AveragePool", op, x, shape)

    def op_GlobalAveragePool(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) == 4:
            self.node("GlobalAveragePool", [x], [*shape[:2], 1, 1], op["key"])

    # ---- data movement
    def op_Concat(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) < 2:
            return
        other, oshape = x, shape
        if op["with"] == "earlier":
            fits = [(n, s) for n, s in self.values[:-1]
                    if len(s) == len(shape) and s[0] == shape[0] and s[2:] == shape[2:]]
            if fits:
                other, oshape = fits[-1]
        self.node("Concat", [x, other], [shape[0], shape[1] + oshape[1], *shape[2:]],
                  op["key"], axis=1)

    def op_Reshape(self, op: dict, x: str, shape: list[int]) -> None:
        n, rest = shape[0], int(np.prod(shape[1:]))
        options = [[n, rest], [n, 1, rest], [n * shape[1], -1] if len(shape) > 2 else [rest, n]]
        if len(shape) == 4:
            options += [[n, shape[1], shape[2] * shape[3]], [n, shape[1] * shape[2], shape[3]],
                        [n, shape[1], shape[3], shape[2]]]
        target = options[op["choice"] % len(options)]
        out = [d if d != -1 else int(np.prod(shape)) // int(np.prod([t for t in target
                                                                      if t != -1]))
               for d in target]
        s = self.init(f"s{op['key']}", np.array(target, np.int64))
        self.node("Reshape", [x, s], out, op["key"])

    def op_Transpose(self, op: dict, x: str, shape: list[int]) -> None:
        perms = {2: [[1, 0]], 3: [[0, 2, 1], [1, 0, 2], [2, 1, 0]],
                 4: [[0, 2, 3, 1], [0, 3, 1, 2], [0, 1, 3, 2], [1, 0, 2, 3], [0, 2, 1, 3]]}
        if len(shape) not in perms:
            return
        perm = perms[len(shape)][op["choice"] % len(perms[len(shape)])]
        self.node("Transpose", [x], [shape[p] for p in perm], op["key"], perm=perm)

    def op_Flatten(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) > 2:
            self.node("Flatten", [x], [shape[0], int(np.prod(shape[1:]))], op["key"], axis=1)

    def op_Resize(self, op: dict, x: str, shape: list[int]) -> None:
        if len(shape) != 4:
            return
        scales = [1.0, 1.0, *op["scale"]]
        dims = [int(math.floor(d * sc)) for d, sc in zip(shape, scales, strict=True)]
        if min(dims) < 1 or dims[2] * dims[3] > 1024:
            return
        roi = self.init(f"roi{op['key']}", np.zeros(0, np.float32))
        sc = self.init(f"sc{op['key']}", np.array(scales, np.float32))
        attrs = {"mode": op["mode"], "coordinate_transformation_mode": op["coord"]}
        if op["mode"] == "nearest":
            attrs["nearest_mode"] = op["nearest"]
        self.node("Resize", [x, roi, sc], dims, op["key"], **attrs)

    def op_Softmax(self, op: dict, x: str, shape: list[int]) -> None:
        self.node("Softmax", [x], shape, op["key"], axis=op["axis"] if len(shape) > 1 else -1)


def _divisor(c: int) -> int:
    """The smallest divisor of ``c`` above 1 (a grouped conv), or 1."""
    return next((g for g in range(2, c + 1) if c % g == 0 and g < c), 1)


def _model(b: _Builder, outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        b.nodes, "fuzz",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, b.spec.input_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    inferred = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in [*model.graph.value_info, *model.graph.output]}
    for name, shape in b.values[1:]:
        if inferred.get(name) != shape:
            raise AssertionError(f"generator: {name} is {inferred.get(name)}, built {shape}")
    return model


def build(spec: Spec) -> tuple[onnx.ModelProto, _Builder]:
    b = _Builder(spec)
    for op in spec.ops:
        b.add(op)
    if not b.nodes:  # every intent skipped: one Relu keeps the model non-empty
        b.op_Relu({"key": 999}, *b.cur)
    names = [n for n, _ in b.values[1:]]
    outputs = names[-spec.outputs:] if spec.outputs <= len(names) else names[-1:]
    return _model(b, outputs), b


def float_model(spec: Spec) -> onnx.ModelProto:
    return build(spec)[0]


# --------------------------------------------------------------------------- inputs

def calibration(spec: Spec, count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng((spec.seed, 1))
    return [{"x": rng.standard_normal(spec.input_shape).astype(np.float32)}
            for _ in range(count)]


def fuzz_inputs(spec: Spec) -> dict[str, np.ndarray]:
    """Drawn like the calibration data, 20 % wider, so some values saturate."""
    rng = np.random.default_rng((spec.seed, 2))
    return {"x": (1.2 * rng.standard_normal(spec.input_shape)).astype(np.float32)}


# --------------------------------------------------------------------------- quantizers

def quantized_model(spec: Spec) -> onnx.ModelProto:
    """The QDQ model of ``spec``, with the spec in its metadata (``fuzz_spec``)."""
    fm, b = build(spec)
    kind = spec.quant["kind"]
    model = (_ort_quantize(spec, fm) if kind == "ort" else _dynamic_quantize(spec, fm)
             if kind == "dynamic" else _hand_quantize(spec, fm, b))
    del model.metadata_props[:]
    model.metadata_props.append(onnx.StringStringEntryProto(key="fuzz_spec",
                                                            value=spec.to_json()))
    return model


def _ort_quantize(spec: Spec, fm: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter(calibration(spec))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.data, None)

    q = spec.quant
    qtype = {"u8": QuantType.QUInt8, "s8": QuantType.QInt8}
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "f.onnx"), Path(tmp, "q.onnx")
        onnx.save(fm, src)
        for per_channel in (q["per_channel"], False):
            try:
                quantize_static(
                    str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, reduce_range=q["reduce_range"],
                    activation_type=qtype[q["activation"]], weight_type=qtype[q["weight"]],
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": q["act_sym"],
                                   "WeightSymmetric": q["w_sym"],
                                   "ForceQuantizeNoInputCheck": q.get("force", False)})
                break
            except ValueError:  # onnxruntime 1.2x: per-channel grouped ConvTranspose biases
                if not per_channel:  # broadcast its Cout/g weight scales against Cout
                    raise
        return onnx.load(dst)


def _dynamic_quantize(spec: Spec, fm: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    q = spec.quant
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "f.onnx"), Path(tmp, "q.onnx")
        onnx.save(fm, src)
        quantize_dynamic(str(src), str(dst), per_channel=q["per_channel"],
                         reduce_range=q["reduce_range"],
                         weight_type={"u8": QuantType.QUInt8, "s8": QuantType.QInt8}[q["weight"]])
        return onnx.load(dst)


def _ranges(fm: onnx.ModelProto, spec: Spec) -> dict[str, tuple[float, float]]:
    """min / max of every value over the calibration data (onnxruntime, float)."""
    import onnxruntime as ort

    m = copy.deepcopy(fm)
    names = ["x"] + [o for n in m.graph.node for o in n.output]
    known = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                          for n in names if n not in known)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    out_names = [o.name for o in session.get_outputs()]
    lo = {n: math.inf for n in out_names}
    hi = {n: -math.inf for n in out_names}
    lo["x"], hi["x"] = math.inf, -math.inf
    for feeds in calibration(spec):
        for n, v in zip(out_names, session.run(None, feeds), strict=True):
            lo[n], hi[n] = min(lo[n], float(v.min())), max(hi[n], float(v.max()))
        lo["x"] = min(lo["x"], float(feeds["x"].min()))
        hi["x"] = max(hi["x"], float(feeds["x"].max()))
    return {n: (lo[n], hi[n]) for n in lo}


_QRANGE = {"u8": (0, 255, np.uint8), "s8": (-128, 127, np.int8)}


def _hand_quantize(spec: Spec, fm: onnx.ModelProto, b: _Builder) -> onnx.ModelProto:
    rng = np.random.default_rng((spec.seed, 3))
    ranges = _ranges(fm, spec)
    q = spec.quant
    graph = fm.graph
    inits = {t.name: t for t in graph.initializer}
    new_nodes: list[onnx.NodeProto] = []
    act_params: dict[str, tuple[float, int]] = {}  # value -> (scale, zp) of its quantizer
    rename: dict[str, str] = {}

    def quantize_value(name: str) -> None:
        if name not in ranges or rng.random() > q["coverage"]:
            return
        dtype = str(rng.choice(["u8", "s8"]))
        qmin, qmax, np_t = _QRANGE[dtype]
        lo, hi = min(ranges[name][0], 0.0), max(ranges[name][1], 0.0)
        scale = max(hi - lo, 1e-3) / 255 * float(rng.uniform(0.5, 1.5))
        ideal = qmin - lo / scale
        zp = int(np.clip(round(ideal + rng.integers(-3, 4)), qmin, qmax))
        s_name, z_name = f"{name}_scale", f"{name}_zp"
        graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), s_name),
                                  numpy_helper.from_array(np.array(zp, np_t), z_name)])
        new_nodes.append(helper.make_node("QuantizeLinear", [name, s_name, z_name],
                                          [f"{name}_q"], name=f"{name}_Q"))
        new_nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", s_name, z_name],
                                          [f"{name}_dq"], name=f"{name}_DQ"))
        act_params[name] = (scale, zp)
        rename[name] = f"{name}_dq"

    quantize_value("x")
    body = list(graph.node)
    for node in body:
        for i, inp in enumerate(node.input):
            if inp in rename:
                node.input[i] = rename[inp]
        for i, inp in enumerate(list(node.input)):
            if inp in b.weights and inp in inits:
                node.input[i] = _quantize_weight(graph, inits[inp], b.weights[inp], q, rng,
                                                 new_nodes)
            elif inp in b.biases and inp in inits:
                x, w = b.biases[inp]
                if x in act_params and f"{w}_scale" in {t.name for t in graph.initializer}:
                    node.input[i] = _quantize_bias(graph, inits[inp], act_params[x][0],
                                                   f"{w}_scale", new_nodes)
        new_nodes.append(node)
        for out in node.output:
            quantize_value(out)
    del graph.node[:]
    graph.node.extend(new_nodes)
    for o in graph.output:  # graph outputs read the dequantized value
        if o.name in rename:
            o.name = rename[o.name]
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(fm)


def _quantize_weight(graph: onnx.GraphProto, t: onnx.TensorProto, reader: str, q: dict,
                     rng: np.random.Generator, nodes: list[onnx.NodeProto]) -> str:
    w = numpy_helper.to_array(t)
    qmin, qmax, np_t = _QRANGE[q["weight"]]
    axis = {"Conv": 0, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1, "Gemm_t": 0}[reader]
    per_channel = q["per_channel"] and w.shape[axis] > 1
    red = tuple(i for i in range(w.ndim) if i != axis) if per_channel else None
    lo, hi = np.minimum(w.min(axis=red), 0), np.maximum(w.max(axis=red), 0)
    symmetric = q["weight"] == "s8" and rng.random() < 0.7
    if symmetric:
        scale = np.maximum(np.maximum(-lo, hi), 1e-6) / 127
        zp = np.zeros_like(scale, dtype=np.int64)
    else:
        scale = np.maximum(hi - lo, 1e-6) / 255
        zp = np.clip(np.round(qmin - lo / scale), qmin, qmax).astype(np.int64)
    scale = scale.astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)] if per_channel else []
    wq = np.clip(np.rint(w / scale.reshape(shape)) + zp.reshape(shape), qmin, qmax)
    name = t.name
    graph.initializer.extend([
        numpy_helper.from_array(wq.astype(np_t), f"{name}_quantized"),
        numpy_helper.from_array(scale, f"{name}_scale"),
        numpy_helper.from_array(zp.astype(np_t), f"{name}_zp")])
    attrs = {"axis": axis} if per_channel else {}
    nodes.append(helper.make_node(
        "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zp"],
        [f"{name}_dq"], name=f"{name}_DQ", **attrs))
    _drop_initializer(graph, name)
    return f"{name}_dq"


def _quantize_bias(graph: onnx.GraphProto, t: onnx.TensorProto, s_x: float,
                   w_scale_name: str, nodes: list[onnx.NodeProto]) -> str:
    b = numpy_helper.to_array(t)
    s_w = next(numpy_helper.to_array(i) for i in graph.initializer if i.name == w_scale_name)
    if s_w.size not in (1, b.size):  # a grouped ConvTranspose's per-channel scales: float bias
        return t.name
    scale = (np.float32(s_x) * s_w.astype(np.float32)).astype(np.float32)
    scale = np.broadcast_to(scale, b.shape).copy() if scale.ndim else scale
    bq = np.clip(np.rint(b / scale), -(2**31), 2**31 - 1).astype(np.int32)
    name = t.name
    graph.initializer.extend([numpy_helper.from_array(bq, f"{name}_quantized"),
                              numpy_helper.from_array(scale, f"{name}_scale"),
                              numpy_helper.from_array(np.zeros_like(bq) if scale.ndim
                                                      else np.array(0, np.int32),
                                                      f"{name}_zp")])
    attrs = {"axis": 0} if scale.ndim else {}
    nodes.append(helper.make_node(
        "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zp"],
        [f"{name}_dq"], name=f"{name}_DQ", **attrs))
    _drop_initializer(graph, name)
    return f"{name}_dq"


def _drop_initializer(graph: onnx.GraphProto, name: str) -> None:
    for i, t in enumerate(graph.initializer):
        if t.name == name:
            del graph.initializer[i]
            return
