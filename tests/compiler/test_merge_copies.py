"""merge_copies (compiler/lower/merge_copies.py): a reorder reading what a plain copy wrote
reads the copy's source through a view, and the copy goes. Exact (no arithmetic moves):
bit-identical to the plan without it (composer option ``merge_copies``), every value."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from qfuse.compiler.api import compile_model, random_inputs
from qfuse.ir.postops import ComposerOptions
from tests.compiler.onnx_builders import init, model

OFF = ComposerOptions().without("merge_copies")


def _qdq(name: str, value: str, scale: float, zp: int) -> tuple[list[onnx.NodeProto], list]:
    inits = [init(f"{name}_s", np.float32(scale)), init(f"{name}_z", np.uint8(zp))]
    nodes = [helper.make_node("QuantizeLinear", [value, f"{name}_s", f"{name}_z"],
                              [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                              [f"{name}_dq"])]
    return nodes, inits


def _attention_head() -> onnx.ModelProto:
    """q·kᵀ → Softmax → Q/DQ (u8) → Transpose → Q/DQ → v·P: the probabilities are the second
    MatMul's weights (EfficientViT-M's and LeViT's heads), which oneDNN's int8 matmul takes
    as s8: the Transpose's copy, then a u8 → s8 shift."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1)]
    inits: list = []
    for name, value, scale, zp in (("p", "p", 1 / 255, 0), ("pt", "pt", 1 / 255, 0),
                                   ("v", "v", 0.05, 128)):
        if name == "pt":
            nodes.append(helper.make_node("Transpose", ["p_dq"], ["pt"], perm=[0, 1, 3, 2]))
        more, more_inits = _qdq(name, value, scale, zp)
        nodes += more
        inits += more_inits
    nodes.append(helper.make_node("MatMul", ["v_dq", "pt_dq"], ["o"]))
    f = TensorProto.FLOAT
    return model(nodes, {"q": ([1, 4, 49, 16], f), "kt": ([1, 4, 16, 49], f),
                         "v": ([1, 4, 16, 49], f)}, ["o"], inits)


def test_transpose_and_shift_are_one_reorder() -> None:
    on, off = compile_model(_attention_head()), compile_model(_attention_head(), composer=OFF)
    assert on.plan.notes["merged_copies"] == 1 and off.plan.notes["merged_copies"] == 0
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    assert "Transpose" in [k.info.op for k in off.plan.kernels]
    assert "Transpose" not in [k.info.op for k in on.plan.kernels]
    [merged] = [k for k in on.plan.kernels if "not its copy" in k.info.note]
    assert merged.kind == "reorder" and "ref" not in merged.impl
    assert on.plan.slots[merged.reads[0]].md.strides[2:] == (1, 49)  # the Softmax's, permuted
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert all(np.array_equal(a, b) for a, b in zip(on.run(feeds).values(),
                                                        off.run(feeds).values(), strict=True))
        everything, reference = on.run_all(feeds), off.run_all(feeds)
        shared = everything.keys() & reference.keys()
        assert {"pt_q", "p_q"} <= shared  # the transposed value, read through its view
        assert all(np.array_equal(everything[k], reference[k]) for k in shared)


def test_a_copy_read_twice_stays() -> None:
    """The transposed probabilities also a graph output: their copy is kept."""
    m = _attention_head()
    m.graph.output.append(helper.make_tensor_value_info("pt_dq", TensorProto.FLOAT,
                                                        [1, 4, 49, 49]))
    on = compile_model(m)
    assert on.plan.notes["merged_copies"] == 0
    assert "Transpose" in [k.info.op for k in on.plan.kernels]


