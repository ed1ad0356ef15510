"""In-place Concat (compiler/lower/in_place_concat.py): producers write into the Concat's
output, the concat kernel goes; every output bit-exact against the same plan with the
mechanism off (composer option ``in_place_concat``), from many threads, on garbage buffers."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import CompiledModel, compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.execution import ExecutionContext
from tests.compiler.onnx_builders import init, model

OFF = ComposerOptions().without("in_place_concat")


def _both(m: onnx.ModelProto, *without: str) -> tuple[CompiledModel, CompiledModel]:
    """``m`` compiled with in-place concats and without, and both without ``without``."""
    on = ComposerOptions().without(*without)
    return compile_model(m, composer=on), compile_model(m, composer=on.without("in_place_concat"))


def _float_concat(batch: int = 1, reread: bool = False) -> onnx.ModelProto:
    """Relu(x) and Sigmoid(x) concatenated along channels (row-major f32), then Tanh."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Tanh", ["c"], ["y"])]
    outputs = ["y"]
    if reread:  # 'a' is read again after the concat (x too: no eltwise runs in place on it)
        nodes.append(helper.make_node("Mul", ["a", "x"], ["z"]))
        outputs.append("z")
    return model(nodes, {"x": ([batch, 4, 5, 6], TensorProto.FLOAT)}, outputs)


def _qdq(name: str, value: str, scale: float, zp: int) -> tuple[list[onnx.NodeProto], list]:
    inits = [init(f"{name}_s", np.float32(scale)), init(f"{name}_z", np.uint8(zp))]
    nodes = [helper.make_node("QuantizeLinear", [value, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                              [f"{name}_dq"])]
    return nodes, inits


def _int8_head(same_scale: bool) -> onnx.ModelProto:
    """YOLOv8's detection head in small: two int8 convolutions (channels-last), each
    Reshape'd to (1, C, H·W), concatenated along the last axis and quantized. ``same_scale``:
    the first conv's output scale is the concat's (no requantize; its Reshape view of the
    conv's output goes in place)."""
    rng = np.random.default_rng(3)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    concat_scale = 0.07
    branches = []
    for i, (size, scale) in enumerate([(6, concat_scale if same_scale else 0.05), (3, 0.09)]):
        w = rng.integers(-60, 60, size=(8, 4, 3, 3)).astype(np.int8)
        inits += [init(f"w{i}", w), init(f"w{i}_s", np.float32(0.01)),
                  init(f"w{i}_z", np.int8(0)),
                  init(f"b{i}", rng.normal(0, 0.5, 8).astype(np.float32)),
                  init(f"shape{i}", np.array([1, 8, size * size], np.int64))]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}_s", f"w{i}_z"],
                                   [f"w{i}_dq"]),
                  helper.make_node("Conv", ["x_dq", f"w{i}_dq", f"b{i}"], [f"conv{i}"],
                                   pads=[1, 1, 1, 1], strides=[1 + i, 1 + i])]
        q_nodes, q_inits = _qdq(f"c{i}", f"conv{i}", scale, 100 + 10 * i)
        nodes += q_nodes + [helper.make_node("Reshape", [f"c{i}_dq", f"shape{i}"],
                                             [f"r{i}"])]
        inits += q_inits
        branches.append(f"r{i}")
    nodes.append(helper.make_node("Concat", branches, ["cat"], axis=2))
    q_nodes, q_inits = _qdq("cat", "cat", concat_scale, 120)
    nodes += q_nodes
    inits += q_inits
    return model(nodes, {"x": ([1, 4, 6, 6], TensorProto.FLOAT)}, ["cat_dq"], inits)


def _concats(m: CompiledModel) -> list[dict]:
    return m.plan.notes["concats"]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _kinds(m: CompiledModel) -> list[str]:
    return [k.kind for k in m.plan.kernels]


