"""Elementwise kernels over a layout oneDNN 3.2's jit binary declines run with their dims in
memory order, neighbours merged (compiler/lower/layouts.py ``memory_order_groups``; lower_gate
``_in_memory_order``, lower_quant ``_onnx_quantize``).

Two patterns found on timm's architectures, quantized by quantize_static and NNCF, each on
``ref:any`` before: ResNeSt's split attention multiplies a channels-last [1, R, C, H, W] view of
a convolution by a [1, R, C, 1, 1] softmax over the radix (a broadcast full along two dims:
ResNeSt-14d 255 ms, 250 of it in four such kernels), and CoaT's factorized attention quantizes
q, k and v split from a transposed [3, B, h, N, C] tensor whose innermost dim is neither the last
nor the channel. The same operations element for element: bit-identical to onnxruntime.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qfuse
from qfuse.compiler.lower.layouts import grouped_md, memory_order_groups
from qfuse.compiler.lower.lower_gate import _tile_factor
from qfuse.ir.postops import ComposerOptions
from qfuse.ir.rows import ROW
from qfuse.runtime.onednn import DataType, MemoryDesc


def _init(name: str, value: object, dtype: type) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _qdq(name: str, src: str, dst: str, scale: float, zp: int, dtype: type = np.uint8
         ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    return ([helper.make_node("QuantizeLinear", [src, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                              [dst])],
            [_init(f"{name}_s", scale, np.float32), _init(f"{name}_z", zp, dtype)])


def _add(nodes: list, inits: list,
         part: tuple[list[onnx.NodeProto], list[onnx.TensorProto]]) -> None:
    nodes += part[0]
    inits += part[1]


def _model(name: str, nodes: list, inits: list, inputs: dict[str, list[int]],
           output: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                      for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def split_attention(radix: int = 2, channels: int = 8, side: int = 6) -> onnx.ModelProto:
    """ResNeSt's split attention: an int8 conv's output seen as [1, R, C, H, W] times the
    softmax over R of a [1, C, R] tensor, transposed to [1, R, C, 1, 1], then quantized."""
    rng = np.random.default_rng(0)
    nodes, inits = _qdq("x", "x", "xd", 0.05, 128)
    w = rng.integers(-60, 61, (radix * channels, channels, 3, 3)).astype(np.int8)
    inits += [numpy_helper.from_array(w, "w"), _init("ws", 0.01, np.float32),
              _init("wz", 0, np.int8),
              _init("shape5", [1, radix, channels, side, side], np.int64),
              _init("shape3", [1, channels, radix], np.int64),
              _init("shapeg", [1, radix, channels, 1, 1], np.int64)]
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
              helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["r"])]
    _add(nodes, inits, _qdq("r", "r", "rd", 0.04, 0))
    nodes += [helper.make_node("Reshape", ["rd", "shape5"], ["x5"]),
              helper.make_node("Reshape", ["a", "shape3"], ["a3"]),
              helper.make_node("Softmax", ["a3"], ["sm"], axis=2),
              helper.make_node("Transpose", ["sm"], ["smt"], perm=[0, 2, 1]),
              helper.make_node("Reshape", ["smt", "shapeg"], ["g"])]
    _add(nodes, inits, _qdq("g", "g", "gd", 1 / 255, 0))
    nodes.append(helper.make_node("Mul", ["x5", "gd"], ["m"]))
    _add(nodes, inits, _qdq("m", "m", "y", 0.03, 0))
    return _model("split_attention", nodes, inits,
                  {"x": [1, channels, side, side], "a": [1, channels * radix]},
                  [1, radix, channels, side, side])


def factorized_head(tokens: int = 50, heads: int = 4, width: int = 8) -> onnx.ModelProto:
    """CoaT's factorized attention: q, k, v split from [B, N, 3, h, C] transposed to
    [3, B, h, N, C], each quantized (s8), softmax(k)ᵀ·v, then q·(that)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1, 4]),
             helper.make_node("Split", ["t"], ["q0", "k0", "v0"], axis=0)]
    inits: list[onnx.TensorProto] = []
    for n in ("q", "k", "v"):
        _add(nodes, inits, _qdq(n, f"{n}0", f"{n}d", 0.02, 0, np.int8))
    nodes += [helper.make_node("Softmax", ["kd"], ["ks"], axis=3),
              helper.make_node("Transpose", ["ks"], ["kt"], perm=[0, 1, 2, 4, 3]),
              helper.make_node("MatMul", ["kt", "vd"], ["kv"])]
    _add(nodes, inits, _qdq("kv", "kv", "kvd", 0.01, 0, np.int8))
    nodes.append(helper.make_node("MatMul", ["qd", "kvd"], ["y"]))
    return _model("factorized_head", nodes, inits, {"x": [1, tokens, 3, heads, width]},
                  [1, 1, heads, tokens, width])