def _split_head(zero_point: bool) -> tuple[dict, list, set]:
    """LeViT's k in small, as a lowered plan: a (1, 49, 6, 16) part of a (1, 49, 384) u8
    buffer (a Split view at byte 16) transposed by a copy into a (1, 6, 16, 49) slot, then
    shifted to s8 (source zero point 128) for a MatMul's weights."""
    from qfuse.compiler.lower.plan import Kernel, KernelInfo, Slot
    from qfuse.runtime.onednn import Arg, DataType, Memory, MemoryDesc, PrimitiveAttr, reorder

    u8, s8 = DataType.u8, DataType.s8
    slots = {"x": Slot("x", MemoryDesc.from_strides((1, 49, 384), u8, (18816, 384, 1))),
             "p": Slot("p", MemoryDesc.from_strides((1, 49, 384), u8, (18816, 384, 1))),
             "s": Slot("s", MemoryDesc.from_strides((1, 6, 16, 49), u8, (4704, 784, 49, 1))),
             "o": Slot("o", MemoryDesc.from_strides((1, 6, 16, 49), s8, (4704, 784, 49, 1)))}
    slots["a"] = Slot("a", MemoryDesc.from_strides((1, 49, 6, 16), u8, (18816, 384, 64, 1)),
                      alias="p", offset=16)
    slots["d"] = Slot("d", MemoryDesc.from_strides((1, 49, 6, 16), u8, (4704, 1, 784, 49)),
                      alias="s")

    def copy(name: str, src: str, dst: str, attr: PrimitiveAttr | None = None,
             fixed: dict | None = None) -> Kernel:
        pd = reorder(slots[src].md, slots[dst].md, attr=attr)
        return Kernel(name, "reorder", [src], [dst], pd.create(),
                      {int(Arg.SRC): src, int(Arg.DST): dst}, fixed or {},
                      info=KernelInfo(node=name))

    attr, fixed = PrimitiveAttr(), {}
    if zero_point:
        attr.set_zero_points_mask(Arg.SRC, 0)
        fixed = {Arg.zero_points(Arg.SRC): Memory.zero_points(128)}
    kernels = [copy("load", "x", "p"), copy("transpose", "a", "d"),
               copy("shift", "s", "o", attr, fixed)]
    return slots, kernels, {"x", "o"}


def test_a_merge_onednn_gets_wrong_is_not_made() -> None:
    """oneDNN 3.2's jit reorder with a source zero point reads the permuted view of the
    Split part wrongly; the compile-time check (merge_copies._agrees) finds it and keeps the
    two reorders. Without the zero point the same view is read right and they merge."""
    from qfuse.compiler.lower.merge_copies import merge_copies

    for zero_point, merged in ((True, 0), (False, 1)):
        slots, kernels, ends = _split_head(zero_point)
        _, after, count = merge_copies(slots, kernels, ends)
        assert count == merged and len(after) == 3 - merged, zero_point


def test_the_copys_own_slot_stays_a_view_of_its_source() -> None:
    """The copy's dst is the home of a graph value (a Split part, which run_all and qfuse
    check read): it stays, as a view of the copy's source, when its reader reads another view
    of it (ViTamin's q, k, v: a Split part Squeeze'd, then transposed)."""
    from qfuse.compiler.lower.merge_copies import merge_copies
    from qfuse.compiler.lower.plan import root_slot

    slots, kernels, ends = _split_head(False)
    after, _, count = merge_copies(slots, kernels, ends)
    assert count == 1 and after["d"].alias == "a"
    assert after["d"].md.dims == slots["d"].md.dims
    assert after["d"].md.strides[1:] == slots["a"].md.strides[1:]  # a's dims, unpermuted
    assert root_slot(after, "d") == root_slot(after, "s")  # both over the copy's source


def _values_head() -> onnx.ModelProto:
    """ViT's v in small: a quantized [1, 49, 4, 16] tensor transposed to [1, 4, 49, 16] and
    Reshape'd to [4, 49, 16] (a view), the weights of the probabilities' MatMul."""
    f = TensorProto.FLOAT
    nodes, inits = _qdq("v", "v", 0.05, 128)
    nodes += [helper.make_node("Transpose", ["v_dq"], ["vt"], perm=[0, 2, 1, 3])]
    more, more_inits = _qdq("vt", "vt", 0.05, 128)
    nodes += more + [helper.make_node("Reshape", ["vt_dq", "shape"], ["vr"])]
    inits += more_inits + [init("shape", np.array([4, 49, 16], np.int64))]
    more, more_inits = _qdq("p", "p", 1 / 255, 0)
    nodes += more + [helper.make_node("MatMul", ["p_dq", "vr"], ["o"])]
    inits += more_inits
    return model(nodes, {"v": ([1, 49, 4, 16], f), "p": ([4, 49, 49], f)}, ["o"], inits)