@pytest.mark.parametrize("same_scale", [False, True])
def test_int8_head_concat_in_place_is_bit_exact(same_scale: bool) -> None:
    on, off = _both(_int8_head(same_scale))
    assert "concat" in _kinds(off) and "concat" not in _kinds(on)
    # the requantizes read Reshape views of channels-last tensors (layouts.nocopy_strides)
    assert not [k.name for k in on.plan.kernels if "ref" in k.impl]
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    assert on.plan.notes["in_place_concats"] == 1
    [placed] = _concats(on)
    assert placed["in_place"] == [0, 1] and placed["removed"]
    for seed in range(4):
        feeds = random_inputs(on, seed=seed)
        assert _same(on.run(feeds), off.run(feeds))
        # and every value the plan materializes, the concat's output included
        everything, reference = on.run_all(feeds), off.run_all(feeds)
        assert "cat_dq" in everything
        shared = everything.keys() & reference.keys()
        assert len(shared) >= 5
        assert all(np.array_equal(everything[k], reference[k]) for k in shared)


def test_inspect_says_how_each_input_reaches_the_output() -> None:
    on = compile_model(_int8_head(same_scale=False))
    [report] = on.inspect()["concats"]
    assert report["in_place"]
    assert [i["bytes"] for i in report["inputs"]] == ["written in place by its producer"] * 2
    assert all("requantized" in i["scale"] for i in report["inputs"])
    off = compile_model(_int8_head(same_scale=False), composer=OFF)
    [report] = off.inspect()["concats"]
    assert not report["in_place"]
    assert all(i["bytes"].startswith("copied by the concat kernel") for i in report["inputs"])


def test_float_channel_concat_in_place() -> None:
    on, off = _both(_float_concat())
    assert on.plan.notes["in_place_concats"] == 1
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    feeds = random_inputs(on, seed=1)
    assert _same(on.run(feeds), off.run(feeds))


def test_batch_of_two_stays_a_concat_and_says_why() -> None:
    on, _ = _both(_float_concat(batch=2))
    assert on.plan.notes["in_place_concats"] == 0
    assert "concat" in _kinds(on)
    [placed] = _concats(on)
    assert all("not contiguous" in r for r in placed["reasons"].values())


def test_input_read_after_the_concat_is_not_moved() -> None:
    on, off = _both(_float_concat(reread=True))
    [placed] = _concats(on)
    assert "read again after the concat" in placed["reasons"][0]
    feeds = random_inputs(on, seed=2)
    assert _same(on.run(feeds), off.run(feeds))
    # 'b' is placed; 'a' (read by the Add afterwards) is copied into its region by a reorder
    assert placed["in_place"] == [1] and placed["copied"] == [0]
    assert "concat" not in _kinds(on)


def test_in_place_views_do_not_depend_on_prior_buffer_contents() -> None:
    on = compile_model(_int8_head(same_scale=True))
    feeds = random_inputs(on, seed=5)
    want = on.run(feeds)
    for fill in (0xFF, 0x5A):
        context = ExecutionContext(on.plan, fill=fill)
        for name, view in context.inputs:
            np.copyto(view, feeds[name])
        context.run()
        assert _same({n: v.copy() for n, v in context.outputs}, want)


def test_threads_share_the_plan_not_the_views() -> None:
    """Many threads run one model with in-place concats at once; each call's views are its
    own context's buffers, so every output equals the serial run of its inputs."""
    on = compile_model(_int8_head(same_scale=False))
    feeds = [random_inputs(on, seed=s) for s in range(6)]
    serial = [on.run(f) for f in feeds]
    bad: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(index: int) -> None:
        try:
            start.wait()
            for run in range(30):
                which = (run + index) % len(feeds)
                if not _same(on.run(feeds[which]), serial[which]):
                    bad.append(f"thread {index} run {run}")
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert not bad, bad[:5]
    assert on.executor.contexts >= 1