def constant_then_mask(shape: tuple[int, ...] = (1, 2, 8, 8)) -> onnx.ModelProto:
    """MPNet's attention scores: x + a dequantized constant (its relative-position bias),
    quantized, then + a mask that broadcasts along all but the last dim. The chain's own
    operation reads the constant (Hugging Face's MPNet, QDQ and QOperator: the constant's
    regrouped view had no writer, 'plan reads slots that no kernel writes')."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    _add(nodes, inits, _qdq("x", "x", "xd", 0.02, 128))
    inits += [numpy_helper.from_array(rng.integers(0, 256, shape).astype(np.uint8), "cq"),
              _init("cs", 0.01, np.float32), _init("cz", 100, np.uint8)]
    nodes += [helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"]),
              helper.make_node("Add", ["xd", "cd"], ["s"])]
    _add(nodes, inits, _qdq("s", "s", "sd", 0.03, 120))
    _add(nodes, inits, _qdq("m", "m", "md", 0.05, 200))
    nodes.append(helper.make_node("Add", ["sd", "md"], ["t"]))
    _add(nodes, inits, _qdq("t", "t", "y", 0.04, 130))
    return _model("constant_then_mask", nodes, inits,
                  {"x": list(shape), "m": [1] * (len(shape) - 1) + [shape[-1]]}, list(shape))


def hardswish_after_conv(channels: int = 8, side: int = 12) -> onnx.ModelProto:
    """quantize_static's hardswish as PaddleOCR's PP-LCNet writes it, x·clip(x + 3, 0, 6)/6
    with a Q/DQ pair after each step, on an int8 conv's output: few channels, laid out
    channels-last (ppocr_cls: 8 channels, 38.8 µs at one thread, 4.8 µs over one merged dim)."""
    rng = np.random.default_rng(3)
    nodes, inits = _qdq("x", "x", "xd", 0.03, 128)
    w = rng.integers(-60, 61, (channels, 3, 3, 3)).astype(np.int8)
    inits += [numpy_helper.from_array(w, "w"), _init("ws", 0.01, np.float32),
              _init("wz", 0, np.int8), _init("three", 3.0, np.float32),
              _init("lo", 0.0, np.float32), _init("hi", 6.0, np.float32),
              _init("six", 6.0, np.float32)]
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
              helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1])]
    _add(nodes, inits, _qdq("c", "c", "cd", 0.06, 120))
    nodes.append(helper.make_node("Add", ["cd", "three"], ["a"]))
    _add(nodes, inits, _qdq("a", "a", "ad", 0.0235, 0))
    nodes.append(helper.make_node("Clip", ["ad", "lo", "hi"], ["r"]))
    _add(nodes, inits, _qdq("r", "r", "rd", 0.0235, 0))
    nodes.append(helper.make_node("Mul", ["cd", "rd"], ["m"]))
    _add(nodes, inits, _qdq("m", "m", "md", 0.2, 10))
    nodes.append(helper.make_node("Div", ["md", "six"], ["h"]))
    _add(nodes, inits, _qdq("h", "h", "y", 0.036, 10))
    return _model("hardswish_after_conv", nodes, inits, {"x": [1, 3, side, side]},
                  [1, channels, side, side])


def squeeze_excitation(channels: int = 24, side: int = 48) -> onnx.ModelProto:
    """An int8 conv's output, channels-last, times its squeeze-excitation gate
    sigmoid(W₂·relu(W₁·mean(x))), a run-time [1, C, 1, 1] tensor: rows of C elements."""
    rng = np.random.default_rng(5)
    nodes, inits = _qdq("x", "x", "xd", 0.03, 128)
    for name, shape in (("w", (channels, 3, 3, 3)), ("w1", (8, channels, 1, 1)),
                        ("w2", (channels, 8, 1, 1))):
        inits += [numpy_helper.from_array(rng.integers(-60, 61, shape).astype(np.int8), name),
                  _init(f"{name}s", 0.01, np.float32), _init(f"{name}z", 0, np.int8)]
        nodes.append(helper.make_node("DequantizeLinear", [name, f"{name}s", f"{name}z"],
                                      [f"{name}d"]))
    nodes.append(helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]))
    _add(nodes, inits, _qdq("c", "c", "cd", 0.06, 120))
    nodes.append(helper.make_node("GlobalAveragePool", ["cd"], ["p"]))
    _add(nodes, inits, _qdq("p", "p", "pd", 0.02, 120))
    nodes += [helper.make_node("Conv", ["pd", "w1d"], ["s1"]),
              helper.make_node("Relu", ["s1"], ["r1"])]
    _add(nodes, inits, _qdq("r1", "r1", "r1d", 0.02, 0))
    nodes += [helper.make_node("Conv", ["r1d", "w2d"], ["s2"]),
              helper.make_node("Sigmoid", ["s2"], ["g"])]
    _add(nodes, inits, _qdq("g", "g", "gd", 1 / 255, 0))
    nodes.append(helper.make_node("Mul", ["cd", "gd"], ["m"]))
    _add(nodes, inits, _qdq("m", "m", "y", 0.04, 120))
    return _model("squeeze_excitation", nodes, inits, {"x": [1, 3, side, side]},
                  [1, channels, side, side])


def norm_after_concat(channels: int = 24, side: int = 40) -> onnx.ModelProto:
    """MixNet's mixed convolutions as NNCF quantizes them: two int8 convs concatenated, then a
    BatchNormalization and ReLU on the dequantized concat — per-channel constants that fold
    into neither conv: rows of C elements, channels-last."""
    rng = np.random.default_rng(6)
    half = channels // 2
    nodes, inits = _qdq("x", "x", "xd", 0.03, 128)
    for name in ("a", "b"):
        inits += [numpy_helper.from_array(rng.integers(-60, 61, (half, 3, 3, 3)).astype(np.int8),
                                          f"w{name}"),
                  _init(f"w{name}s", 0.01, np.float32), _init(f"w{name}z", 0, np.int8)]
        nodes += [helper.make_node("DequantizeLinear", [f"w{name}", f"w{name}s", f"w{name}z"],
                                   [f"w{name}d"]),
                  helper.make_node("Conv", ["xd", f"w{name}d"], [name], pads=[1, 1, 1, 1])]
        _add(nodes, inits, _qdq(name, name, f"{name}d", 0.05, 0, np.int8))
        nodes[-1].output[0] = f"{name}d"
    nodes.append(helper.make_node("Concat", ["ad", "bd"], ["cat"], axis=1))
    _add(nodes, inits, _qdq("cat", "cat", "catd", 0.05, 0, np.int8))
    inits += [_init("gamma", rng.uniform(0.5, 2, channels), np.float32),
              _init("beta", rng.uniform(-1, 1, channels), np.float32),
              _init("mean", rng.uniform(-0.5, 0.5, channels), np.float32),
              _init("var", rng.uniform(0.5, 2, channels), np.float32)]
    nodes += [helper.make_node("BatchNormalization", ["catd", "gamma", "beta", "mean", "var"],
                               ["bn"]),
              helper.make_node("Relu", ["bn"], ["r"])]
    _add(nodes, inits, _qdq("r", "r", "y", 0.03, 0))
    return _model("norm_after_concat", nodes, inits, {"x": [1, 3, side, side]},
                  [1, channels, side, side])


def separable_attention(channels: int = 8, patch: int = 4, patches: int = 64
                        ) -> onnx.ModelProto:
    """MobileViTv2's separable self-attention as NNCF quantizes it: v, split from an int8
    1x1 convolution's float32 output (channels-last), goes through ReLU and a quantizer,
    then is multiplied by the context vector [1, C, P, 1], broadcast along the N patches,
    and quantized (s8). As one kernel that broadcast is a post-op oneDNN 3.2 runs on
    ``ref:any`` only (2-5 ms a kernel in MobileViTv2-0.5), also regrouped in memory order."""
    rng = np.random.default_rng(7)
    nodes, inits = _qdq("x", "x", "xd", 0.03, 128)
    w = rng.integers(-60, 61, (2 * channels, 3, 1, 1)).astype(np.int8)
    inits += [numpy_helper.from_array(w, "w"), _init("ws", 0.01, np.float32),
              _init("wz", 0, np.int8)]
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
              helper.make_node("Conv", ["xd", "wd"], ["c"]),
              helper.make_node("Split", ["c"], ["v", "k"], axis=1),
              helper.make_node("Relu", ["v"], ["r"])]
    _add(nodes, inits, _qdq("r", "r", "rd", 0.02, 0))
    _add(nodes, inits, _qdq("a", "a", "ad", 0.01, 0))
    nodes.append(helper.make_node("Mul", ["rd", "ad"], ["m"]))
    _add(nodes, inits, _qdq("m", "m", "y", 0.03, 0, np.int8))
    nodes.append(helper.make_node("Sigmoid", ["k"], ["y2"]))
    graph = helper.make_graph(
        nodes, "separable_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, patch, patches]),
         helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, channels, patch, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, patch, patches]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT,
                                       [1, channels, patch, patches])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# onnxruntime optimized (its Softmax kernel) or node by node (QDQ Adds as written, not fused
# into QLinearAdd, which rounds its own way)
@pytest.mark.parametrize(("build", "optimized"), [(split_attention, True),
                                                  (factorized_head, True),
                                                  (constant_then_mask, False)])
def test_no_reference_kernel_and_bit_exact(build, optimized: bool) -> None:
    model = build()
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input}
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)[0]
    for mode in ("fused", "unfused"):
        compiled = qfuse.compile_model(model, mode=mode)
        assert np.array_equal(compiled.run(feeds)["y"], want), mode
    kernels = qfuse.compile_model(model).inspect()["kernels"]
    assert not [k["name"] for k in kernels if k["impl"].startswith("ref")]
    assert any("memory_order" in k["optimizations"] for k in kernels)


def test_broadcast_post_op_splits_the_chain() -> None:
    """The chain up to the multiply writes float32, and the multiply is the second kernel's
    own operation over (P, N, C) with the context vector as (P, 1, C): no reference kernel,
    and bit-identical to the unfused mode (the same float32 values either way)."""
    model = separable_attention()
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 3, 4, 64)).astype(np.float32),
             "a": rng.standard_normal((1, 8, 4, 1)).astype(np.float32)}
    compiled = qfuse.compile_model(model)
    kernels = compiled.inspect()["kernels"]
    assert not [k["name"] for k in kernels if k["impl"].startswith("ref")]
    assert [k for k in kernels if k["name"].endswith(":before_mul")]
    got = compiled.run(feeds)
    want = qfuse.compile_model(model, mode="unfused").run(feeds)
    for name in ("y", "y2"):
        assert np.array_equal(got[name], want[name]), name


def _fused_checked(model: onnx.ModelProto, seed: int, steps: float,
                   composer: ComposerOptions | None = None) -> qfuse.CompiledModel:
    """The fused compile, its output on a random input checked bit-identical to the unfused
    mode's and within ``steps`` of onnxruntime's (its float convolution rounds near-ties of
    the convolution's output its own way)."""
    x = np.random.default_rng(seed).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    ).astype(np.float32) * 2
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    compiled = qfuse.compile_model(model, composer=composer)
    got = compiled.run({"x": x})["y"]
    unfused = qfuse.compile_model(model, mode="unfused", composer=composer)
    assert np.array_equal(got, unfused.run({"x": x})["y"])
    assert np.abs(got.astype(np.float64) - want).max() <= steps + 1e-6
    return compiled


