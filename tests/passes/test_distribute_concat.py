"""distribute_concat: the batch norm, activation and quantize after a Concat of quantized
convolution outputs (MixNet's mixed convolutions, as NNCF quantizes them) run on each input,
inside that convolution's post-op chain. Bit-identical to the plan without it in the fused
and unfused modes (the same float32 operations on every element); declined where an input has
no kernel to join or the region does not end in one quantize."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.compiler.lower import lower_compute
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model

F32 = np.float32
OFF = ComposerOptions().without("distribute_concat")


def _qdq(name: str, src: str, dst: str, scale: float, zero: np.generic
         ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    return ([helper.make_node("QuantizeLinear", [src, f"{name}s", f"{name}z"], [f"{name}q"]),
             helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"], [dst])],
            [init(f"{name}s", F32(scale)), init(f"{name}z", zero)])


def _mixed(act: str = "relu", *, second: str = "conv", two_ends: bool = False,
           static: bool = False) -> onnx.ModelProto:
    """x → Q/DQ (s8) → Split in two halves of 8 channels → a 1x1 Conv (24 channels) → Q/DQ
    each, with its own scale → Concat → BatchNormalization → act ("relu", or "swish":
    x·sigmoid(x)) → Q/DQ → 1x1 Conv → Q/DQ. ``second="relu"``: the second half's Conv output
    goes through a Relu before its Q/DQ (no kernel to join: declined). ``two_ends``: the
    activation is quantized twice (two readers, two scales: declined). ``static``: as
    quantize_static has it, the concatenation itself quantized (a Q/DQ pair right after the
    Concat) and the batch norm's scale and bias DequantizeLinear nodes of integers."""
    rng = np.random.default_rng(0)
    nodes, inits = _qdq("x", "x", "xd", 0.02, np.int8(0))
    nodes.append(helper.make_node("Split", ["xd", "sizes"], ["p0", "p1"], axis=1))
    inits.append(init("sizes", np.array([8, 8], np.int64)))
    for i in range(2):
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}s"], [f"w{i}d"], axis=0),
                  helper.make_node("Conv", [f"p{i}", f"w{i}d"], [f"c{i}"])]
        inits += [init(f"w{i}", rng.integers(-127, 128, (24, 8, 1, 1)).astype(np.int8)),
                  init(f"w{i}s", rng.uniform(0.002, 0.01, 24).astype(F32))]
        src = f"c{i}"
        if i == 1 and second == "relu":
            nodes.append(helper.make_node("Relu", ["c1"], ["r1"]))
            src = "r1"
        more, more_inits = _qdq(f"o{i}", src, f"d{i}", 0.05 + 0.01 * i, np.int8(0))
        nodes += more
        inits += more_inits
    nodes.append(helper.make_node("Concat", ["d0", "d1"], ["cat"], axis=1))
    bn_in, gamma, beta = "cat", "g", "b"
    if static:
        more, more_inits = _qdq("cq", "cat", "catd", 0.06, np.uint8(128))
        nodes += more + [
            helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["gd"], axis=0),
            helper.make_node("DequantizeLinear", ["bq", "bs"], ["bd"], axis=0)]
        inits += more_inits + [
            init("gq", rng.integers(100, 255, 48).astype(np.uint8)),
            init("gs", F32(0.006)), init("gz", np.uint8(0)),
            init("bq", rng.integers(-300, 300, 48).astype(np.int32)),
            init("bs", np.full(48, 0.001, F32))]
        bn_in, gamma, beta = "catd", "gd", "bd"
    nodes.append(helper.make_node("BatchNormalization", [bn_in, gamma, beta, "m", "v"], ["bn"]))
    inits += [init("m", rng.normal(0, 0.2, 48).astype(F32)),
              init("v", rng.uniform(0.5, 1.5, 48).astype(F32))]
    if not static:
        inits += [init("g", rng.uniform(0.5, 1.5, 48).astype(F32)),
                  init("b", rng.normal(0, 0.2, 48).astype(F32))]
    if act == "relu":
        nodes.append(helper.make_node("Relu", ["bn"], ["a"]))
    else:
        nodes += [helper.make_node("Sigmoid", ["bn"], ["sg"]),
                  helper.make_node("Mul", ["bn", "sg"], ["a"])]
    more, more_inits = _qdq("a", "a", "ad", 0.03, np.uint8(0) if act == "relu" else np.int8(0))
    nodes += more
    inits += more_inits
    nodes += [helper.make_node("DequantizeLinear", ["wy", "wys"], ["wyd"], axis=0),
              helper.make_node("Conv", ["ad", "wyd"], ["cy"])]
    inits += [init("wy", rng.integers(-127, 128, (8, 48, 1, 1)).astype(np.int8)),
              init("wys", rng.uniform(0.002, 0.01, 8).astype(F32))]
    more, more_inits = _qdq("y", "cy", "y", 0.05, np.int8(0))
    nodes += more
    inits += more_inits
    outputs = ["y"]
    if two_ends:
        more, more_inits = _qdq("e", "a", "e", 0.07, np.int8(0))
        nodes += more
        inits += more_inits
        outputs.append("e")
    return model(nodes, {"x": ((1, 16, 12, 12), TensorProto.FLOAT)}, outputs, inits, opset=13)