def _channels_last_concat(channels: int, size: tuple[int, int]) -> onnx.ModelProto:
    """Four int8 convolutions of ``channels`` outputs each (channels-last), quantized with
    one scale, concatenated along channels and read by another int8 convolution: PP-OCRv4
    det's FPN concat in small."""
    rng = np.random.default_rng(7)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    branches = []
    for i in range(4):
        w = rng.integers(-60, 60, size=(channels, 8, 1, 1)).astype(np.int8)
        inits += [init(f"w{i}", w), init(f"w{i}_s", np.float32(0.01)),
                  init(f"w{i}_z", np.int8(0)), init(f"b{i}", rng.normal(0, 1, channels)
                                                     .astype(np.float32))]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}_s", f"w{i}_z"],
                                   [f"w{i}_dq"]),
                  helper.make_node("Conv", ["x_dq", f"w{i}_dq", f"b{i}"], [f"conv{i}"])]
        q_nodes, q_inits = _qdq(f"c{i}", f"conv{i}", 0.05, 128)
        nodes += q_nodes
        inits += q_inits
        branches.append(f"c{i}_dq")
    nodes.append(helper.make_node("Concat", branches, ["cat"], axis=1))
    w = rng.integers(-60, 60, size=(8, 4 * channels, 1, 1)).astype(np.int8)
    inits += [init("wy", w), init("wy_s", np.float32(0.01)), init("wy_z", np.int8(0))]
    nodes += [helper.make_node("DequantizeLinear", ["wy", "wy_s", "wy_z"], ["wy_dq"]),
              helper.make_node("Conv", ["cat", "wy_dq"], ["y"])]
    return model(nodes, {"x": ([1, 8, *size], TensorProto.FLOAT)}, ["y"], inits)


def _agree_saturated(on: CompiledModel, off: CompiledModel, value: str) -> None:
    """``on`` and ``off`` give the same outputs and the same values of everything both
    materialize, ``value`` among them, on inputs that saturate (every byte value occurs)."""
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        feeds["x"] *= 40
        assert _same(on.run(feeds), off.run(feeds))
        everything, reference = on.run_all(feeds), off.run_all(feeds)
        shared = everything.keys() & reference.keys()
        assert value in shared and len(shared) >= 6
        assert all(np.array_equal(everything[k], reference[k]) for k in shared)


def test_channels_last_concat_is_copied_as_words() -> None:
    """Inputs of 24 s8 channels (6 words a pixel) over 48x40 pixels: four s32 reorders into
    the output's regions replace oneDNN's concat kernel, every value bit-exact."""
    on, off = _both(_channels_last_concat(24, (48, 40)))
    assert "concat" in _kinds(off) and "concat" not in _kinds(on)
    [placed] = _concats(on)
    assert placed["removed"] and placed["words"] and placed["copied"] == [0, 1, 2, 3]
    copies = [k for k in on.plan.kernels if k.info.op == "Concat"]
    assert [k.kind for k in copies] == ["reorder"] * 4
    assert all(on.plan.slots[k.reads[0]].md.dtype.name == "s32" for k in copies)
    assert not [k.name for k in copies if "ref" in k.impl]
    [report] = on.inspect()["concats"]
    assert all("4-byte words" in i["bytes"] for i in report["inputs"])
    _agree_saturated(on, off, "cat_q")  # every byte value crosses the concat


@pytest.mark.parametrize("channels", [24, 6])
def test_channels_last_concat_kernel_stays(channels: int) -> None:
    """Fewer pixels than WORD_COPY_RUNS: the concat kernel is as fast, words or not."""
    on, off = _both(_channels_last_concat(channels, (24, 20)))
    assert "concat" in _kinds(on)
    assert len(on.plan.kernels) == len(off.plan.kernels)
    feeds = random_inputs(on, seed=1)
    assert _same(on.run(feeds), off.run(feeds))


def _interleave() -> onnx.ModelProto:
    """EVA-02's rotary embedding in small: ``stack((-x, x), -1)`` of an int8 tensor, an
    interleave of 1-byte runs along a new last axis."""
    nodes, inits = _qdq("x", "x", 0.02, 128)
    nodes.append(helper.make_node("Neg", ["x_dq"], ["n"]))
    q_nodes, q_inits = _qdq("n", "n", 0.02, 128)
    nodes += q_nodes + [helper.make_node("Unsqueeze", ["n_dq", "last"], ["nu"]),
                        helper.make_node("Unsqueeze", ["x_dq", "last"], ["xu"]),
                        helper.make_node("Concat", ["nu", "xu"], ["cat"], axis=4)]
    c_nodes, c_inits = _qdq("cat", "cat", 0.02, 128)
    inits += q_inits + c_inits + [init("last", np.array([4], np.int64))]
    return model(nodes + c_nodes, {"x": ([1, 3, 64, 32], TensorProto.FLOAT)}, ["cat_dq"],
                 inits)


