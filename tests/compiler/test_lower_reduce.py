"""Reduce*, LRN, Sqrt and Pow end to end: imported as IR ops (not islands), lowered to oneDNN
reduction / lrn / eltwise, checked against onnxruntime and onnx.reference.

Tolerances (float32 results; ``S`` the sum of the magnitudes of the R summands of an output —
Σ|x|, Σx² or |Πx| — so the bound is the textbook float32 summation bound 2·R·eps·S):
- ReduceMax / ReduceMin: exact (0).
- A reduction to a rank-0 output (every axis, keepdims=0) runs in numpy: oneDNN describes no
  scalars (compiler/lower/table.py).
- other reductions: |got - want| <= 2·R·eps·S (a few ulps of the result here), in every mode,
  against onnxruntime and onnx.reference alike (both sum in float32 in their own orders).
- LRN (odd size): relative 4e-6 (oneDNN and onnxruntime both evaluate in float32: a few ulps).
- Sqrt and Pow(x, 2): bit-exact against onnxruntime; other exponents: relative 2 ulps (2.4e-7).
- int8 (DequantizeLinear → ReduceMean → QuantizeLinear): within 1 LSB of onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort, run_reference, single

from qfuse.compiler.api import compile_model
from qfuse.compiler.lower import lower_reduce
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Op

F32 = np.float32
EPS = float(np.finfo(F32).eps)
FLOAT = TensorProto.FLOAT
RNG = np.random.default_rng(5)
MODES = ("reference", "fused")

REDUCE = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceSumSquare"]
# norm_lp_* are ref:any only in oneDNN 3.2: |x| or x² by an eltwise kernel, then the jit sum
NORMS = ("ReduceL1", "ReduceL2", "ReduceSumSquare")
AVERAGED = ("ReduceMean", "ReduceSum", *NORMS)  # over middle axes: an average pooling
# (shape, axes or None = every axis)
AXES = [((6, 40), (1,)), ((6, 40), (-2,)), ((2, 5, 24), (2,)), ((2, 5, 24), (0, 2)),
        ((2, 5, 3, 4), (1, 3)), ((2, 5, 3, 4), (-1, -2)), ((3, 7, 9), None), ((1, 80, 120), (1,))]


def _magnitude(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    w = np.abs(x.astype(np.float64))
    if op == "ReduceProd":
        return np.abs(np.prod(x.astype(np.float64), axis=axes))
    if op in ("ReduceL2", "ReduceSumSquare"):
        total = np.square(w).sum(axis=axes)
        return np.sqrt(total) if op == "ReduceL2" else total
    return w.mean(axis=axes) if op == "ReduceMean" else w.sum(axis=axes)


def _reduce_model(op: str, shape: tuple[int, ...], axes: tuple[int, ...] | None,
                  keepdims: int, opset: int) -> object:
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is None:
        return single(op, shape, opset=opset, keepdims=keepdims)
    if as_input:
        return single(op, shape, [init("axes", np.array(axes, np.int64))], opset=opset,
                      keepdims=keepdims)
    return single(op, shape, opset=opset, axes=list(axes), keepdims=keepdims)


def _kernels(compiled: object) -> list[str]:
    return [k["primitive"] for k in compiled.inspect()["kernels"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize(("shape", "axes"), AXES, ids=str)
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_matches_onnxruntime_and_onnx_reference(op: str, shape: tuple[int, ...],
                                                       axes: tuple[int, ...] | None,
                                                       keepdims: int, opset: int) -> None:
    m = _reduce_model(op, shape, axes, keepdims, opset)
    resolved = tuple(range(len(shape))) if axes is None else tuple(sorted(a % len(shape)
                                                                          for a in axes))
    # a mean / max over every spatial dim of an image is the global pool (convert_reduce.py)
    pool = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}.get(op)
    pooled = pool is not None and len(shape) >= 4 and resolved == tuple(range(2, len(shape)))
    assert [n.op.value for n in import_model(m)] == (
        [op] if not pooled else [pool] if keepdims else [pool, "Squeeze"])
    x = RNG.standard_normal(shape).astype(F32)
    if op == "ReduceProd":
        x = (1 + 0.05 * x).astype(F32)
    count = int(np.prod([shape[a] for a in resolved]))
    bound = 2 * count * EPS * _magnitude(op, x, resolved)
    exact = op in ("ReduceMax", "ReduceMin")
    wants = {"onnxruntime": run_ort(m, {"x": x})[0],
             "onnx.reference": run_reference(m, {"x": x})[0]}
    for mode in MODES:
        compiled = compile_model(m, mode=mode)
        if mode == "fused":  # a rank-0 output is a host value: numpy (table._numpy_instead)
            rank0 = keepdims == 0 and count == x.size
            trailing = resolved == tuple(range(len(shape) - len(resolved), len(shape)))
            kernels = compiled.inspect()["kernels"]
            norm = ["eltwise"] if op in NORMS else []
            # reduced axes one block before kept ones: an average pooling over x as it is
            middle = (resolved == tuple(range(resolved[0], resolved[-1] + 1))
                      and resolved[-1] < len(shape) - 1 and op in AVERAGED)
            assert [k["primitive"] for k in kernels] == (
                ["numpy"] if rank0 else ["pooling"] if pooled else [*norm, "reduction"]
                if trailing else [*norm, "pooling"] if middle
                else ["reorder", *norm, "reduction"])
            assert not any("ref" in k["impl"] for k in kernels), kernels  # jit, every axes set
        got = compiled.run({"x": x})["y"]
        for engine, want in wants.items():
            assert got.shape == want.shape and got.dtype == want.dtype, (mode, engine)
            error = np.abs(got.astype(np.float64) - want).reshape(bound.shape if keepdims == 0
                                                                   else got.shape)
            limit = 0 if exact else bound.reshape(error.shape)
            assert np.all(error <= limit), (mode, engine, float((error - limit).max()))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("shape", "axis"), [((2, 16, 7, 7), 0), ((1, 2, 16, 5, 5), 1),
                                             ((1, 3, 8, 5, 5), 1), ((1, 4, 6, 6), 1)], ids=str)
@pytest.mark.parametrize("keepdims", [1, 0])
def test_short_axis_reduces_across_slices(op: str, shape: tuple[int, ...], axis: int,
                                          keepdims: int) -> None:
    """One outermost axis of 2 to 4 elements (SKNet / ResNeSt sum their radix branches): one
    binary primitive over x's slices (lower_reduce._across_slices), no reorder; ReduceMean of
    3 keeps the reduction kernel (·1/3 is not /3). Max / min and a sum of 2 are bit-exact
    against onnxruntime; sums of 3 or 4 within the float32 bound above."""
    m = single(op, shape, [init("axes", np.array([axis], np.int64))], opset=18,
               keepdims=keepdims)
    x = RNG.standard_normal(shape).astype(F32)
    compiled = compile_model(m)
    k = shape[axis]
    sliced = not (op == "ReduceMean" and k == 3)
    kernels = compiled.inspect()["kernels"]
    assert ([kk["primitive"] for kk in kernels] == ["binary"]) == sliced, kernels
    assert ("across_slices" in kernels[0]["optimizations"]) == sliced
    want = run_ort(m, {"x": x})[0]
    got = compiled.run({"x": x})["y"]
    assert got.shape == want.shape
    if op in ("ReduceMax", "ReduceMin") or (op in ("ReduceSum", "ReduceMean") and k == 2):
        np.testing.assert_array_equal(got, want)
    else:
        bound = 2 * k * EPS * _magnitude(op, x, (axis,))
        assert np.all(np.abs(got.astype(np.float64) - want).reshape(bound.shape) <= bound)


def test_reduce_with_empty_axes_and_noop_is_the_input() -> None:
    m = single("ReduceMean", (2, 3), [init("axes", np.zeros(0, np.int64))], opset=18,
               noop_with_empty_axes=1)
    assert [n.op for n in import_model(m)] == [Op.IDENTITY]
    x = RNG.standard_normal((2, 3)).astype(F32)
    np.testing.assert_array_equal(compile_model(m).run({"x": x})["y"], x)
    m = single("ReduceSum", (2, 3), opset=18, keepdims=0)  # no axes: every axis
    y = compile_model(m).run({"x": x})["y"]
    assert y.shape == () and abs(float(y) - float(x.astype(np.float64).sum())) <= 12 * EPS * 6


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                "ReduceProd"])
@pytest.mark.parametrize("keepdims", [1, 0])
def test_a_reduction_over_axes_of_size_one_is_its_input(op: str, keepdims: int) -> None:
    """oneDNN's reduction refuses a dst of src's dims (this ran in numpy: silero-vad's
    ReduceMean over its one output): max, min and prod are a view of x, mean and sum x + 0
    (a -0 becomes +0, as the reference's sum). Bit-identical to ONNX's reference, -0
    included."""
    m = _reduce_model(op, (2, 1, 3, 1), (1, 3), keepdims, 13)
    compiled = compile_model(m)
    kinds = _kernels(compiled)
    assert "numpy" not in kinds and "reduction" not in kinds, kinds
    assert kinds == ([] if op in ("ReduceMax", "ReduceMin", "ReduceProd") else ["eltwise"])
    x = RNG.standard_normal((2, 1, 3, 1)).astype(F32)
    x[0, 0, 0, 0] = -0.0
    got, want = compiled.run({"x": x})["y"], run_reference(m, {"x": x})[0]
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.astype(F32).view(np.uint32))


@pytest.mark.parametrize(("m", "reason"), [
    (single("ReduceLogSumExp", (2, 3), axes=[1], opset=13), "no algorithm for ReduceLogSumExp"),
    (single("ReduceSum", (2, 3), elem_type=TensorProto.INT32, opset=13),
     "reads float32, not S32"),
    (model([helper.make_node("ReduceMax", ["x", "a"], ["y"], name="n")],
           {"x": ([2, 3], FLOAT), "a": ([1], TensorProto.INT64)}, ["y"], opset=18),
     "axes 'a' must be a constant"),
    (single("Pow", (2, 3), inputs=["x", "x"]), "exponent 'x' must be a constant"),
    (single("LRN", (2, 3), size=3), "LRN of rank 2"),
])
def test_what_the_native_kernels_cannot_take_stays_an_island(m: object, reason: str) -> None:
    g = import_model(m)
    (island,) = [n for n in g if n.op is Op.ISLAND]
    assert reason in island.attrs.reason, island.attrs.reason


def test_quantized_reduce_mean_is_within_one_lsb_of_onnxruntime() -> None:
    """DequantizeLinear → ReduceMean → QuantizeLinear (quantize_static's form) in fused mode."""
    qp = [init("s", np.array(0.04, F32)), init("zp", np.array(3, np.uint8)),
          init("so", np.array(0.01, F32)), init("zo", np.array(120, np.uint8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"], name="dq"),
             helper.make_node("ReduceMean", ["d"], ["m"], axes=[-1], name="mean"),
             helper.make_node("QuantizeLinear", ["m", "so", "zo"], ["y"], name="qo")]
    m = model(nodes, {"x": ([2, 16, 40], FLOAT)}, ["y"], qp, opset=13)
    x = (RNG.standard_normal((2, 16, 40)) * 2).astype(F32)
    want = run_ort(m, {"x": x}, optimized=False)[0].astype(np.int32)
    compiled = compile_model(m, mode="fused")
    assert "reduction" in _kernels(compiled)
    got = compiled.run({"x": x})["y"].astype(np.int32)
    assert np.abs(got - want).max() <= 1


@pytest.mark.parametrize(("shape", "size"), [((2, 16, 5, 6), 5), ((1, 5, 7, 3), 3),
                                             ((2, 6, 4), 1), ((1, 32, 3, 3, 2), 7)], ids=str)
def test_lrn_odd_size_is_onednn_and_matches_onnxruntime(shape: tuple[int, ...],
                                                        size: int) -> None:
    """onnxruntime's LRN takes 4-D x only: other ranks compare with the reference mode's
    float64 evaluation (checked against onnxruntime in 4-D here)."""
    m = single("LRN", shape, size=size, alpha=0.3, beta=0.6, bias=1.5, opset=13)
    x = (RNG.standard_normal(shape) * 2).astype(F32)
    want = run_ort(m, {"x": x})[0] if len(shape) == 4 else compile_model(
        m, mode="reference").run({"x": x})["y"]
    for mode in MODES:
        compiled = compile_model(m, mode=mode)
        if mode == "fused":
            assert _kernels(compiled) == ["lrn"]
        np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=4e-6, atol=0,
                                   err_msg=mode)


def test_lrn_even_size_runs_in_numpy_with_onnx_window() -> None:
    """onnxruntime refuses even sizes; onnx.reference's LRN loops over x.shape[0] where the
    spec has channels (onnx/reference/ops/op_lrn.py), so it is right only when N == C: the
    case compared here."""
    m = single("LRN", (4, 4, 3, 3), size=4, alpha=0.5, beta=0.75, bias=2.0, opset=13)
    x = (RNG.standard_normal((4, 4, 3, 3)) * 2).astype(F32)
    want = run_reference(m, {"x": x})[0]
    compiled = compile_model(m)
    (kernel,) = compiled.inspect()["kernels"]
    assert kernel["primitive"] == "numpy" and "even size 4" in kernel["note"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=4e-6, atol=0)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5, 1.5, -1.0])
def test_pow_and_sqrt_against_onnxruntime(exponent: float) -> None:
    x = np.abs(RNG.standard_normal((3, 64)) * 3).astype(F32) + F32(0.01)
    m = single("Pow", (3, 64), [init("p", np.array(exponent, F32))], opset=13)
    want = run_ort(m, {"x": x})[0]
    for mode in MODES:
        compiled = compile_model(m, mode=mode)
        if mode == "fused":
            assert _kernels(compiled) == ["eltwise"]
        got = compiled.run({"x": x})["y"]
        if exponent == 2.0:
            np.testing.assert_array_equal(got, want, err_msg=mode)
        else:
            np.testing.assert_allclose(got, want, rtol=2 * EPS, atol=0, err_msg=mode)
    m = single("Sqrt", (3, 64), opset=13)
    compiled = compile_model(m)
    assert _kernels(compiled) == ["eltwise"]
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("zp", "dtype"), [(7, np.uint8), (-5, np.int8)])
def test_quantized_max_and_min_reduce_the_integers_bit_exact(op: str, zp: int,
                                                             dtype: type) -> None:
    """DQ → ReduceMax → Q with the same parameters: the dequantize moves after the reduction
    (passes/propagate_dequantize.py), which reads and writes u8 / s8; equal to onnxruntime."""
    qp = [init("s", np.array(0.05, F32)), init("zp", np.array(zp, dtype))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"], name="dq"),
             helper.make_node(op, ["d"], ["r"], axes=[1, 2], keepdims=0, name="reduce"),
             helper.make_node("QuantizeLinear", ["r", "s", "zp"], ["y"], name="qo")]
    m = model(nodes, {"x": ([2, 8, 6, 5], FLOAT)}, ["y"], qp, opset=13)
    x = (RNG.standard_normal((2, 8, 6, 5)) * 4).astype(F32)
    want = run_ort(m, {"x": x}, optimized=False)[0]
    compiled = compile_model(m, mode="fused")
    (reduce_kernel,) = [k for k in compiled.inspect()["kernels"] if k["primitive"] == "reduction"]
    name = "u8" if dtype is np.uint8 else "s8"
    assert reduce_kernel["src_dtype"] == reduce_kernel["dst_dtype"] == name
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], want)


