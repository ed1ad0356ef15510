"""Importing data-movement ops: index inputs read as constants and resolved, output shapes
equal to ONNX Runtime's."""

from __future__ import annotations

import numpy as np
import pytest
from island_helpers import assert_island
from onnx import TensorProto, helper
from onnx_builders import init, model, run_ort, single

from qfuse.compiler.api import compile_model
from qfuse.compiler.errors import MalformedModelError, QfuseError
from qfuse.compiler.onnx_import import import_model
from qfuse.ir import Graph, Node, Op
from qfuse.ir.ops import (
    AxesAttrs,
    AxisAttrs,
    PadAttrs,
    PadMode,
    ReshapeAttrs,
    ResizeMode,
    SplitAttrs,
    TransposeAttrs,
)

F, I64 = np.float32, np.int64


def only(g: Graph) -> Node:
    nodes = list(g)
    assert len(nodes) == 1, [str(n) for n in nodes]
    return nodes[0]


def check_against_ort(m: object, shape: tuple[int, ...]) -> Graph:
    """Import ``m`` and compare every output shape with ONNX Runtime's."""
    g = import_model(m)
    x = np.random.default_rng(0).standard_normal(shape).astype(F)
    for name, got in zip(g.outputs, run_ort(m, {"x": x}), strict=True):
        assert g.info(name).shape == got.shape, name
    return g


def test_concat_negative_axis() -> None:
    m = model([helper.make_node("Concat", ["x", "c"], ["y"], name="n", axis=-2)],
              {"x": ([2, 3, 4], TensorProto.FLOAT)}, ["y"], [init("c", np.zeros((2, 5, 4), F))])
    g = check_against_ort(m, (2, 3, 4))
    assert only(g).attrs == AxisAttrs(1) and only(g).inputs == ["x", "c"]


@pytest.mark.parametrize(("opset", "kw", "split", "n", "sizes"), [
    (13, {"axis": 1}, [2, 4], 2, (2, 4)),
    (11, {"axis": 1, "split": [1, 5]}, None, 2, (1, 5)),
    (13, {"axis": -1}, None, 3, (2, 2, 2)),
    (18, {"axis": 1, "num_outputs": 4}, None, 4, (2, 2, 2, 0)),
    (18, {"axis": 1, "num_outputs": 3}, None, 3, (2, 2, 2)),
])
def test_split_sizes(opset: int, kw: dict, split: list[int] | None, n: int,
                     sizes: tuple[int, ...]) -> None:
    inits = [init("s", np.array(split, I64))] if split else []
    m = single("Split", [3, 6], inits, opset=opset, n_outputs=n, **kw)
    if 0 in sizes:  # an empty output: native kernels take none, the island runs it
        assert_island(m, {"Split"}, r"^output 'y3' would be empty")
        return
    g = check_against_ort(m, (3, 6))
    assert only(g).attrs == SplitAttrs(1, sizes)


def test_split_uneven_num_outputs() -> None:
    m = single("Split", [7, 2], opset=18, n_outputs=3, axis=0, num_outputs=3)
    g = check_against_ort(m, (7, 2))
    assert only(g).attrs == SplitAttrs(0, (3, 3, 1))


