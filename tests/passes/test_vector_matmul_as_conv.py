"""vector_matmul_as_conv: an int8 MatMul by constant weights (a classifier head at batch 1, a
sequence model's rows) runs as a 1x1 convolution, whose weights oneDNN reorders once where its
GEMM matmul packs them on every call. Bit-identical to the matmul plan (the same exact integer
sums, the same float32 chain)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model
from qfuse.ir.postops import ComposerOptions
from qfuse.passes.vector_matmul_as_conv import gemm_packs_weights, rows_measured
from qfuse.runtime.numerics import step_diff
from tests.compiler.lower_helpers import float_matmul_copy
from tests.compiler.onnx_builders import init, model, qdq_pair

F32 = np.float32
OFF = ComposerOptions().without("vector_matmul_as_conv")


def _head(rows: int, relu: bool = False, per_column: bool = False,
          residual: bool = False, scalar: bool = False) -> onnx.ModelProto:
    """x[rows, 256] → Q/DQ → Gemm(DQ(w) per output channel, bias, transB) [→ Relu] → Q/DQ:
    weights up to ±127 (split without VNNI), as many as MIN_WEIGHTS; ``residual``: the Gemm's
    Q/DQ output plus x, a transformer's residual connection, then Q/DQ; ``scalar``: the Gemm's
    output times a value computed at run time, sigmoid(max(x)), then Q/DQ."""
    rng = np.random.default_rng(7)
    k, n = 256, 256
    inits = [init("w", rng.integers(-127, 128, (n, k)).astype(np.int8)),
             init("ws", rng.uniform(0.001, 0.003, n).astype(F32)),
             init("wz", np.zeros(n, np.int8)), init("b", rng.normal(0, 0.5, n).astype(F32)),
             init("xs", F32(0.02)), init("xz", np.uint8(110)),
             init("ys", F32(0.05)), init("yz", np.uint8(127))]
    nodes = [*qdq_pair("x", "x", "xd"),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Gemm", ["xd", "wd", "b"], ["g"], transB=1)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["r"]))
    if per_column:  # SmoothQuant's per-channel multiply after an activation (NNCF TRANSFORMER)
        inits.append(init("sq", rng.uniform(0.5, 4.0, n).astype(F32)))
        nodes += [helper.make_node("HardSwish", ["g"], ["h"]),
                  helper.make_node("Mul", ["h", "sq"], ["r"])]
    if residual:
        inits += [init("gs", F32(0.04)), init("gz", np.uint8(120))]
        nodes += [*qdq_pair("g", "g", "gd"), helper.make_node("Add", ["gd", "xd"], ["r"])]
    if scalar:
        nodes += [helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=1),
                  helper.make_node("Sigmoid", ["mx"], ["sg"]),
                  helper.make_node("Mul", ["g", "sg"], ["r"])]
    nodes += qdq_pair("y", "r" if relu or per_column or residual or scalar else "g", "y")
    return model(nodes, {"x": ([rows, k], TensorProto.FLOAT)}, ["y"], inits)


def _expected_kinds(matmul_plan, rows: int = 1) -> set[str]:
    """The primitives of the plan: the matmul's become a convolution only where oneDNN's
    matmul for ``[rows, 256]·[256, 256]`` is the weight-packing GEMM (AVX2); where it is
    brgemm (VNNI / AMX) the pass leaves the MatMul."""
    kinds = {k["primitive"] for k in matmul_plan.inspect()["kernels"]
             if not float_matmul_copy(k)}  # (a matmul computed in float32 without VNNI)
    if gemm_packs_weights(256, 256, rows=rows) and (rows == 1 or rows_measured()):
        kinds = (kinds - {"matmul"}) | {"convolution"}
    return kinds


@pytest.mark.parametrize("relu", [False, True])
def test_one_row_is_a_convolution_bit_identical(relu: bool) -> None:
    m = _head(1, relu)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    kinds = {k["primitive"] for k in on.inspect()["kernels"]}
    assert kinds == _expected_kinds(off), kinds
    assert "matmul" in {k["primitive"] for k in off.inspect()["kernels"]}
    compute = [k for k in on.inspect()["kernels"] if k["primitive"] in ("convolution", "matmul")]
    assert compute and all("ref" not in k["impl"] for k in compute), compute
    reference = compile_model(m, mode="reference")
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).normal(0, 2, (1, 256)).astype(F32)}
        got = on.run(feeds)["y"]
        assert np.array_equal(got.view(np.uint32), off.run(feeds)["y"].view(np.uint32))
        assert step_diff(got, reference.run(feeds)["y"], 0.05).max_steps <= 1


def test_a_per_channel_post_op_on_the_single_pixel_stays_jit() -> None:
    """A per-channel binary post-op on the convolution's one output pixel is what oneDNN
    calls a full-size operand: jit only in the dst's channels-last strides (attrs.py,
    single_pixel); before, the convolution ran on ref:any. Bit-identical to the matmul plan."""
    m = _head(1, per_column=True)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    kernels = on.inspect()["kernels"]
    assert {k["primitive"] for k in kernels} == _expected_kinds(off)
    assert not any(k["impl"].startswith("ref") for k in kernels), kernels
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 2, (1, 256)).astype(F32)}
        assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                              off.run(feeds)["y"].view(np.uint32))


@pytest.mark.parametrize("rows", [3, 40])
def test_rows_are_the_pixels_of_a_convolution_bit_identical(rows: int) -> None:
    """More rows: the pixels of a 1 x rows image, channels-last (Reshape and Transpose views
    of the same bytes on either side, no copy). oneDNN's AVX2 1x1 convolution ran 0.53–0.86x
    the GEMM matmul's time on [40..3136 rows]·[96..1536, 120..6625] (PP-OCRv4 rec's CTC head
    [40, 120]·[120, 6625]: 423 → 225 µs, unsplit, 2 threads)."""
    m = _head(rows)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert {k["primitive"] for k in on.inspect()["kernels"]} == _expected_kinds(off, rows)
    assert len(on.inspect()["kernels"]) == len(off.inspect()["kernels"])  # views: no copies
    # every run-time value the rewrite adds is named @image (test_under_avx2 compares value
    # names across ISAs, and where oneDNN's matmul is brgemm they do not exist)
    graph = on.compiled_graph
    added = {v for v in set(graph.values) - set(off.compiled_graph.values)
             if graph.constant(v) is None}
    assert all("@image" in value for value in added), added
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 2, (rows, 256)).astype(F32)}
        assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                              off.run(feeds)["y"].view(np.uint32))


def test_fewer_weights_stay_a_matmul() -> None:
    small = _head(1)
    small.graph.initializer[0].CopyFrom(init("w", np.ones((256, 255), np.int8)))
    small.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 255
    kinds = {k["primitive"] for k in compile_model(small).inspect()["kernels"]}
    assert "matmul" in kinds and "convolution" not in kinds, kinds


@pytest.mark.parametrize("rows", [1, 40])
def test_a_residual_of_the_output_shape_is_viewed_as_the_output(rows: int) -> None:
    """A transformer's attention projection or second FFN MatMul adds its residual stream:
    the residual ``[rows, 256]`` is viewed as ``[1, 256, 1, rows]`` like the output, read at
    the same port by the convolution's sum post-op (BERT-like encoders: 0.88–0.91x on AVX2).
    One row too (an unrolled LSTM cell's input projection, LeViT's distillation head): on a
    single pixel, every operand in the dst's channels-last strides, else ref:any.
    Bit-identical to the matmul plan."""
    m = _head(rows, residual=True)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    kernels = on.inspect()["kernels"]
    assert not [k["name"] for k in kernels if k["impl"].startswith("ref")]
    assert {k["primitive"] for k in kernels} == _expected_kinds(off, rows)
    if "convolution" in _expected_kinds(off, rows):
        main = [k for k in on.inspect()["kernels"] if k["primitive"] == "convolution"
                and not k["name"].endswith(":lo")]
        assert len(main) == 1 and "sum" in main[0]["post_ops"], main
    for seed in range(4):
        feeds = {"x": np.random.default_rng(seed).normal(0, 2, (rows, 256)).astype(F32)}
        assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                              off.run(feeds)["y"].view(np.uint32))


def test_a_run_time_scalar_operand_is_read_as_it_is() -> None:
    """A one-element run-time operand of the chain (here ``· sigmoid(max(x))``) is read by the
    convolution's binary post-op without a view, whatever its rank. Bit-identical."""
    m = _head(40, scalar=True)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    kernels = on.inspect()["kernels"]
    assert {k["primitive"] for k in kernels if k["primitive"] in ("convolution", "matmul")} \
        == {k for k in _expected_kinds(off, 40) if k in ("convolution", "matmul")}
    assert not [k["name"] for k in kernels if k["impl"].startswith("ref")]
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).normal(0, 2, (40, 256)).astype(F32)}
        assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                              off.run(feeds)["y"].view(np.uint32))


