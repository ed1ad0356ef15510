"""An int8 depthwise convolution with an s8 source (NNCF) or a source zero point
(quantize_static) that oneDNN runs on jit_int8 runs on brdgmm over its source copied into a
buffer padded with the zero level (compiler/lower/padded_depthwise.py): bit-identical to the
zero-point form, the border kept from run to run, every context its own buffer."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from qfuse.runtime.execution import ExecutionContext
from tests.compiler.onnx_builders import init, model

F32 = np.float32
OFF = ComposerOptions().without("padded_depthwise")


def _depthwise(channels: int, kernel: int, size: int, *, stride: int = 1,
               pads: tuple[int, int, int, int] | None = None, dilation: int = 1,
               src: type = np.int8, src_zero: int = 0, dst: type = np.int8, dst_zero: int = 0,
               batch: int = 1):
    rng = np.random.default_rng(channels * kernel + size)
    pads = pads or (kernel // 2 * dilation,) * 4
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], name="dw", group=channels,
                              strides=[stride] * 2, pads=list(pads), dilations=[dilation] * 2),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    inits = [init("xs", F32(0.02)), init("xz", src(src_zero)),
             init("w", rng.integers(-127, 128, (channels, 1, kernel, kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.0005, 0.002, channels).astype(F32)),
             init("b", rng.normal(0, 0.3, channels).astype(F32)),
             init("ys", F32(0.03)), init("yz", dst(dst_zero))]
    return model(nodes, {"x": ((batch, channels, size, size), TensorProto.FLOAT)}, ["y"],
                 inits, opset=13)


def _kernels(compiled, node: str = "dw") -> list[dict]:
    return [k for k in compiled.inspect()["kernels"] if k["node"] == node]


def _conv(compiled) -> dict:
    [conv] = [k for k in _kernels(compiled) if k["primitive"] == "convolution"]
    return conv


def _fast_form_exists(plain: dict) -> bool:
    """oneDNN has brdgmm on this ISA (AVX-512 VNNI, AMX) and chose jit_int8 for the
    zero-point form."""
    return plain["impl"].startswith("jit_int8") and "avx512" in plain["impl"]


CASES = {  # the model, and whether brdgmm takes it padded
    "s8, 7x7 (StarNet, NNCF)": (dict(channels=24, kernel=7, size=48), True),
    "u8 zero point, 5x5, stride 2, uneven pads": (dict(
        channels=40, kernel=5, size=96, stride=2, pads=(2, 1, 1, 2), src=np.uint8,
        src_zero=7, dst=np.uint8), True),
    "u8 zero point, dst zero point": (dict(
        channels=24, kernel=5, size=48, src=np.uint8, src_zero=130, dst=np.uint8,
        dst_zero=60), True),
    "s8, batch of 2": (dict(channels=72, kernel=5, size=48, batch=2), True),
    "dilation 2 (brdgmm takes none)": (dict(
        channels=24, kernel=5, size=48, dilation=2, src=np.uint8, src_zero=130), False),
}


@pytest.mark.parametrize("case", CASES)
def test_padded_form_is_bit_exact(case: str) -> None:
    shape, taken = CASES[case]
    m = _depthwise(**shape)
    padded, plain = compile_model(m), compile_model(m, composer=OFF)
    conv, before = _conv(padded), _conv(plain)
    if taken and _fast_form_exists(before):
        assert conv["impl"].startswith("brdgmm"), conv
        assert "padded_depthwise" in conv["optimizations"]
        assert conv["src_layouts"][0].startswith("u8") and not conv["zero_points_masks"]
        assert "padded explicitly with the zero level" in conv["note"]
        copies = [k for k in padded.inspect()["kernels"] if k["primitive"] == "reorder"
                  and "padded with its zero level" in k.get("note", "")]
        assert len(copies) == 1 and copies[0]["dst_layouts"][0].startswith("u8")
    else:
        assert "padded_depthwise" not in conv["optimizations"]
    for seed in range(3):  # one compiled model, runs in a row: the border stays
        feeds = random_inputs(padded, seed=seed)
        np.testing.assert_array_equal(padded.run(feeds)["y"], plain.run(feeds)["y"])


@pytest.mark.parametrize("shape", [
    dict(channels=32, kernel=7, size=48),  # a multiple of 16: jit_int8 is fast
    dict(channels=24, kernel=3, size=48),  # 3x3: the copy costs what brdgmm saves
    dict(channels=24, kernel=7, size=20),  # a small map
    dict(channels=24, kernel=7, size=48, src=np.uint8),  # u8 without zero point: brdgmm
])
def test_declined_where_it_does_not_pay(shape: dict) -> None:
    conv = _conv(compile_model(_depthwise(**shape)))
    assert "padded_depthwise" not in conv["optimizations"]
    assert not conv["src_layouts"][0].startswith(f"u8 (1, {shape['channels']}, "
                                                 f"{shape['size'] + shape['kernel'] - 1}")


def test_a_residual_sum_keeps_the_zero_point_form() -> None:
    """brdgmm_dw takes no sum post-op: a depthwise convolution summing a residual stays on
    its zero-point form (the padded attempt is undone: no copy, no padded buffer)."""
    rng = np.random.default_rng(5)
    channels, kernel = 24, 5
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="dw", group=channels,
                              pads=[2] * 4),
             helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"]),
             helper.make_node("Add", ["cd", "rd"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    inits = [init("xs", F32(0.02)), init("xz", np.uint8(121)), init("rs", F32(0.03)),
             init("rz", np.uint8(130)),
             init("w", rng.integers(-127, 128, (channels, 1, kernel, kernel)).astype(np.int8)),
             init("ws", rng.uniform(0.0005, 0.002, channels).astype(F32)),
             init("cs", F32(0.04)), init("cz", np.uint8(125)), init("ys", F32(0.05)),
             init("yz", np.uint8(128))]
    shape = (1, channels, 48, 48)
    m = model(nodes, {"x": (shape, TensorProto.FLOAT), "r": (shape, TensorProto.FLOAT)},
              ["y"], inits, opset=13)
    padded, plain = compile_model(m), compile_model(m, composer=OFF)
    conv = _conv(padded)
    assert "sum" in conv["post_ops"] and "padded_depthwise" not in conv["optimizations"]
    assert conv["impl"] == _conv(plain)["impl"] and not padded.plan.buffers.fills
    assert len(padded.plan.kernels) == len(plain.plan.kernels)
    for seed in range(2):
        feeds = random_inputs(padded, seed=seed)
        np.testing.assert_array_equal(padded.run(feeds)["y"], plain.run(feeds)["y"])


def test_the_border_is_the_zero_level_in_every_context() -> None:
    """Fresh contexts whose other buffers start as garbage, and the border of the padded
    buffer: the same outputs as the model's own runs."""
    m = _depthwise(**CASES["u8 zero point, 5x5, stride 2, uneven pads"][0])
    padded = compile_model(m)
    fills = padded.plan.buffers.fills
    if not _fast_form_exists(_conv(compile_model(m, composer=OFF))):
        pytest.skip("no brdgmm depthwise kernel on this CPU")
    assert list(fills.values()) == [7]  # the zero level of a u8 source
    [buffer] = fills
    assert list(padded.plan.buffers.buffer_of.values()).count(buffer) == 1  # never shared
    feeds = random_inputs(padded, seed=4)
    want = padded.run(feeds)["y"]
    for fill in (0xFF, 0x00):
        context = ExecutionContext(padded.plan, fill=fill)
        for name, view in context.inputs:
            np.copyto(view, feeds[name])
        context.run()
        np.testing.assert_array_equal(dict(context.outputs)["y"], want)


def test_threads_run_their_own_padded_buffers() -> None:
    m = _depthwise(**CASES["s8, 7x7 (StarNet, NNCF)"][0])
    padded = compile_model(m)
    feeds = [random_inputs(padded, seed=s) for s in range(6)]
    serial = [padded.run(f)["y"] for f in feeds]
    bad: list[int] = []
    start = threading.Barrier(3)

    def worker(index: int) -> None:
        start.wait()
        for _ in range(5):
            for i in range(index, len(feeds), 3):
                if not np.array_equal(padded.run(feeds[i])["y"], serial[i]):
                    bad.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