SLICES = [
    # starts, ends, axes, steps
    ([1], [3], [0], None),
    ([-3], [1000], [1], None),
    ([-1000], [-2], [1], [2]),
    ([9], [-1000], [0], [-1]),
    ([-1], [0], [1], [-2]),
    ([0, 5], [2, 1], [-1, 0], [1, -2]),
    ([100], [200], [0], None),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice_resolves_negative_and_clamped_indices(starts: list[int], ends: list[int],
                                                     axes: list[int],
                                                     steps: list[int] | None) -> None:
    inits = [init("st", np.array(starts, I64)), init("en", np.array(ends, I64)),
             init("ax", np.array(axes, I64))]
    if steps:
        inits.append(init("sp", np.array(steps, I64)))
    m = single("Slice", [6, 8], inits, opset=13)
    if starts == [100]:
        assert_island(m, {"Slice"}, r"would be empty .*; native kernels take no empty tensors")
        return
    g = check_against_ort(m, (6, 8))
    attrs = only(g).attrs
    assert all(0 <= a < 2 for a in attrs.axes) and all(0 <= s for s in attrs.starts)
    # The resolved attributes mean the same with numpy slicing.
    x = np.arange(48).reshape(6, 8)
    index = [slice(None)] * 2
    for s, e, a, st in zip(attrs.starts, attrs.ends, attrs.axes, attrs.steps, strict=True):
        index[a] = slice(s, e, st)
    want = run_ort(m, {"x": x.astype(F)})[0]
    np.testing.assert_array_equal(x[tuple(index)].astype(F), want)


def test_slice_with_runtime_starts_is_an_island_of_run_time_shape() -> None:
    m = model([helper.make_node("Slice", ["x", "s", "e"], ["y"], name="sl")],
              {"x": ([4], TensorProto.FLOAT), "s": ([1], TensorProto.INT64)}, ["y"],
              [init("e", np.array([3], I64))], opset=13)
    x = np.arange(4, dtype=F)
    island = assert_island(m, {"Slice"}, r"^starts 's' must be a constant",
                           feeds={"x": x, "s": np.array([1], I64)})
    assert island.attrs.dynamic == (True,)
    for mode in ("reference", "fused"):
        compiled = compile_model(m, mode=mode)
        for start in (0, 2):
            got = compiled.run({"x": x, "s": np.array([start], I64)})["y"]
            np.testing.assert_array_equal(got, x[start:3])


@pytest.mark.parametrize(("target", "allowzero", "expected"), [
    ([0, -1], 0, (2, 12)), ([-1], 0, (24,)), ([2, 0, 2, 2], 0, (2, 3, 2, 2)),
    ([4, 3, 2], 1, (4, 3, 2)),
])
def test_reshape_zero_and_minus_one(target: list[int], allowzero: int,
                                    expected: tuple[int, ...]) -> None:
    m = single("Reshape", [2, 3, 4], [init("shape", np.array(target, I64))], opset=14,
               allowzero=allowzero)
    g = check_against_ort(m, (2, 3, 4))
    assert only(g).attrs == ReshapeAttrs(expected)


def test_reshape_errors() -> None:
    m = single("Reshape", [2, 3], [init("shape", np.array([-1, -1], I64))])
    with pytest.raises(MalformedModelError, match=r"'n' \(Reshape\): shape \[-1, -1\] has more"):
        import_model(m)
    m = single("Reshape", [2, 3], [init("shape", np.array([0, 6], I64))], opset=14, allowzero=1)
    compiled = compile_model(m, mode="reference")  # the importer declines it: an island
    with pytest.raises(QfuseError, match="island of Reshape .*onnxruntime"):
        compiled.run({"x": np.ones((2, 3), F)})  # 0·6 elements from 6: ORT refuses to run it


def test_flatten_and_transpose() -> None:
    g = check_against_ort(single("Flatten", [2, 3, 4, 5], axis=-1), (2, 3, 4, 5))
    assert only(g).attrs == AxisAttrs(3)
    g = check_against_ort(single("Transpose", [2, 3, 4]), (2, 3, 4))
    assert only(g).attrs == TransposeAttrs((2, 1, 0))


@pytest.mark.parametrize(("op_type", "opset", "axes", "shape", "expected"), [
    ("Squeeze", 11, [0, -1], (1, 3, 1), (0, 2)),
    ("Squeeze", 13, [2], (1, 3, 1), (2,)),
    ("Squeeze", 13, None, (1, 3, 1), (0, 2)),
    ("Unsqueeze", 11, [0, -1], (2, 3), (0, 3)),
    ("Unsqueeze", 13, [1], (2, 3), (1,)),
])
def test_squeeze_unsqueeze_axes_from_attribute_or_input(op_type: str, opset: int,
                                                        axes: list[int] | None,
                                                        shape: tuple[int, ...],
                                                        expected: tuple[int, ...]) -> None:
    if opset >= 13 and axes is not None:
        m = single(op_type, list(shape), [init("axes", np.array(axes, I64))], opset=opset)
    elif axes is not None:
        m = single(op_type, list(shape), opset=opset, axes=axes)
    else:
        m = single(op_type, list(shape), opset=opset)
    g = check_against_ort(m, shape)
    assert only(g).attrs == AxesAttrs(expected)


@pytest.mark.parametrize(("mode", "value", "axes"), [
    ("constant", 1.5, None), ("reflect", None, None), ("edge", None, [-1]),
    ("constant", None, [0, 2]),
])
def test_pad(mode: str, value: float | None, axes: list[int] | None) -> None:
    n_axes = 3 if axes is None else len(axes)
    pads = [0, 1, 2, 0, 2, 1][:n_axes] + [1, 0, 2, 1, 0, 1][:n_axes]
    inits = [init("pads", np.array(pads, I64))]
    names = ["x", "pads"]
    if value is not None or axes is not None:
        if value is None:
            names.append("")
        else:
            inits.append(init("v", np.array(value, F)))
            names.append("v")
    if axes is not None:
        inits.append(init("axes", np.array(axes, I64)))
        names.append("axes")
    m = single("Pad", [2, 3, 4], inits, inputs=names, opset=18, mode=mode)
    g = check_against_ort(m, (2, 3, 4))
    attrs = only(g).attrs
    assert isinstance(attrs, PadAttrs) and attrs.mode is PadMode(mode)
    assert len(attrs.pads) == 6 and attrs.value == (value or 0.0)


def test_pad_value_dequantized_from_a_constant() -> None:
    """quantize_static quantizes Pad's constant_value as a weight (EfficientViT pads v with a
    column of ones): a DequantizeLinear of constants, read at import, not an island."""
    nodes = [helper.make_node("DequantizeLinear", ["vq", "vs", "vz"], ["v"]),
             helper.make_node("Pad", ["x", "pads", "v"], ["y"], mode="constant")]
    m = model(nodes, {"x": ([1, 2, 3, 4], TensorProto.FLOAT)}, ["y"],
              [init("pads", np.array([0, 0, 0, 0, 0, 0, 0, 1], I64)),
               init("vq", np.array(254, np.uint8)), init("vs", np.array(1 / 127, F)),
               init("vz", np.array(0, np.uint8))], opset=18)
    pad = [n for n in check_against_ort(m, (1, 2, 3, 4)).topo_order() if n.op is Op.PAD]
    assert len(pad) == 1 and pad[0].attrs.value == np.float32(254) * np.float32(1 / 127)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(F)
    for mode in ("fused", "reference"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"],
                                      run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_pad_by_nothing_is_an_identity(mode: str) -> None:
    """torchvision's Swin pads each stage to a multiple of its window, by 0 at 224x224."""
    m = single("Pad", [1, 7, 7, 8], [init("pads", np.zeros(8, I64))], opset=18, mode=mode)
    g = check_against_ort(m, (1, 7, 7, 8))
    assert only(g).op is Op.IDENTITY
    x = np.random.default_rng(0).standard_normal((1, 7, 7, 8)).astype(F)
    for mode_ in ("reference", "fused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode_).run({"x": x})["y"], x)


@pytest.mark.parametrize(("x_shape", "shape", "out"), [
    ((4, 3, 1), [4, 3, 5], (4, 3, 5)),
    ((3, 1), [2, 1, 6], (2, 3, 6)),  # bidirectional: the requested 1 keeps x's 3
    ((1, 5), [5], (1, 5)),  # nothing to expand: an Identity
    ((1, 8, 1, 1), [1, 8, 5, 6], (1, 8, 5, 6)),  # a channel gate to the image (ECA-Net)
    ((6,), [2, 3, 6], (2, 3, 6)),  # new leading dims
])
def test_expand_is_a_native_broadcast(x_shape: tuple[int, ...], shape: list[int],
                                      out: tuple[int, ...]) -> None:
    """Expand with a constant shape is the IR's Expand (no onnxruntime island), its output
    shape ONNX's broadcast; every mode computes what onnxruntime does, bit for bit."""
    m = single("Expand", list(x_shape), [init("shape", np.array(shape, I64))])
    g = check_against_ort(m, x_shape)
    assert only(g).op is (Op.IDENTITY if out == x_shape else Op.EXPAND)
    assert g.info("y").shape == out
    x = np.random.default_rng(0).standard_normal(x_shape).astype(F)
    want = run_ort(m, {"x": x})[0]
    for mode in ("reference", "fused", "unfused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"], want)
    # a jit reorder from a stride-0 view of x (lower_misc.lower_expand), no numpy kernel
    assert [k["impl"] for k in compile_model(m).inspect()["kernels"]
            if k["impl"] == "numpy"] == []


def test_expand_to_an_incompatible_shape_is_malformed() -> None:
    m = single("Expand", [4, 3], [init("shape", np.array([4, 5], I64))])
    with pytest.raises(MalformedModelError, match="does not broadcast"):
        import_model(m)


@pytest.mark.parametrize(("x_shape", "repeats"), [
    ((1, 3, 4, 5), [2, 1, 1, 1]),  # GCViT's global query tokens, one copy per window
    ((1, 3, 4, 5), [1, 2, 3, 1]),
    ((2, 3), [3, 2]),
    ((1, 3, 4, 5), [1, 1, 1, 1]),
])
def test_tile_is_a_native_broadcast(x_shape: tuple[int, ...], repeats: list[int]) -> None:
    """Tile with constant repeats is x viewed with a size-1 dim before each repeated one, an
    Expand there and a Reshape merging the pairs (no onnxruntime island); every mode computes
    what onnxruntime does, bit for bit, with no numpy kernel."""
    m = single("Tile", list(x_shape), [init("repeats", np.array(repeats, I64))])
    g = check_against_ort(m, x_shape)
    ops = sorted(n.op.name for n in g)
    assert ops == (["IDENTITY"] if set(repeats) == {1} else ["EXPAND", "RESHAPE", "RESHAPE"])
    x = np.random.default_rng(0).standard_normal(x_shape).astype(F)
    want = run_ort(m, {"x": x})[0]
    np.testing.assert_array_equal(want, np.tile(x, repeats))
    for mode in ("reference", "fused", "unfused"):
        np.testing.assert_array_equal(compile_model(m, mode=mode).run({"x": x})["y"], want)
    assert [k["impl"] for k in compile_model(m).inspect()["kernels"]
            if k["impl"] == "numpy"] == []


def test_tile_with_a_wrong_repeat_count_is_malformed() -> None:
    m = single("Tile", [4, 3], [init("repeats", np.array([2], I64))])
    with pytest.raises(MalformedModelError, match="1 repeats for an input of rank 2"):
        import_model(m)


def test_pad_wrap_is_unsupported() -> None:
    m = single("Pad", [2, 3], [init("pads", np.array([0, 1, 0, 1], I64))], opset=19, mode="wrap")
    assert_island(m, {"Pad"}, r"^mode 'wrap'")


@pytest.mark.parametrize(("kw", "scales", "sizes"), [
    ({"mode": "nearest"}, [1, 1, 2, 2], None),
    ({"mode": "nearest", "nearest_mode": "floor",
      "coordinate_transformation_mode": "asymmetric"}, [1, 1, 1.5, 0.5], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 7, 9]),
    ({"mode": "linear"}, [1, 1, 2.5, 1.7], None),
    ({"mode": "nearest", "axes": [2, 3]}, [3, 2], None),
    ({"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"}, None,
     [20, 9]),
])
def test_resize_static_sizes(kw: dict, scales: list[float] | None,
                             sizes: list[int] | None) -> None:
    inits, names = [], ["x", ""]
    if scales is not None:
        inits.append(init("scales", np.array(scales, F)))
        names.append("scales")
    else:
        names += ["", "sizes"]
        inits.append(init("sizes", np.array(sizes, I64)))
    m = single("Resize", [1, 2, 5, 6], inits, inputs=names, opset=19, **kw)
    g = check_against_ort(m, (1, 2, 5, 6))
    attrs = only(g).attrs
    assert attrs.mode is ResizeMode(kw["mode"]) and len(attrs.scales) == 4
    assert attrs.coordinate_transformation_mode == kw.get("coordinate_transformation_mode",
                                                          "half_pixel")


def test_resize_opset11_empty_scales_with_sizes() -> None:
    inits = [init("roi", np.zeros(0, F)), init("scales", np.zeros(0, F)),
             init("sizes", np.array([1, 2, 10, 12], I64))]
    m = single("Resize", [1, 2, 5, 6], inits, opset=11, mode="nearest")
    g = check_against_ort(m, (1, 2, 5, 6))
    assert only(g).attrs.sizes == (1, 2, 10, 12) and only(g).attrs.scales == (1, 1, 2, 2)


@pytest.mark.parametrize("kw", [{}, {"cubic_coeff_a": -0.5, "exclude_outside": 1,
                                      "coordinate_transformation_mode": "align_corners"}])
def test_resize_cubic(kw: dict) -> None:
    m = single("Resize", [1, 2, 5, 6], [init("scales", np.array([1, 1, 2, 1.5], F))],
               inputs=["x", "", "scales"], opset=13, mode="cubic", **kw)
    attrs = only(check_against_ort(m, (1, 2, 5, 6))).attrs
    assert attrs.mode is ResizeMode.CUBIC and attrs.sizes == (1, 2, 10, 9)
    assert attrs.cubic_coeff_a == kw.get("cubic_coeff_a", -0.75)
    assert attrs.exclude_outside is bool(kw.get("exclude_outside", 0))


def test_resize_cubic_of_channels_is_unsupported() -> None:
    """qfuse's cubic is ONNX Runtime's bicubic kernel over the last two dims; ORT's other
    one (N, H, W, C: dims 1-2) stays ONNX, an island ORT runs."""
    m = single("Resize", [1, 4, 4, 2], [init("scales", np.array([1, 2, 2, 1], F))],
               inputs=["x", "", "scales"], opset=13, mode="cubic")
    assert_island(m, {"Resize"}, r"^cubic of rank 4 with scales")