def test_chain_on_few_channels_runs_over_one_dim() -> None:
    """A gate chain over a channels-last tensor whose operands are constants, scalars or x
    itself runs over its bytes as one dim (lower_gate ``_in_memory_order``): the same
    operations element for element, bit-identical to the unfused mode. (One step of c, 0.06,
    moves y by up to two of its steps, 0.036.)"""
    compiled = _fused_checked(hardswish_after_conv(), 4, 2 * 0.036)
    chain = [k for k in compiled.inspect()["kernels"] if "binary_mul" in k["post_ops"]]
    assert len(chain) == 1, [k["name"] for k in compiled.inspect()["kernels"]]
    assert "memory_order" in chain[0]["optimizations"]
    assert chain[0]["impl"] == "jit:uni"


# tolerance against onnxruntime in steps of y: its float convolution rounds c's near-ties its
# own way, and one step of c moves y by up to 2 steps (gate ≤ 1, 0.06 / 0.04), or 5 (the
# norm's γ/σ ≤ 2.8: 0.05·2.8 / 0.03)
@pytest.mark.parametrize(("build", "runtime", "steps"), [(squeeze_excitation, True, 2 * 0.04),
                                                          (norm_after_concat, False, 5 * 0.03)])
def test_short_rows_of_a_broadcast_operand_are_tiled(build, runtime: bool, steps: float) -> None:
    """A chain whose operand is broadcast along the pixels of a channels-last tensor with few
    channels runs in rows of at least ``ROW`` elements, the operand repeated (lower_gate
    ``_tile_factor``): a run-time gate by a kernel of its own (in a chain this large: smaller
    ones have their convolution write it repeated, passes/widen_gate.py), per-channel
    constants at compile time. The same operations element for element: bit-identical to the
    unfused mode. (distribute_concat, off here, would move norm_after_concat's batch norm
    into its two convolutions' chains, tests/passes/test_distribute_concat.py.)"""
    off = ComposerOptions().without("distribute_concat")
    kernels = _fused_checked(build(), 7, steps, off).inspect()["kernels"]
    tiled = [k for k in kernels if "tiled_rows" in k["optimizations"]]
    assert len(tiled) == 1, [k["name"] for k in kernels]
    assert tiled[0]["impl"] == "jit:uni"
    found = re.search(r"\(([\d, ]+)\) strides", tiled[0]["src_layouts"][0])
    assert found is not None
    dims = tuple(int(d) for d in found.group(1).split(","))
    assert len(dims) == 2 and dims[1] >= ROW, dims
    assert any(":tile:" in k["name"] for k in kernels) == runtime