@pytest.mark.parametrize("build, value", [
    (lambda: _channels_last_concat(6, (48, 40)), "cat_q"),  # 6-byte runs
    (_interleave, "nu_q")])  # 1-byte runs
def test_short_runs_are_copied_by_reorders_of_their_type(build, value: str) -> None:
    """Runs that are not whole words, over more pixels than WORD_COPY_RUNS: one jit reorder
    per input in its own data type into its strided region replaces the concat kernel
    (which copies run by run: 109 against 12 us for EVA-02's interleave), bit-exact."""
    on, off = _both(build())
    assert "concat" in _kinds(off) and "concat" not in _kinds(on)
    [placed] = _concats(on)
    assert placed["removed"] and not placed["words"] and placed["in_place"] == []
    copies = [k for k in on.plan.kernels if k.info.op == "Concat"]
    assert len(copies) == len(placed["copied"]) >= 2
    assert all(k.kind == "reorder" and k.impl.startswith("jit") for k in copies)
    assert {on.plan.slots[k.reads[0]].md.dtype.name for k in copies} <= {"u8", "s8"}
    _agree_saturated(on, off, value)


def fpn_concat(requantize: bool) -> onnx.ModelProto:
    """An FPN's top-down merge in small: a half-size int8 map (conv, stride 2) enlarged by a
    nearest Resize x2 and concatenated with a full-size one along channels (24 each, so 6
    words a pixel), then read by an int8 conv. ``requantize``: the Resize's output is
    quantized again in another scale (NNCF's PP-OCRv4 det), else it keeps its input's."""
    rng = np.random.default_rng(11)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    for i, stride in enumerate((2, 1)):
        w = rng.integers(-60, 60, size=(24, 8, 1, 1)).astype(np.int8)
        inits += [init(f"w{i}", w), init(f"w{i}_s", np.float32(0.01)),
                  init(f"w{i}_z", np.int8(0)), init(f"b{i}", rng.normal(0, 1, 24)
                                                     .astype(np.float32))]
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}_s", f"w{i}_z"],
                                   [f"w{i}_dq"]),
                  helper.make_node("Conv", ["x_dq", f"w{i}_dq", f"b{i}"], [f"conv{i}"],
                                   strides=[stride, stride])]
        q_nodes, q_inits = _qdq(f"c{i}", f"conv{i}", 0.05 + 0.02 * i, 128)
        nodes += q_nodes
        inits += q_inits
    inits += [init("scales", np.array([1, 1, 2, 2], np.float32))]
    nodes.append(helper.make_node("Resize", ["c0_dq", "", "scales"], ["up"], mode="nearest",
                                  coordinate_transformation_mode="asymmetric",
                                  nearest_mode="floor"))
    up = "up"
    if requantize:
        q_nodes, q_inits = _qdq("u", "up", 0.09, 120)
        nodes += q_nodes
        inits += q_inits
        up = "u_dq"
    nodes.append(helper.make_node("Concat", [up, "c1_dq"], ["cat"], axis=1))
    w = rng.integers(-60, 60, size=(8, 48, 1, 1)).astype(np.int8)
    inits += [init("wy", w), init("wy_s", np.float32(0.01)), init("wy_z", np.int8(0))]
    nodes += [helper.make_node("DequantizeLinear", ["wy", "wy_s", "wy_z"], ["wy_dq"]),
              helper.make_node("Conv", ["cat", "wy_dq"], ["y"])]
    return model(nodes, {"x": ([1, 8, 48, 40], TensorProto.FLOAT)}, ["y"], inits)


@pytest.mark.parametrize("requantize", [False, True])
def test_nearest_resize_writes_into_the_concat(requantize: bool) -> None:
    """The Resize moves bytes only (its requantize, if any, moved before it by
    quantize_before_reshape and absorbed by the conv's kernel): one s32 reorder repeating its
    source writes its region of the concat's output; no resampling kernel, no copy of it."""
    on, off = _both(fpn_concat(requantize))
    [placed] = _concats(on)
    assert placed["moved"] == [0] and placed["copied"] == [1] and placed["removed"]
    [resize] = [k for k in on.plan.kernels if k.info.op == "Resize"]
    assert resize.kind == "reorder" and "ref" not in resize.impl
    assert on.plan.slots[resize.reads[0]].md.strides[3] == 0  # a stride-0 (repeating) view
    assert "resampling" in _kinds(off) and "concat" in _kinds(off)
    assert len(on.plan.kernels) == len(off.plan.kernels)  # the copy replaces the concat
    [report] = on.inspect()["concats"]
    assert "nearest Resize" in report["inputs"][0]["bytes"]
    _agree_saturated(on, off, "up_q" if not requantize else "u_q")  # the Resize's output


