"""Dynamic quantization (onnxruntime's quantize_dynamic: DynamicQuantizeLinear → MatMulInteger /
ConvInteger → Cast → Mul by the two scales → Add the bias): the integer op is an int8 oneDNN
primitive reading the zero point at run time (compiler/onnx_import/convert_dynamic.py), and the
Cast, the scale Mul, the bias and what follows are its post-ops (passes/fuse_post_ops.py).
Every output bit-exact, in the fused and unfused modes, against onnxruntime running the model
without graph optimizations and with its integer ops in their exact float form
(examples/realzoo/exact.py): its own MatMulInteger / ConvInteger saturate u8·s8 pairs in int16
on CPUs without VNNI (thousands of units off on 11 % of a per-channel MatMul's sums here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from onnxruntime.quantization import QuantType, quantize_dynamic

from qfuse import compile_model
from qfuse.examples.realzoo.exact import exact_qdq
from qfuse.runtime.reference.ops_quant import dynamic_params

RNG = np.random.default_rng(7)


def _const(name: str, shape: tuple[int, ...], std: float,
           rng: np.random.Generator = RNG) -> onnx.TensorProto:
    return nh.from_array(rng.normal(0, std, shape).astype(np.float32), name)


def _mlp(rng: np.random.Generator = RNG) -> onnx.ModelProto:
    """A transformer's feed-forward block: MatMul + bias, ReLU, MatMul + bias, residual."""
    nodes = [h.make_node("MatMul", ["x", "w1"], ["h"]), h.make_node("Add", ["h", "b1"], ["hb"]),
             h.make_node("Relu", ["hb"], ["r"]), h.make_node("MatMul", ["r", "w2"], ["o"]),
             h.make_node("Add", ["o", "b2"], ["ob"]), h.make_node("Add", ["ob", "x"], ["y"])]
    graph = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                 [2, 12, 48])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12, 48])],
                         [_const("w1", (48, 96), 0.2, rng), _const("b1", (96,), 0.1, rng),
                          _const("w2", (96, 48), 0.2, rng), _const("b2", (48,), 0.1, rng)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _convnet(rng: np.random.Generator = RNG) -> onnx.ModelProto:
    """Padded and strided convolutions with a bias and a ReLU (padding taps are the zero
    point, as onnxruntime's ConvInteger pads)."""
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    graph = h.make_graph(nodes, "convnet", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 8, 13, 11])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 7, 6])],
                         [_const("w1", (16, 8, 3, 3), 0.3, rng), _const("b1", (16,), 0.1, rng),
                          _const("w2", (16, 16, 3, 3), 0.3, rng),
                          _const("b2", (16,), 0.1, rng)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _squeeze_excitation() -> onnx.ModelProto:
    """MobileNetV3's squeeze-excitation: 1x1 convolutions over a 1x1 image, on which a
    binary post-op sends oneDNN's int8 convolution to ref:any (its GlobalAveragePool is a
    GlobalMaxPool here: a float average sums in another order than onnxruntime's, one ulp
    that moves the next dynamic range)."""
    nodes = [h.make_node("Conv", ["x", "w0", "b0"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("GlobalMaxPool", ["c"], ["p"]),
             h.make_node("Conv", ["p", "w1", "b1"], ["f1"]), h.make_node("Relu", ["f1"], ["r"]),
             h.make_node("Conv", ["r", "w2", "b2"], ["f2"]),
             h.make_node("HardSigmoid", ["f2"], ["g"], alpha=1 / 6),
             h.make_node("Mul", ["c", "g"], ["y"])]
    graph = h.make_graph(nodes, "se", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                [1, 8, 9, 9])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 9, 9])],
                         [_const("w0", (32, 8, 3, 3), 0.3), _const("b0", (32,), 0.1),
                          _const("w1", (16, 32, 1, 1), 0.3), _const("b1", (16,), 0.1),
                          _const("w2", (32, 16, 1, 1), 0.3), _const("b2", (32,), 0.1)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _quantized(tmp_path: Path, model: onnx.ModelProto, per_channel: bool,
               weight_type: QuantType, reduce_range: bool = False) -> str:
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), per_channel=per_channel, weight_type=weight_type,
                     reduce_range=reduce_range, op_types_to_quantize=["MatMul", "Conv"])
    return str(dst)