def test_tile_factor() -> None:
    """Rows shorter than ``ROW`` grow by the smallest divisor of the outer group that makes
    them long enough; no tiling where an operand is full along the outer group only, where
    rows are long already, or where no divisor gets there within 4·ROW."""
    groups = ((2, 3), (1,))  # channels-last [1, C, H, W]: (H·W, C)
    assert _tile_factor(groups, (1, 8, 24, 96), [(1, 8, 1, 1)]) == 256
    assert _tile_factor(groups, (1, 24, 48, 48), [(1, 24, 1, 1)]) == 96
    assert _tile_factor(groups, (1, 4096, 2, 2), [(1, 4096, 1, 1)]) == 1
    assert _tile_factor(groups, (1, 8, 1, 2), [(1, 8, 1, 1)]) == 1
    assert _tile_factor(groups, (1, 8, 24, 96), [(1, 1, 24, 96)]) == 1
    # the view: x's bytes as (outer/k, k·inner), the operand's row k times as long
    assert grouped_md(groups, (1, 8, 24, 96), DataType.f32, 0, 256).dims == (9, 2048)
    assert grouped_md(groups, (1, 8, 1, 1), DataType.f32, 0, 256).dims == (1, 2048)
    assert grouped_md(groups, (1, 1, 1, 1), DataType.f32, 1, 256).dims == (1, 1, 1)