@pytest.mark.parametrize(("dtype", "shape", "axis"), [(np.int8, (1, 2, 49, 4, 16, 24), 3),
                                                      (np.uint8, (2, 5, 3, 7, 24), 2)])
def test_max_over_a_middle_axis_is_a_max_pooling(dtype: type, shape: tuple[int, ...],
                                                 axis: int, monkeypatch) -> None:
    """ReduceMax over a middle axis of a matmul's quantized output seen through a Reshape (its
    layout fixed): oneDNN's reduction runs that on ``ref:any`` only; a max pooling of window R
    over (outer, inner, R) is jit, and the max picks an element: the output equals the
    reduction's own. Hiera's mask-unit attention on s8 queries [1, h, 49, 4, 16, d] first (2
    kernels near 20 ms each before)."""
    rows, width = int(np.prod(shape[:-1])), shape[-1]
    zp = np.array(3, dtype)
    w = RNG.integers(-50, 50, (width, width)).astype(np.int8)
    qp = [init("s", np.array(0.05, F32)), init("zp", zp), init("w", w),
          init("ws", np.array(0.01, F32)), init("wz", np.array(0, np.int8)),
          init("shape", np.array(shape, np.int64))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             helper.make_node("MatMul", ["d", "wd"], ["mm"]),
             helper.make_node("QuantizeLinear", ["mm", "s", "zp"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "s", "zp"], ["md"]),
             helper.make_node("Reshape", ["md", "shape"], ["r6"]),
             helper.make_node("ReduceMax", ["r6"], ["r"], axes=[axis], keepdims=1),
             helper.make_node("QuantizeLinear", ["r", "s", "zp"], ["y"])]
    m = model(nodes, {"x": ([rows, width], FLOAT)}, ["y"], qp, opset=13)
    x = (RNG.standard_normal((rows, width)) * 2).astype(F32)
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]
    (pool,) = [k for k in kernels if k["op"] == "ReduceMax"]
    assert pool["primitive"] == "pooling" and "max_pooling" in pool["optimizations"]
    assert not [k for k in kernels if k["impl"].startswith("ref")]
    monkeypatch.setattr(lower_reduce, "_as_max_pooling", lambda *args: False)
    plain = compile_model(m)  # oneDNN's reduction itself, on the same integers
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], plain.run({"x": x})["y"])


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceSum", "ReduceL1", "ReduceSumSquare"])
def test_a_reduction_over_the_image_of_a_channels_last_tensor_reads_it_as_it_is(
        op: str) -> None:
    """ConvNeXt-V2's global response normalization: ReduceL2 over H and W of a convolution's
    channels-last output. oneDNN's jit reduction reads only the reduced axes innermost (a
    reorder of the whole tensor first); an average pooling over (1, C, H·W) strided views of
    the convolution's own bytes, times H·W (and √ for L2), reads it as it is."""
    w = RNG.standard_normal((32, 16, 1, 1)).astype(F32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node(op, ["c"], ["y"], axes=[2, 3], keepdims=1)]
    m = model(nodes, {"x": ((1, 16, 14, 14), FLOAT)}, ["y"], [init("w", w)], opset=11)
    x = RNG.standard_normal((1, 16, 14, 14)).astype(F32)
    compiled = compile_model(m)
    kernels = compiled.inspect()["kernels"]  # the first: x into the conv's channels-last
    assert [k["primitive"] for k in kernels[1:]] == [
        "convolution", *(["eltwise"] if op != "ReduceSum" else []), "pooling"], kernels
    assert "avg_pooling" in kernels[-1]["optimizations"]
    assert kernels[1]["dst_layouts"][0].endswith("strides=(6272, 1, 448, 32)"), kernels[1]
    c = run_ort(model([nodes[0]], {"x": ((1, 16, 14, 14), FLOAT)}, ["c"], [init("w", w)],
                      opset=11), {"x": x})[0]
    bound = 2 * 196 * EPS * _magnitude(op, c, (2, 3))
    error = np.abs(compiled.run({"x": x})["y"].astype(np.float64) - run_ort(m, {"x": x})[0])
    assert np.all(error.reshape(bound.shape) <= bound)