def test_other_views_of_the_copy_follow_it() -> None:
    """The Transpose's output and its Reshape view (whose value run_all reads) both become
    views of the Transpose's source."""
    on, off = compile_model(_values_head()), compile_model(_values_head(), composer=OFF)
    assert on.plan.notes["merged_copies"] == 1
    assert len(on.plan.kernels) == len(off.plan.kernels) - 1
    feeds = random_inputs(on, seed=4)
    everything, reference = on.run_all(feeds), off.run_all(feeds)
    assert {"vt_q", "vr_q", "o"} <= everything.keys() & reference.keys()
    assert all(np.array_equal(everything[k], reference[k])
               for k in everything.keys() & reference.keys())


def _keys_from_channels_last() -> onnx.ModelProto:
    """EfficientViT-M's keys in small: a 1x1 Conv writes q, k, v channels-last ([1, 64, 7, 7]
    u8), a Split takes k (16 channels), a Reshape sees it as [1, 16, 49] — the rows of a
    MatMul's weights, which oneDNN's int8 matmul takes as s8: the Split's copy, then a u8 → s8
    shift."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(2)
    nodes, inits = _qdq("x", "x", 0.05, 128)
    inits += [init("w", rng.uniform(-0.3, 0.3, (64, 16, 1, 1)).astype(np.float32)),
              init("w2", rng.uniform(-0.3, 0.3, (8, 48, 1, 1)).astype(np.float32)),
              init("split", np.array([16, 48], np.int64)),
              init("rows", np.array([1, 16, 49], np.int64))]
    nodes += [helper.make_node("Conv", ["x_dq", "w"], ["c"])]
    more, more_inits = _qdq("c", "c", 0.1, 120)
    nodes += more + [helper.make_node("Split", ["c_dq", "split"], ["k", "rest"], axis=1),
                     helper.make_node("Reshape", ["k", "rows"], ["kr"]),
                     helper.make_node("Conv", ["rest", "w2"], ["o2"])]
    more2, more_inits2 = _qdq("a", "a", 0.02, 128)
    nodes += more2 + [helper.make_node("MatMul", ["a_dq", "kr"], ["o"])]
    return model(nodes, {"x": ([1, 16, 7, 7], f), "a": ([1, 49, 16], f)}, ["o", "o2"],
                 inits + more_inits + more_inits2)


def test_a_reshape_of_a_channels_last_part_reads_the_part() -> None:
    """The shift reads k in the convolution's output through a [1, 16, 49] view whose token
    dim runs through H and W of the channels-last bytes (stride 64: the 64 channels)."""
    on, off = compile_model(_keys_from_channels_last()), compile_model(
        _keys_from_channels_last(), composer=OFF)
    # both parts: k's shift, and the dequantize of the other part the float Conv reads
    assert on.plan.notes["merged_copies"] == 2 and off.plan.notes["merged_copies"] == 0
    assert len(on.plan.kernels) == len(off.plan.kernels) - 2
    [merged] = [k for k in on.plan.kernels if "not its copy" in k.info.note
                and on.plan.slots[k.reads[0]].md.dims == (1, 16, 49)]
    assert on.plan.slots[merged.reads[0]].md.strides[1:] == (1, 64)
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert all(np.array_equal(a, b) for a, b in zip(on.run(feeds).values(),
                                                        off.run(feeds).values(), strict=True))


def test_a_merged_run_needs_one_run_in_the_source_too() -> None:
    """S's token dim runs through D's H and W; in A they are one run (H stride = 7 x W stride)
    or not (rows padded to 8 pixels): a view, or None."""
    from qfuse.compiler.lower.merge_copies import _through
    from qfuse.runtime.onednn import DataType, MemoryDesc

    def md(dims: tuple, strides: tuple) -> MemoryDesc:
        return MemoryDesc.from_strides(dims, DataType.u8, strides)

    s = md((1, 16, 49), (784, 1, 16))
    d = md((1, 16, 7, 7), (784, 1, 112, 16))
    view = _through(s, d, md((1, 16, 7, 7), (3136, 1, 448, 64)))
    assert view is not None and view.strides[1:] == (1, 64)
    assert _through(s, d, md((1, 16, 7, 7), (3584, 1, 512, 64))) is None
    assert _through(md((1, 16, 49), (784, 49, 1)), d, md((1, 16, 7, 7), (3136, 1, 448, 64))) \
        is None  # S row-major over D's channels-last bytes: no run


def _box_distributions() -> onnx.ModelProto:
    """YOLOv8's head in small: two int8 convolutions write their 82 channels (64 box bins, 18
    classes) in place into a Concat along the anchors; its 64-channel Split part, reshaped to
    [1, 4, 16, N] and transposed to [1, 16, 4, N] for the Softmax over the bins. The Split
    part's copy is read only by the Transpose's reorder, through a view that splits its
    channels into 4 x 16."""
    rng = np.random.default_rng(3)
    sides = (16, 8)
    nodes: list[onnx.NodeProto] = []
    inits = [init("xs", np.float32(0.05)), init("xz", np.uint8(128)), init("ws", np.float32(0.01)),
             init("rows", np.array([1, 82, -1], np.int64)),
             init("sizes", np.array([64, 18], np.int64)),
             init("bins", np.array([1, 4, 16, sum(s * s for s in sides)], np.int64))]
    for i in range(len(sides)):
        nodes += [helper.make_node("QuantizeLinear", [f"x{i}", "xs", "xz"], [f"xq{i}"]),
                  helper.make_node("DequantizeLinear", [f"xq{i}", "xs", "xz"], [f"xd{i}"]),
                  helper.make_node("DequantizeLinear", [f"wq{i}", "ws"], [f"w{i}"]),
                  helper.make_node("Conv", [f"xd{i}", f"w{i}", f"b{i}"], [f"c{i}"]),
                  helper.make_node("Reshape", [f"c{i}", "rows"], [f"r{i}"])]
        inits += [init(f"wq{i}", rng.integers(-127, 128, (82, 8, 1, 1)).astype(np.int8)),
                  init(f"b{i}", rng.standard_normal(82).astype(np.float32))]
    nodes += [helper.make_node("Concat", ["r0", "r1"], ["cat"], axis=2),
              helper.make_node("Split", ["cat", "sizes"], ["box", "cls"], axis=1),
              helper.make_node("Reshape", ["box", "bins"], ["dist"]),
              helper.make_node("Transpose", ["dist"], ["t"], perm=[0, 2, 1, 3]),
              helper.make_node("Softmax", ["t"], ["p"], axis=1),
              helper.make_node("Sigmoid", ["cls"], ["s"])]
    return model(nodes, {f"x{i}": ([1, 8, s, s], TensorProto.FLOAT)
                         for i, s in enumerate(sides)}, ["p", "s"], inits)


def test_a_split_of_a_parts_channels_reads_the_part() -> None:
    """The Transpose's reorder reads the box bins in the Concat's buffer through a
    [1, 4, 16, N] view (channel strides 16 and 1 inside the 82-channel rows): the Split
    part's copy goes; bit-identical."""
    on, off = compile_model(_box_distributions()), compile_model(_box_distributions(),
                                                                 composer=OFF)
    assert on.plan.notes["merged_copies"] == 1 and len(on.plan.kernels) == len(off.plan.kernels) - 1
    [merged] = [k for k in on.plan.kernels if "not its copy" in k.info.note]
    assert on.plan.slots[merged.reads[0]].md.strides[1:] == (16, 1, 82)
    for seed in range(3):
        feeds = random_inputs(on, seed=seed)
        assert all(np.array_equal(a, b) for a, b in zip(on.run(feeds).values(),
                                                        off.run(feeds).values(), strict=True))


def test_the_parts_of_a_split_dim_must_tile_it() -> None:
    """S's dims 4 x 16 (or 16 x 4, permuted) tile D's 64 channels: a view with A's strides;
    2 x 16 cover only 32 of them: None."""
    from qfuse.compiler.lower.merge_copies import _through
    from qfuse.runtime.onednn import DataType, MemoryDesc

    def md(dims: tuple, strides: tuple) -> MemoryDesc:
        return MemoryDesc.from_strides(dims, DataType.u8, strides)

    d, a = md((1, 64, 10), (640, 1, 64)), md((1, 64, 10), (820, 1, 82))
    view = _through(md((1, 4, 16, 10), (640, 16, 1, 64)), d, a)
    assert view is not None and view.strides[1:] == (16, 1, 82)
    view = _through(md((1, 16, 4, 10), (640, 1, 16, 64)), d, a)
    assert view is not None and view.strides[1:] == (1, 16, 82)
    assert _through(md((1, 2, 16, 10), (640, 16, 1, 64)), d, a) is None