def test_dynamic_quantization_reads_its_run_time_zero_point(tmp_path) -> None:
    """quantize_dynamic's MatMulInteger (its src zero point and the scale product s_x·s_w
    computed at run time, one value each) as a 1x1 convolution reading them at the same
    ports; per-column weight scales (a vector product) stay a matmul. Bit-identical."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 256])],
        [init("w", rng.normal(0, 0.1, (256, 256)).astype(F32)),
         init("b", rng.normal(0, 0.1, 256).astype(F32))])
    src = tmp_path / "float.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    for per_channel in (False, True):
        dst = tmp_path / f"dynamic{per_channel}.onnx"
        quantize_dynamic(str(src), str(dst), per_channel=per_channel,
                         weight_type=QuantType.QInt8)
        on, off = compile_model(str(dst)), compile_model(str(dst), composer=OFF)
        kinds = {k["primitive"] for k in on.inspect()["kernels"]}
        if per_channel or "convolution" not in _expected_kinds(off, 40):
            assert "convolution" not in kinds, kinds
        else:  # (and the even input channels' copy of its pair-safe split, no_vnni.py)
            assert "convolution" in kinds and "matmul" not in kinds, kinds
        for seed in range(3):
            feeds = {"x": np.random.default_rng(seed).normal(0, 2, (40, 256)).astype(F32)}
            assert np.array_equal(on.run(feeds)["y"].view(np.uint32),
                                  off.run(feeds)["y"].view(np.uint32))