def _agree(m: onnx.ModelProto, mode: str = "fused") -> tuple[dict, dict]:
    on, off = compile_model(m, mode=mode), compile_model(m, mode=mode, composer=OFF)
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        got, want = on.run(feeds), off.run(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
    return on.inspect(), off.inspect()


@pytest.mark.parametrize("act", ["relu", "swish"])
def test_each_convolution_computes_its_part_of_the_chain(act: str) -> None:
    on, off = _agree(_mixed(act))
    assert on["passes"]["distribute_concat"] == 1
    convs = [k for k in on["kernels"] if k["primitive"] == "convolution"]
    firsts = [k for k in convs if k["dst_layouts"][0].startswith(("u8", "s8"))
              and "(1, 24," in k["dst_layouts"][0]]
    assert len(firsts) == 2
    for kernel in firsts:  # dequantize, batch norm (mul, add), activation, quantize
        assert "binary_add" in kernel["post_ops"], kernel["post_ops"]
        assert ("eltwise_relu" if act == "relu" else "eltwise_swish") in kernel["post_ops"]
    assert len(on["kernels"]) < len(off["kernels"])
    assert not any(k["primitive"] == "binary" and "BatchNormalization" in k["name"]
                   for k in on["kernels"])


def test_unfused_mode_is_unchanged() -> None:
    on, _ = _agree(_mixed(), mode="unfused")
    assert on["passes"]["distribute_concat"] == 1


@pytest.mark.parametrize(("second", "two_ends"), [("relu", False), ("conv", True)])
def test_declined(second: str, two_ends: bool) -> None:
    on, off = _agree(_mixed(second=second, two_ends=two_ends))
    assert on["passes"].get("distribute_concat", 0) == 0
    assert len(on["kernels"]) == len(off["kernels"])


def test_through_the_quantized_concatenation() -> None:
    """quantize_static's form: the Concat's own Q/DQ pair does not end the region, the batch
    norm (its γ and β dequantized integers) and the activation's pair join it; each
    convolution then requantizes twice in its chain."""
    on, off = _agree(_mixed(static=True))
    assert on["passes"]["distribute_concat"] == 1
    assert len(on["kernels"]) < len(off["kernels"])
    assert not any(k["primitive"] == "binary" and "BatchNormalization" in k["name"]
                   for k in on["kernels"])


def _mixed_depthwise(half: int) -> onnx.ModelProto:
    """MixNet's form: x → Q/DQ → Split in two halves of ``half`` channels → a depthwise 3x3
    and a depthwise 5x5 Conv → Q/DQ each → Concat → BatchNormalization → Relu → Q/DQ."""
    rng = np.random.default_rng(1)
    nodes, inits = _qdq("x", "x", "xd", 0.02, np.int8(0))
    nodes.append(helper.make_node("Split", ["xd", "sizes"], ["p0", "p1"], axis=1))
    inits.append(init("sizes", np.array([half, half], np.int64)))
    for i, k in enumerate((3, 5)):
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", f"w{i}s"], [f"w{i}d"], axis=0),
                  helper.make_node("Conv", [f"p{i}", f"w{i}d"], [f"c{i}"], group=half,
                                   pads=[k // 2] * 4)]
        inits += [init(f"w{i}", rng.integers(-127, 128, (half, 1, k, k)).astype(np.int8)),
                  init(f"w{i}s", rng.uniform(0.002, 0.01, half).astype(F32))]
        more, more_inits = _qdq(f"o{i}", f"c{i}", f"d{i}", 0.05 + 0.01 * i, np.int8(0))
        nodes += more
        inits += more_inits
    channels = 2 * half
    nodes += [helper.make_node("Concat", ["d0", "d1"], ["cat"], axis=1),
              helper.make_node("BatchNormalization", ["cat", "g", "b", "m", "v"], ["bn"]),
              helper.make_node("Relu", ["bn"], ["a"])]
    inits += [init("g", rng.uniform(0.5, 1.5, channels).astype(F32)),
              init("b", rng.normal(0, 0.2, channels).astype(F32)),
              init("m", rng.normal(0, 0.2, channels).astype(F32)),
              init("v", rng.uniform(0.5, 1.5, channels).astype(F32))]
    more, more_inits = _qdq("a", "a", "y", 0.03, np.uint8(0))
    return model(nodes + more, {"x": ((1, channels, 12, 12), TensorProto.FLOAT)}, ["y"],
                 inits + more_inits, opset=13)


@pytest.mark.parametrize(("half", "block", "distributed"), [
    (12, 8, False),  # AVX2's depthwise kernel: 12 channels, a tail of its 8-channel block
    (16, 8, True),   # whole blocks
    (12, 0, True),   # a CPU whose depthwise kernel takes the tail right (AVX-512)
])
def test_no_per_channel_operands_into_a_depthwise_channel_tail(
        half: int, block: int, distributed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where oneDNN's int8 depthwise kernel applies binary post-ops wrong on a channel tail
    (jit_uni_int8:avx2 and :sse41), the batch norm's per-channel multiply and add would send
    those convolutions to ref:any (MixNet-S's 90-channel groups under AVX2): the region then
    stays after the Concat."""
    monkeypatch.setattr(lower_compute, "depthwise_binary_block", lambda: block)
    on, off = _agree(_mixed_depthwise(half))
    assert on["passes"].get("distribute_concat", 0) == int(distributed)
    assert (len(on["kernels"]) < len(off["kernels"])) is distributed