def _session(model: str | bytes, level: ort.GraphOptimizationLevel | None = None,
             save_to: Path | None = None) -> ort.InferenceSession:
    """An onnxruntime CPU session (``level``: its graph optimizations; ``save_to``: where it
    writes the model it optimized)."""
    options = ort.SessionOptions()
    if level is not None:
        options.graph_optimization_level = level
    if save_to is not None:
        options.optimized_model_filepath = str(save_to)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _onnxruntime(path: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The exact form of the model at ``path``, run by onnxruntime node by node."""
    exact = exact_qdq(onnx.load(path)).SerializeToString()
    return _session(exact, ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, feeds)[0]


def _ort_optimized(path: str, tmp_path: Path) -> str:
    """The model onnxruntime's optimizer saves from ``path`` (its contrib ops fused in)."""
    saved = tmp_path / "optimized.onnx"
    _session(path, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, saved)
    return str(saved)


# reduce_range: 7-bit weights, which no u8·s8 pair saturates: unsplit on CPUs without VNNI too,
# so the run-time src scale path (lower_compute._runtime_src_scale) runs on every CPU
CASES = [(build, per_channel, weight_type, reduce_range)
         for build in (_mlp, _convnet, _squeeze_excitation) for per_channel in (False, True)
         for weight_type in (QuantType.QInt8, QuantType.QUInt8) for reduce_range in (False, True)]


@pytest.mark.parametrize(("build", "per_channel", "weight_type", "reduce_range"), CASES,
                         ids=[f"{b.__name__[1:]}-{'channel' if p else 'tensor'}-{w.name}"
                              f"{'-reduce_range' if r else ''}" for b, p, w, r in CASES])
@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_bit_exact_against_onnxruntime(tmp_path: Path, build: object, per_channel: bool,
                                       weight_type: QuantType, reduce_range: bool,
                                       mode: str) -> None:
    path = _quantized(tmp_path, build(), per_channel, weight_type,  # type: ignore[operator]
                      reduce_range)
    compiled = compile_model(path, mode=mode)
    shape = compiled.input_specs()["x"][0]
    for seed in (0, 1):
        x = np.random.default_rng(seed).normal(0, 1, shape).astype(np.float32)
        np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                      _onnxruntime(path, {"x": x}))


@pytest.mark.parametrize("reduce_range", [False, True], ids=["8bit", "reduce_range"])
@pytest.mark.parametrize(("build", "count"), [(_mlp, 2), (_convnet, 2),
                                              (_squeeze_excitation, 3)],
                         ids=["mlp", "convnet", "squeeze_excitation"])
def test_integer_op_is_one_int8_kernel_with_its_float_tail(tmp_path: Path, build: object,
                                                           count: int,
                                                           reduce_range: bool) -> None:
    """The symmetric s8 weights quantize_dynamic writes by default: each MatMulInteger /
    ConvInteger is an int8 primitive (u8 src, its zero point read at run time) whose post-ops
    are the Cast, the Mul by the scales and the bias (without VNNI, split in halves, maybe
    finished by a binary primitive: no_vnni.py); no Cast kernel is left, the only numpy
    kernels are the dynamic quantizations' scale and zero point (which also compute the
    ``s_x·s_w`` products), and none runs on a ``ref:`` implementation (a 1x1 image's split
    convolution finishes in a binary primitive, no_vnni.py). Where a primitive is not split
    (7-bit weights here; every one on a CPU with VNNI) the Mul by ``s_x·s_w`` is oneDNN's
    run-time src scale times the weight scales, and the bias its bias: no binary post-op."""
    path = _quantized(tmp_path, build(), False, QuantType.QInt8,  # type: ignore[operator]
                      reduce_range)
    inspected = compile_model(path).inspect()
    kernels = inspected["kernels"]
    # inspect names why each unfused node stays (the s_x·s_w products: the params kernel's)
    assert not [d["node"] for d in inspected["not_fused"] if d["reason"] == "no pass matched"]
    integer = [k for k in kernels if k["op"] in ("MatMul", "Conv") and k["absorbed"]]
    assert len(integer) == count, [k["name"] for k in kernels]
    for kernel in integer:
        assert kernel["dst_dtype"] == "f32"
        if not any(k["name"] == f"{kernel['node']}:lo" for k in kernels):  # not split
            assert kernel["scales_masks"].get("SRC") == 0, kernel
            assert not [p for p in kernel["post_ops"] if p.startswith("binary")], kernel
        assert any("cast" in name.lower() for name in kernel["absorbed"]), kernel["absorbed"]
        assert sum("mul" in name.lower() or "add" in name.lower()
                   for name in kernel["absorbed"]) >= 2, kernel["absorbed"]
    assert not [k["name"] for k in kernels if k["op"] == "Cast"]
    assert not [k["name"] for k in kernels if "ref" in k["impl"]]
    assert {k["op"] for k in kernels if k["impl"] == "numpy"} == {"DynamicQuantizeLinear"}