def _split_concat() -> onnx.ModelProto:
    """YOLOv8's C2f block in small (NNCF: one scale): an int8 conv's output split in two
    halves of 24 channels, the second read by another conv, and the halves and that conv's
    output concatenated along channels."""
    rng = np.random.default_rng(13)
    nodes, inits = _qdq("x", "x", 0.02, 128)
    for name, (cin, cout) in {"w0": (8, 48), "w1": (24, 24), "wy": (72, 8)}.items():
        inits += [init(name, rng.integers(-60, 60, size=(cout, cin, 1, 1)).astype(np.int8)),
                  init(f"{name}_s", np.float32(0.01)), init(f"{name}_z", np.int8(0))]
        nodes.append(helper.make_node("DequantizeLinear", [name, f"{name}_s", f"{name}_z"],
                                      [f"{name}_dq"]))
    inits.append(init("split", np.array([24, 24], np.int64)))
    nodes.append(helper.make_node("Conv", ["x_dq", "w0_dq"], ["conv0"]))
    q_nodes, q_inits = _qdq("c0", "conv0", 0.05, 128)
    nodes += q_nodes + [helper.make_node("Split", ["c0_dq", "split"], ["a", "b"], axis=1),
                        helper.make_node("Conv", ["b", "w1_dq"], ["conv1"])]
    inits += q_inits
    q_nodes, q_inits = _qdq("c1", "conv1", 0.05, 128)
    nodes += q_nodes + [helper.make_node("Concat", ["a", "b", "c1_dq"], ["cat"], axis=1),
                        helper.make_node("Conv", ["cat", "wy_dq"], ["y"])]
    inits += q_inits
    return model(nodes, {"x": ([1, 8, 48, 40], TensorProto.FLOAT)}, ["y"], inits)


def test_split_part_is_copied_straight_into_the_concat() -> None:
    """The first half is read by the concat only: its Split reorder writes the concat's
    region itself (as words); the second half, also read by the conv, and the conv's output
    are copied by reorders. Bit-exact, one kernel fewer than the concat kernel's plan.
    (merge_split_concat, off here, reads both halves as one slice of the Split's source.)"""
    on, off = _both(_split_concat(), "merge_split_concat")
    [placed] = _concats(on)
    assert placed["moved"] == [0] and placed["copied"] == [1, 2] and placed["words"]
    [part] = [k for k in on.plan.kernels if "straight into its region" in k.info.note]
    assert part.info.op == "Split" and part.kind == "reorder"
    assert on.plan.slots[part.reads[0]].md.dtype.name == "s32"  # as 4-byte words
    assert len(on.plan.kernels) == len(off.plan.kernels) + 1  # 1 concat -> 2 copies
    _agree_saturated(on, off, "a_q")


def test_the_output_is_read_back_once_every_input_is_in() -> None:
    """``run_all`` reads a concat's output after its last input is written: a reader of one
    input's region in between, through a view of it (here a Softmax of the first input
    Reshape'd, EfficientViT-M's heads), does not read the output."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Reshape", ["a", "flat"], ["af"]),
             helper.make_node("Softmax", ["af"], ["z"], axis=-1),
             helper.make_node("Sigmoid", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Exp", ["c"], ["y"])]
    on, off = _both(model(nodes, {"x": ([1, 4, 5, 6], TensorProto.FLOAT)}, ["y", "z"],
                          [init("flat", np.array([1, 4, 30], np.int64))]))
    [placed] = _concats(on)
    assert placed["in_place"] == [0, 1]
    feeds = random_inputs(on, seed=3)
    everything, reference = on.run_all(feeds), off.run_all(feeds)
    np.testing.assert_array_equal(everything["c"], reference["c"])
