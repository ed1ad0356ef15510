"""The Plan: buffer planning with reuse, reorder counting, inspect data, table errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qfuse.compiler.errors import UnsupportedModelError
from qfuse.compiler.lower import LOWERINGS, Kernel, Slot, plan_buffers
from qfuse.ir import DType, Graph, Op, TensorInfo
from qfuse.ir.ops import NoAttrs, ReshapeAttrs
from qfuse.runtime.onednn import DataType, MemoryDesc
from tests.compiler.lower_helpers import (
    add_int8_conv,
    int_input,
    one_primitive_per_int8_node,
    random_int,
    ref_eval,
    requires_exact_int8,
    run_plan,
)

U8 = DType.U8


def _conv_stack(depth: int) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("stack")
    x = int_input(g, "x", (1, 16, 8, 8), U8, 0.05, 3)
    for i in range(depth):
        x = add_int8_conv(g, x, 16, kernel=1, pads=(0, 0, 0, 0), name=f"c{i}", seed=i,
                          out_zp=3).outputs[0]
    g.outputs.append(x)
    return g, {"x": random_int(np.random.default_rng(0), (1, 16, 8, 8), U8)}


def test_buffers_are_reused() -> None:
    graph, feeds = _conv_stack(6)
    _, plan = run_plan(graph, feeds)
    info = plan.inspect()["buffers"]
    # 6 conv outputs + the input and its layout copy + the output conversion share 3 buffers
    assert info["count"] <= 3 < info["slots"], info


def _check_no_overlap(slots: dict[str, Slot], kernels: list[Kernel], inputs: list[str],
                      outputs: list[str]) -> int:
    bp = plan_buffers(slots, kernels, inputs, outputs)
    roots = sorted(bp.lifetimes)
    for i, a in enumerate(roots):
        for b in roots[i + 1:]:
            (a0, a1), (b0, b1) = bp.lifetimes[a], bp.lifetimes[b]
            if a0 <= b1 and b0 <= a1:  # alive at the same time
                assert bp.buffer_of[a] != bp.buffer_of[b], (a, b, bp.lifetimes)
    return len(bp.sizes)


@pytest.mark.parametrize("seed", range(20))
def test_plan_buffers_never_shares_live_values(seed: int) -> None:
    """Random DAGs of kernels: values alive together never share a buffer."""
    rng = np.random.default_rng(seed)
    slots = {"in": Slot("in", MemoryDesc.from_tag((64,), DataType.f32))}
    kernels, values = [], ["in"]
    for i in range(12):
        reads = list(rng.choice(values, size=min(len(values), int(rng.integers(1, 3))),
                                replace=False))
        name = f"v{i}"
        size = int(rng.choice([16, 64, 256]))
        alias = None
        if rng.random() < 0.2:  # a zero-copy view of something already computed
            alias = str(rng.choice(values[1:])) if len(values) > 1 else None
            size = 16
        slots[name] = Slot(name, MemoryDesc.from_tag((size,), DataType.f32), alias)
        kernels.append(Kernel(f"k{i}", "test", reads, [name]))
        values.append(name)
    count = _check_no_overlap(slots, kernels, ["in"], [values[-1]])
    assert count <= len(values)


def test_a_padded_source_keeps_a_buffer_of_its_own() -> None:
    """A ``Slot.fill`` root (padded_depthwise's bordered source) gets its own buffer for the
    whole run with its fill byte, never handed to a value planned after it; the others still
    share."""
    f32 = DataType.f32
    slots = {"in": Slot("in", MemoryDesc.from_tag((64,), f32)),
             "pad": Slot("pad", MemoryDesc.from_tag((100,), DataType.u8), fill=7),
             "pad_interior": Slot("pad_interior", MemoryDesc.from_tag((64,), DataType.u8),
                                  alias="pad", offset=18)}
    for name in ("a", "b", "c"):
        slots[name] = Slot(name, MemoryDesc.from_tag((100,), DataType.u8))
    kernels = [Kernel("copy", "test", ["in"], ["pad_interior"]),
               Kernel("conv", "test", ["pad"], ["a"]),
               Kernel("k2", "test", ["a"], ["b"]),
               Kernel("k3", "test", ["b"], ["c"])]
    bp = plan_buffers(slots, kernels, ["in"], ["c"])
    own = bp.buffer_of["pad"]
    assert bp.fills == {own: 7} and bp.lifetimes["pad"] == (-1, len(kernels))
    assert [r for r, b in bp.buffer_of.items() if b == own] == ["pad"]
    assert bp.buffer_of["c"] == bp.buffer_of["a"]  # pooled as before: a is dead before c


@one_primitive_per_int8_node
def test_reorder_counting() -> None:
    """u8 graph input (plain) → int8 conv (channels-last) → Reshape (needs row-major)."""
    g = Graph("layouts")
    x = int_input(g, "x", (1, 16, 8, 8), U8, 0.05, 3)
    y = add_int8_conv(g, x, 16, kernel=1, pads=(0, 0, 0, 0)).outputs[0]
    g.add_node(Op.RESHAPE, [y], ["r"], ReshapeAttrs((1, 1024)),
               infos=[TensorInfo((1, 1024), U8, g.info(y).quant)])
    g.outputs.append("r")
    _, plan = run_plan(g, {"x": random_int(np.random.default_rng(0), (1, 16, 8, 8), U8)})
    info = plan.inspect()
    assert info["io_reorders"] == 1  # the input to channels-last
    assert info["reorders"] == 1  # the conv's output to row-major for the Reshape
    roles = [k["role"] for k in info["kernels"]]
    assert roles == ["io", "op", "reorder"]


@one_primitive_per_int8_node
def test_inspect_is_json_and_complete() -> None:
    graph, feeds = _conv_stack(2)
    _, plan = run_plan(graph, feeds)
    info = json.loads(json.dumps(plan.inspect()))
    conv = next(k for k in info["kernels"] if k["name"] == "c0")
    for key in ("name", "primitive", "impl", "src_dtype", "dst_dtype", "post_ops",
                "optimizations", "absorbed", "src_layouts", "dst_layouts", "scales_masks",
                "zero_points_masks", "weights_layout"):
        assert key in conv, key
    assert conv["primitive"] == "convolution" and conv["src_dtype"] == "u8"
    assert conv["scales_masks"] == {"WEIGHTS": 1, "DST": 0}
    assert conv["zero_points_masks"] == {"SRC": 0, "DST": 0}
    assert "mul_to_weight_scales" in conv["optimizations"]
    assert conv["post_ops"] == ["eltwise_relu"]


def test_missing_table_entry_names_node_and_op(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Graph("missing")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_node(Op.RELU, ["x"], ["y"], NoAttrs(), name="act7", infos=[TensorInfo((2, 3),
                                                                           DType.F32)])
    g.outputs.append("y")
    monkeypatch.delitem(LOWERINGS, Op.RELU)
    with pytest.raises(UnsupportedModelError, match=r"'act7' \(Relu\).*Relu"):
        run_plan(g, {"x": np.zeros((2, 3), np.float32)})


def test_constant_subgraph_is_folded_at_compile_time() -> None:
    g = Graph("fold")
    g.add_input("x", TensorInfo((2, 3), DType.F32))
    g.add_constant("c", np.full((2, 3), 2.0, np.float32))
    g.add_node(Op.RELU, ["c"], ["rc"], NoAttrs(), infos=[TensorInfo((2, 3), DType.F32)])
    g.add_node(Op.MUL, ["x", "rc"], ["y"], NoAttrs(), infos=[TensorInfo((2, 3), DType.F32)])
    g.outputs.append("y")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, plan = run_plan(g, {"x": x})
    assert [k.kind for k in plan.kernels] == ["binary"]
    np.testing.assert_array_equal(out["y"], 2 * x)


@pytest.mark.parametrize("dims,strides,new,expected", [
    ((2, 3, 4), (12, 4, 1), (6, 4), (4, 1)),  # row-major merge
    ((1, 8, 5, 5), (200, 1, 40, 8), (1, 2, 4, 5, 5), (200, 4, 1, 40, 8)),  # nhwc: split C
    ((1, 8, 5, 5), (200, 1, 40, 8), (1, 200), None),  # nhwc: C,H,W not contiguous in order
    ((4, 6), (1, 4), (24,), None),  # column-major flatten
    ((2, 1, 3), (3, 99, 1), (2, 3, 1), (3, 1, 1)),  # size-1 dims carry no stride
])
def test_nocopy_strides(dims: tuple, strides: tuple, new: tuple,
                        expected: tuple | None) -> None:
    from qfuse.compiler.lower.layouts import nocopy_strides

    got = nocopy_strides(dims, strides, new)
    if expected is None:
        assert got is None
    else:  # a size-1 dim may carry any stride
        assert got is not None
        assert [s for s, d in zip(got, new) if d != 1] == [
            s for s, d in zip(expected, new) if d != 1]


@requires_exact_int8
def test_reshape_of_channels_last_is_a_view() -> None:
    """Splitting C of an int8 conv's nhwc output (a channel shuffle) needs no reorder."""
    g = Graph("shuffle")
    x = int_input(g, "x", (1, 16, 8, 8), U8, 0.05, 3)
    y = add_int8_conv(g, x, 16, kernel=1, pads=(0, 0, 0, 0)).outputs[0]
    g.add_node(Op.RESHAPE, [y], ["r"], ReshapeAttrs((1, 4, 4, 8, 8)),
               infos=[TensorInfo((1, 4, 4, 8, 8), U8, g.info(y).quant)])
    g.outputs.append("r")
    feeds = {"x": random_int(np.random.default_rng(0), (1, 16, 8, 8), U8)}
    out, plan = run_plan(g, feeds)
    assert plan.reorders == 0 and plan.io_reorders == 2  # input in, output out
    values = ref_eval(g, feeds)
    assert np.abs(out["r"].astype(int) - values["r"].astype(int)).max() <= 1


@pytest.mark.parametrize("dims,strides,new,expected", [
    ((1, 82, 20, 20), (32800, 1, 1640, 82), (1, 82, 400), (32800, 1, 82)),  # tag acb
    ((2, 3, 4), (12, 4, 1), (2, 1, 12), (12, 12, 1)),  # tag abc
    ((1, 8, 5, 5), (200, 1, 40, 8), (1, 8, 1, 25), (200, 1, 200, 8)),  # tag acdb
])
def test_view_unit_dims_take_the_tag_stride(dims: tuple, strides: tuple, new: tuple,
                                            expected: tuple) -> None:
    """A size-1 dim's stride addresses nothing, but oneDNN orders dims by it: the view gets
    what a format tag would give, and a binary over it stays jit (with (82, 1, 82) it ran
    ref:any)."""
    from qfuse.compiler.lower.layouts import nocopy_strides
    from qfuse.runtime.onednn import Alg, DataType, MemoryDesc, binary

    got = nocopy_strides(dims, strides, new)
    assert got == expected
    md = MemoryDesc.from_strides(new, DataType.u8, got)
    one = MemoryDesc.from_tag((1,) * len(new), DataType.f32)
    assert not binary(Alg.binary_sub, md, one, md).impl_name.startswith("ref")
