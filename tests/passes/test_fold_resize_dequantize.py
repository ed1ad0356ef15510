"""fold_resize_dequantize: the DequantizeLinear left after an int8 nearest Resize (PP-OCRv4
det's FPN upsampling added to a float chain) is written by the Resize kernel itself — one
kernel less — or, where the Resize enlarges, moves before it onto the smaller map; bit-exact
against the plan without it in every mode."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

from qfuse.compiler.api import compile_model
from qfuse.ir import Op
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model, qdq_pair

OFF = ComposerOptions().without("fold_resize_dequantize")
C, H, W = 8, 6, 5


def _model(*, per_channel: bool = False, mode: str = "asymmetric",
           scales: tuple[float, float] = (2.0, 2.0), readers: int = 1,
           requantize: bool = False, nearest_mode: str = "floor",
           zero_point: int = 7, distinct_zero_points: bool = False) -> onnx.ModelProto:
    """x → Q/DQ → Conv → Q/DQ(a) → Resize nearest → + sigmoid(g) → out (float).

    ``readers`` 2: an int8 Conv also reads the resized values (the fold must not happen).
    ``requantize``: the resized values are quantized again in another scale (an FPN's Concat
    scale) and read by an int8 Conv, instead of the float Add."""
    rng = np.random.default_rng(5)
    out_hw = (int(H * scales[0]), int(W * scales[1]))
    a_scale = (rng.uniform(0.02, 0.05, C).astype(np.float32) if per_channel
               else np.float32(0.03))
    a_zp = np.full(C, zero_point, np.uint8) if per_channel else np.uint8(zero_point)
    if distinct_zero_points:  # per channel, each its own
        a_zp = np.arange(zero_point, zero_point + C).astype(np.uint8)
    inits = [init("xs", np.float32(0.02)), init("xz", np.uint8(128)),
             init("as", a_scale), init("az", a_zp),
             init("w", rng.integers(-90, 91, (C, C, 3, 3)).astype(np.int8)),
             init("ws", np.float32(0.003)), init("wz", np.int8(0)),
             init("b", rng.standard_normal(C).astype(np.float32)),
             init("roi", np.zeros(0, np.float32)),
             init("scales", np.array([1, 1, *scales], np.float32))]
    a_pair = [h.make_node("QuantizeLinear", ["conv", "as", "az"], ["aq"], axis=1),
              h.make_node("DequantizeLinear", ["aq", "as", "az"], ["ad"], axis=1)]
    nodes = [*qdq_pair("x", "x", "xd"),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("Conv", ["xd", "wd", "b"], ["conv"], pads=[1, 1, 1, 1]),
             *a_pair,
             h.make_node("Resize", ["ad", "roi", "scales"], ["up"], mode="nearest",
                         coordinate_transformation_mode=mode, nearest_mode=nearest_mode),
             h.make_node("Sigmoid", ["g"], ["gs"]),
             h.make_node("Add", ["up", "gs"], ["out"])]
    outputs = ["out"]
    if requantize:
        inits += [init("rs", np.float32(0.071)), init("rz", np.uint8(120))]
        nodes[-2:] = [*qdq_pair("r", "up", "rd"),
                      h.make_node("Conv", ["rd", "wd"], ["out"], pads=[1, 1, 1, 1])]
    if readers == 2:  # an int8 Conv reads the resized values too (the requantize drops)
        nodes += [h.make_node("QuantizeLinear", ["up", "as", "az"], ["uq"], axis=1),
                  h.make_node("DequantizeLinear", ["uq", "as", "az"], ["ud"], axis=1),
                  h.make_node("Conv", ["ud", "wd"], ["c2"], pads=[1, 1, 1, 1])]
        outputs.append("c2")
    m = model(nodes, {"x": ((1, C, H, W), TensorProto.FLOAT),
                      **({} if requantize else {"g": ((1, C, *out_hw), TensorProto.FLOAT)})},
              outputs, inits)
    onnx.checker.check_model(m)
    return m


def _feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {i.name: rng.uniform(-2, 2, [d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in m.graph.input}


def _dequantize_kernels(compiled: object) -> list[dict]:
    return [k for k in compiled.inspect()["kernels"] if k["op"] == "DequantizeLinear"]


def _same_in_every_mode(m: onnx.ModelProto, on: object, off: object) -> None:
    feeds = _feeds(m)
    np.testing.assert_array_equal(on.run(feeds)["out"], off.run(feeds)["out"])
    for mode in ("unfused", "reference"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run(feeds)["out"],
                                      compile_model(m, mode=mode, composer=OFF).run(feeds)["out"])


def test_an_enlarging_resize_moves_float32_values_dequantized_first() -> None:
    """x2 with a zero point per channel (no reorder of the repeated map takes them): the
    dequantize runs on the small map (its kernels over a quarter of the elements) and the
    Resize copies float32 values with no post-ops — oneDNN 3.2's jit resampling with the
    dequantize as post-ops took 3.5x a bare one (module docstring of the pass)."""
    m = _model(per_channel=True, distinct_zero_points=True)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert on.inspect()["passes"]["fold_resize_dequantize"] == 1
    assert len(_dequantize_kernels(on)) == len(_dequantize_kernels(off)) >= 1
    shapes = [[c.compiled_graph.info(n.outputs[0]).shape for n in c.compiled_graph.topo_order()
               if n.op is Op.DEQUANTIZE_LINEAR] for c in (on, off)]
    assert shapes == [[(1, C, H, W)], [(1, C, 2 * H, 2 * W)]]
    resize = next(k for k in on.inspect()["kernels"] if k["op"] == "Resize")
    assert not resize["impl"].startswith("ref") and not resize["post_ops"], resize
    assert resize["src_dtype"] == resize["dst_dtype"] == "f32"
    _same_in_every_mode(m, on, off)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("scales", [(2.0, 2.0), (3.0, 2.0)])
@pytest.mark.parametrize("zero_point", [0, 7])
def test_a_whole_factor_enlargement_is_one_reorder(
        per_channel: bool, scales: tuple[float, float], zero_point: int) -> None:
    """Whole factors, one zero point: the dequantize stays with the Resize and both are one
    jit reorder from a view of the u8 map repeating each element, the zero point and scale
    its own (lower_resize ``_copied_runs``: one run a dim): one kernel instead of a dequantize and a
    float32 resampling, bit-exact in every mode."""
    m = _model(per_channel=per_channel, scales=scales, zero_point=zero_point)
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert on.inspect()["passes"]["fold_resize_dequantize"] == 1
    assert not _dequantize_kernels(on) and len(_dequantize_kernels(off)) == 1
    assert len(on.inspect()["kernels"]) == len(off.inspect()["kernels"]) - 1
    resize = next(k for k in on.inspect()["kernels"] if k["op"] == "Resize")
    assert resize["primitive"] == "reorder" and resize["impl"].startswith("jit"), resize
    assert resize["src_dtype"] == "u8" and resize["dst_dtype"] == "f32"
    assert any("DequantizeLinear" in a for a in resize["absorbed"]), resize["absorbed"]
    _same_in_every_mode(m, on, off)
    feeds = _feeds(m)
    feeds["x"] *= 30  # every byte value of the resized map
    np.testing.assert_array_equal(on.run(feeds)["out"], off.run(feeds)["out"])


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_resize_writes_the_dequantized_values_bit_exact(per_channel: bool) -> None:
    # the Resize shrinks (oneDNN's indices are ONNX's for these modes): folded into it
    m = _model(per_channel=per_channel, scales=(0.5, 0.5), mode="half_pixel",
               nearest_mode="round_prefer_ceil")
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert on.inspect()["passes"]["fold_resize_dequantize"] == 1
    assert len(_dequantize_kernels(off)) == 1 and not _dequantize_kernels(on)
    assert len(on.inspect()["kernels"]) == len(off.inspect()["kernels"]) - 1
    resize = next(k for k in on.inspect()["kernels"] if k["op"] == "Resize")
    assert resize["primitive"] == "resampling" and not resize["impl"].startswith("ref")
    assert resize["dst_dtype"] == "f32" and resize["post_ops"], resize
    assert any("DequantizeLinear" in a for a in resize["absorbed"]), resize["absorbed"]
    assert not any(d["op"] == "DequantizeLinear" for d in on.inspect()["not_fused"])
    _same_in_every_mode(m, on, off)


def test_indices_onednn_does_not_share_run_the_reference_with_the_chain() -> None:
    # align_corners ×3: oneDNN's nearest reads other input elements (lower_resize.py table)
    m = _model(mode="align_corners", scales=(3.0, 3.0))
    on, off = compile_model(m), compile_model(m, composer=OFF)
    assert on.inspect()["passes"]["fold_resize_dequantize"] == 1
    resize = next(k for k in on.inspect()["kernels"] if k["op"] == "Resize")
    assert resize["impl"] == "numpy"
    feeds = _feeds(m)
    np.testing.assert_array_equal(on.run(feeds)["out"], off.run(feeds)["out"])


def test_not_folded_when_the_integer_resize_output_has_another_reader() -> None:
    m = _model(readers=2)
    on = compile_model(m)
    assert on.inspect()["passes"]["fold_resize_dequantize"] == 0
    feeds = _feeds(m)
    got, want = on.run(feeds), compile_model(m, composer=OFF).run(feeds)
    for name in ("out", "c2"):
        np.testing.assert_array_equal(got[name], want[name])


def test_a_requantization_after_the_resize_runs_in_the_conv_before_it() -> None:
    """Resize → DQ → Q in another scale (an FPN's Concat scale): the quantize moves before the
    nearest Resize (quantize_before_reshape), so the conv's kernel writes the requantized
    integers (its chain keeps both roundings) and the resampling moves bytes only; no
    requantize kernel and no fold here (PP-OCRv4 det NNCF: two such kernels of 0.1 ms before
    its FPN Concat). The fused and unfused modes agree bit for bit, and with the reference
    up to its float convolution's summation order."""
    m = _model(requantize=True)
    on = compile_model(m)
    passes = on.inspect()["passes"]
    assert passes["quantize_before_reshape"] == 1 and passes["fold_resize_dequantize"] == 0
    kernels = on.inspect()["kernels"]
    resize = next(k for k in kernels if k["op"] == "Resize")
    assert resize["primitive"] == "resampling" and not resize["impl"].startswith("ref")
    assert resize["src_dtype"] == resize["dst_dtype"] == "u8" and not resize["post_ops"]
    # the first conv's kernel (its last one without VNNI, which sums two halves) quantizes
    # twice: its own output, then into the Resize's consumer's scale
    assert any(sum(a.startswith("QuantizeLinear") for a in k["absorbed"]) == 2
               for k in kernels if k["op"] == "Conv"), kernels
    assert [k["op"] for k in kernels].count("QuantizeLinear") <= 1  # the input's only
    feeds = _feeds(m)
    got = on.run(feeds)["out"]
    np.testing.assert_array_equal(got, compile_model(m, mode="unfused").run(feeds)["out"])
    np.testing.assert_allclose(got, compile_model(m, mode="reference").run(feeds)["out"],
                               rtol=0, atol=1e-6)