def _wide_conv(rng: np.random.Generator) -> onnx.ModelProto:
    """A strided, padded 3x3 convolution of 64 channels: 576 products per output, so one box
    sum serves every output channel, summed over the channels first (weight_zero_point.py)."""
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    graph = h.make_graph(nodes, "wide", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 64, 11, 12])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 6, 6])],
                         [_const("w", (64, 64, 3, 3), 0.1, rng), _const("b", (64,), 0.1, rng)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _pointwise_conv(rng: np.random.Generator) -> onnx.ModelProto:
    """A 1x1 convolution of 256 to 64 channels: one box sum, the channel sums read with the
    convolution's own window (one output channel)."""
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["y"])]
    graph = h.make_graph(nodes, "pointwise", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [1, 256, 5, 5])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 5, 5])],
                         [_const("w", (64, 256, 1, 1), 0.1, rng), _const("b", (64,), 0.1, rng)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("build", [_convnet, _wide_conv, _pointwise_conv],
                         ids=["convnet", "wide", "pointwise"])
@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32"])
def test_u8_weights_beyond_s8_are_two_int8_convolutions(tmp_path: Path, mode: str,
                                                        build: object) -> None:
    """``weight_type=QUInt8`` (quantize_dynamic's default until onnxruntime 1.11, and what
    many scripts pass): per-tensor u8 weights with zero points other than 127 / 128, so
    ``w − zw`` leaves s8. Each ConvInteger is a main and a box-sum int8 convolution and their sum
    (passes/weight_zero_point.py; before: an onnxruntime island each), bit-exact against the
    exact form (fp32: within weight-quantization noise of the float model, as above)."""
    model = build(np.random.default_rng(7))  # type: ignore[operator]
    path = _quantized(tmp_path, model, False, QuantType.QUInt8)
    zero_points = [int(nh.to_array(i)) for i in onnx.load(path).graph.initializer
                   if i.name.startswith("w") and i.name.endswith("zero_point")]
    assert zero_points and all(z not in (127, 128) for z in zero_points), zero_points
    compiled = compile_model(path, mode=mode)
    inspected = compiled.inspect()
    assert not inspected["islands"]
    x = np.random.default_rng(0).normal(0, 1, compiled.input_specs()["x"][0]).astype(np.float32)
    if mode == "fp32":  # the float model: float32 kernels only (test_fp32_mode_is_the_float_model)
        assert {k["src_dtype"] for k in inspected["kernels"]} == {"f32"}
        want = _session(model.SerializeToString()).run(None, {"x": x})[0]
        assert np.abs(compiled.run({"x": x})["y"] - want).max() < 0.05 * np.abs(want).max()
        return
    convs = [k for k in inspected["kernels"] if k["primitive"] == "convolution"]
    # two nodes per ConvInteger (without VNNI each may run as two halves: no_vnni.py); the
    # wide one's box sum a float32 box over its channel sums
    nodes = sorted(node.rsplit("/", 1)[-1] for node in {k["node"] for k in convs})
    want = {_wide_conv: ["box_sum", "channel_sum", "main"], _pointwise_conv: ["box_sum", "main"],
            _convnet: ["box_sum", "box_sum", "main", "main"]}[build]
    assert nodes == want, nodes
    assert {k["src_dtype"] for k in convs if not k["node"].endswith("box_sum")} == {"u8"}
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], _onnxruntime(path, {"x": x}))


@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_matmul_u8_weights_per_column_are_two_int8_matmuls(tmp_path: Path, mode: str) -> None:
    """``per_channel=True`` with u8 weights: each MatMulInteger's zero points differ per column
    and leave s8 (oneDNN's matmul takes one weight zero point): a main matmul on ``w − 128`` and
    one with weights ``o`` per column, their sum (before: an onnxruntime island each),
    bit-exact against the exact form."""
    path = _quantized(tmp_path, _mlp(np.random.default_rng(7)), True, QuantType.QUInt8)
    compiled = compile_model(path, mode=mode)
    inspected = compiled.inspect()
    assert not inspected["islands"]
    # (without VNNI oneDNN runs an s8 matmul as a 1x1 convolution: any int8 primitive)
    parts = {k["node"] for k in inspected["kernels"]
             if (k["node"] or "").endswith(("/main", "/box_sum"))}
    assert sorted(n.rsplit("/", 1)[-1] for n in parts) == ["box_sum", "box_sum", "main",
                                                           "main"], parts
    x = np.random.default_rng(0).normal(0, 1, compiled.input_specs()["x"][0]).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], _onnxruntime(path, {"x": x}))