def _md(dims: tuple[int, ...], strides: tuple[int, ...]) -> MemoryDesc:
    return MemoryDesc.from_strides(dims, DataType.f32, strides)


def test_memory_order_groups() -> None:
    # a channels-last conv seen as [1, 2, 64, 56, 56], a [1, 2, 64, 1, 1] operand
    md = _md((1, 2, 64, 56, 56), (401408, 64, 1, 7168, 128))
    groups = memory_order_groups(md, [(1, 2, 64, 1, 1)])
    assert groups == ((3, 4), (1, 2))
    assert grouped_md(groups, md.dims, DataType.f32).dims == (3136, 128)
    assert grouped_md(groups, (1, 2, 64, 1, 1), DataType.f32, lead=1).dims == (1, 1, 128)
    # a transposed head: one run
    assert memory_order_groups(_md((1, 1, 8, 3137, 8), (200768, 200768, 25096, 1, 3137)),
                               []) == ((2, 4, 3),)
    # a gap (a slice of a wider tensor), an operand that does not broadcast, all ones
    assert memory_order_groups(_md((2, 3), (4, 1)), []) is None
    assert memory_order_groups(_md((2, 3), (3, 1)), [(2, 2)]) is None
    assert memory_order_groups(_md((1, 1), (1, 1)), []) is None