@pytest.mark.parametrize("mode", ["fused", "unfused", "fp32"])
def test_integer_accumulator_read_as_it_is(mode: str) -> None:
    """A MatMulInteger whose per-column u8 weights leave s8 and whose int32 accumulator is the
    graph output (no Cast to float32 after it: strip_quantization keeps it int8 in fp32 mode
    too): the two int8 matmuls' float32 sum cast back to int32, exact (lowering rejected the
    int16 weights, `numpy dtype int16 has no oneDNN data type`)."""
    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, (16, 8)).astype(np.uint8)
    w[0], w[1] = 0, 255
    nodes = [h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "sx", "zx"]),
             h.make_node("MatMulInteger", ["xq", "w", "zx", "zw"], ["y"])]
    graph = h.make_graph(nodes, "acc", [h.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                         [h.make_tensor_value_info("y", TensorProto.INT32, [4, 8])],
                         [nh.from_array(w, "w"),
                          nh.from_array(rng.integers(20, 230, 8).astype(np.uint8), "zw")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    compiled = compile_model(model, mode=mode)
    assert not compiled.inspect()["islands"]
    scale, zx = dynamic_params(float(x.min()), float(x.max()))
    xq = np.clip(np.rint(x / np.float32(scale)) + zx, 0, 255).astype(np.int64)
    zw = nh.to_array(graph.initializer[1]).astype(np.int64)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"],
                                  (xq - zx) @ (w.astype(np.int64) - zw))  # the exact form


def _dynamic_quantize_model() -> onnx.ModelProto:
    outputs = [h.make_tensor_value_info("y", TensorProto.UINT8, [3, 50]),
               h.make_tensor_value_info("s", TensorProto.FLOAT, []),
               h.make_tensor_value_info("z", TensorProto.UINT8, [])]
    graph = h.make_graph([h.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "dql",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, [3, 50])], outputs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


def _edge(case: str) -> np.ndarray:
    x = np.random.default_rng(len(case)).normal(0, 1, (3, 50)).astype(np.float32)
    return {"normal": x, "zeros": np.zeros_like(x), "positive": np.abs(x) + 1,
            "negative": -np.abs(x) - 1, "tiny": x * np.float32(1e-30),
            "ties": np.round(x * 8) / 8,  # many x / scale near .5
            "plus_inf": np.where(np.arange(x.size).reshape(x.shape) == 7, np.inf, x),
            "minus_inf": np.where(np.arange(x.size).reshape(x.shape) == 7, -np.inf, x)}[case]


@pytest.mark.parametrize("case", ["normal", "zeros", "positive", "negative", "tiny", "ties",
                                  "plus_inf", "minus_inf"])
def test_dynamic_quantize_linear_is_onnxruntimes(case: str) -> None:
    """DynamicQuantizeLinear's own kernels (reductions, the scale and zero point in float32,
    the quantize as a division): y, scale and zero point equal onnxruntime's, also where the
    range is empty (scale 1) or one-sided. An infinite input sends the fused run to the
    reference interpreter (compiler/nonfinite.py, as for every non-finite input): those cases
    check dynamic_params' clamping, not the kernels."""
    model = _dynamic_quantize_model()
    session = _session(model.SerializeToString())
    x = _edge(case).astype(np.float32)
    want = dict(zip("ysz", session.run(None, {"x": x}), strict=True))
    for mode in ("fused", "reference"):
        compiled = compile_model(model, mode=mode)
        if mode == "fused":
            kinds = {k["primitive"] for k in compiled.inspect()["kernels"]}
            assert kinds == {"reduction", "numpy", "binary"}, kinds
        got = compiled.run({"x": x})
        for name in "ysz":
            np.testing.assert_array_equal(np.asarray(got[name]).reshape(-1),
                                          np.asarray(want[name]).reshape(-1), err_msg=name)


def _params_in_numpy_float32(x_min: float, x_max: float) -> tuple[float, int]:
    """ONNX Runtime's GetQuantizationParameter in numpy float32 scalars, step by step."""
    f = np.float32
    lo, hi = min(f(x_min), f(0)), max(f(x_max), f(0))
    with np.errstate(all="ignore"):
        scale = f(1) if hi == lo else f(f(hi - lo) / f(255))
        initial = f(f(0) - f(lo / scale))
    clamped = initial if initial < f(255) else f(255)
    clamped = clamped if f(0) < clamped else f(0)
    return float(scale), int(np.rint(clamped))


def test_dynamic_params_are_float32_arithmetic() -> None:
    """The params kernel's Python-float arithmetic (each step rounded to float32) equals numpy's
    float32 scalars on random, tiny, huge and one-sided ranges."""
    rng = np.random.default_rng(3)
    exponents = rng.uniform(-44, 38, (3000, 2))
    signs = rng.choice([-1.0, 1.0], (3000, 2))
    pairs = (signs * 10.0 ** exponents).astype(np.float32)
    cases = [(float(min(a, b)), float(max(a, b))) for a, b in pairs]
    cases += [(0.0, 0.0), (-1e-45, 0.0), (0.0, 1e-45), (-3e38, 3e38), (-np.inf, 1.0),
              (-1.0, np.inf), (-0.0, 0.0), (-1.0, 1.0), (-127.5, 127.5)]
    for x_min, x_max in cases:
        assert dynamic_params(x_min, x_max) == _params_in_numpy_float32(x_min, x_max), \
            (x_min, x_max)


@pytest.mark.parametrize("weights", [QuantType.QInt8, QuantType.QUInt8], ids=["s8", "u8"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("build", [_mlp, _convnet, _squeeze_excitation],
                         ids=["mlp", "convnet", "squeeze_excitation"])
def test_fp32_mode_is_the_float_model(tmp_path: Path, build: object, per_channel: bool,
                                      weights: QuantType) -> None:
    """The fp32 mode strips dynamic quantization (passes/strip_quantization.py): float32
    kernels only, on the float model with the quantized weights ``(w − zw)·s_w``, so within
    weight-quantization noise of the model quantize_dynamic read; u8 weights too, whose
    ``w − zw`` leaves s8 (the int8 modes split those nodes in two, weight_zero_point.py)."""
    model = build()  # type: ignore[operator]
    path = _quantized(tmp_path, model, per_channel, weights)
    compiled = compile_model(path, mode="fp32")
    kernels = compiled.inspect()["kernels"]
    assert {k["src_dtype"] for k in kernels} == {"f32"}, [(k["name"], k["src_dtype"])
                                                          for k in kernels]
    x = np.random.default_rng(0).normal(0, 1, compiled.input_specs()["x"][0]).astype(np.float32)
    want = _session(model.SerializeToString()).run(None, {"x": x})[0]
    got = compiled.run({"x": x})["y"]
    cosine = float(np.sum(got * want) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cosine > 0.9995, cosine


def _two_heads() -> onnx.ModelProto:
    """Two MatMuls reading one input (attention's Q / K / V projections): onnxruntime's
    optimizer keeps one DynamicQuantizeLinear and fuses each reader into MatMulIntegerToFloat;
    a lone MatMul becomes DynamicQuantizeMatMul."""
    nodes = [h.make_node("MatMul", ["x", "wa"], ["a"]), h.make_node("Add", ["a", "ba"], ["ab"]),
             h.make_node("MatMul", ["x", "wb"], ["b"]), h.make_node("Add", ["ab", "b"], ["s"]),
             h.make_node("Relu", ["s"], ["r"]), h.make_node("MatMul", ["r", "wc"], ["y"])]
    graph = h.make_graph(nodes, "heads", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                   [1, 16, 32])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 24])],
                         [_const("wa", (32, 40), 0.2), _const("ba", (40,), 0.1),
                          _const("wb", (32, 40), 0.2), _const("wc", (40, 24), 0.2)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
def test_onnxruntime_optimized_contrib_ops(tmp_path: Path, per_channel: bool) -> None:
    """The model onnxruntime's optimizer saves from a quantize_dynamic one (com.microsoft
    DynamicQuantizeMatMul, MatMulIntegerToFloat) compiles to the same kernels as the
    quantize_dynamic model, with bit-identical outputs: qoperator.py writes the contrib ops
    back as the standard ops."""
    path = _quantized(tmp_path, _two_heads(), per_channel, QuantType.QInt8)
    optimized = onnx.load(_ort_optimized(path, tmp_path))
    contrib = {n.op_type for n in optimized.graph.node if n.domain == "com.microsoft"}
    assert contrib == {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}, contrib
    ours, theirs = compile_model(optimized), compile_model(path)
    assert not ours.inspect()["islands"]
    assert len(ours.inspect()["kernels"]) == len(theirs.inspect()["kernels"])
    x = np.random.default_rng(1).normal(0, 1, (1, 16, 32)).astype(np.float32)
    np.testing.assert_array_equal(ours.run({"x": x})["y"], theirs.run({"x": x})["y"])


def test_check_takes_the_exact_form_as_reference(tmp_path: Path, capsys) -> None:
    """`qfuse check` on a quantize_dynamic model compares against the model's exact form by
    itself (onnxruntime's MatMulInteger saturates without VNNI): every integer tensor
    identical, every float one within float32 rounding."""
    from qfuse.compiler.cli import main

    path = _quantized(tmp_path, _mlp(), True, QuantType.QInt8)
    assert main(["check", path, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "exact form" in result["engine"]
    assert result["ints"] and result["max_lsb"] == 0
    assert max(f["rel_error"] for f in result["floats"]) < 1e-6


def test_channels_last_transpose_is_a_view(tmp_path: Path) -> None:
    """ConvNeXt's NHWC → NCHW Transpose before a convolution: the convolution wants NHWC
    bytes, which is what the Transpose's input already holds, so the Transpose is a view (no
    kernel) through the dynamic quantization, and the plan stays bit-exact."""
    nodes = [h.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             h.make_node("Conv", ["t", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    graph = h.make_graph(nodes, "nhwc", [h.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  [1, 7, 9, 16])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 7, 9])],
                         [_const("w", (16, 16, 3, 3), 0.2), _const("b", (16,), 0.1)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    path = _quantized(tmp_path, model, False, QuantType.QInt8)
    compiled = compile_model(path)
    kernels = compiled.inspect()["kernels"]
    assert not [k["name"] for k in kernels if any("Transpose" in a for a in k["absorbed"])]
    assert not [k["name"] for k in kernels if k["primitive"] == "reorder" and k["src_dtype"]
                in ("f32", "u8") and k["dst_dtype"] == k["src_dtype"] and "output" not in
                k["name"]], [k["name"] for k in kernels]
    x = np.random.default_rng(2).normal(0, 1, (1, 7, 9, 16)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], _onnxruntime(path, {"x": x}))


def test_contrib_ops_equal_onnxruntimes_where_it_does_not_saturate(tmp_path: Path) -> None:
    """With 7-bit weights (reduce_range) no u8·s8 pair saturates in onnxruntime's kernels:
    its own DynamicQuantizeMatMul / MatMulIntegerToFloat and qfuse's kernels for them agree
    bit for bit."""
    path = _quantized(tmp_path, _two_heads(), False, QuantType.QInt8, reduce_range=True)
    optimized = _ort_optimized(path, tmp_path)
    session = _session(optimized, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x = np.random.default_rng(4).normal(0, 1, (1, 16, 32)).astype(np.float32)
    np.testing.assert_array_equal(compile_model(optimized).run({"x": x})["y"],
                                  session.run(None, {"x": x})[0])


def test_scale_product_in_either_operand_order(tmp_path: Path) -> None:
    """``Mul(s_w, s_x)`` as well as ``Mul(s_x, s_w)`` (per-channel s_w): the same kernels and
    bit-exact outputs (the product's run-time scalar found by position, not by comparing
    arrays with None)."""
    path = _quantized(tmp_path, _mlp(), True, QuantType.QInt8)
    model = onnx.load(path)
    swapped = 0
    for n in model.graph.node:
        if n.op_type == "Mul" and n.input[0].endswith("_scale") and n.input[1].endswith("_scale"):
            n.input[0], n.input[1] = n.input[1], n.input[0]
            swapped += 1
    assert swapped == 2
    onnx.save(model, tmp_path / "swapped.onnx")
    swapped_path = str(tmp_path / "swapped.onnx")
    x = np.random.default_rng(3).normal(0, 1, (2, 12, 48)).astype(np.float32)
    for mode in ("fused", "fp32"):
        ours, theirs = compile_model(swapped_path, mode=mode), compile_model(path, mode=mode)
        assert len(ours.inspect()["kernels"]) == len(theirs.inspect()["kernels"])
        np.testing.assert_array_equal(ours.run({"x": x})["y"], theirs.run({"x": x})["y"])
