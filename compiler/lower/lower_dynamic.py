"""DynamicQuantizeLinear (quantize_dynamic's activations) → four kernels, none of them copies:

    reduction_min, reduction_max over x        two jit reductions of x's bytes seen as one row
                                               (min and max do not depend on the order; a
                                               blocked layout's zero padding is inside the
                                               range too, which always includes 0)
    params (numpy, two floats in)              scale and zero point in ONNX Runtime's float32
                                               steps (runtime/reference/ops_quant.dynamic_params)
    binary_div(x, scale) → eltwise_round →     y = saturate(rint(x / scale) + zp), ONNX's
    binary_add(zp), u8 dst in x's layout       QuantizeLinear (lower_quant.py), the scale and
                                               zero point read at run time

The params kernel also writes the zero point as one s32 element, the form the int8 primitive
reading y takes it in (lower_compute.src_zero_point), both as float32 operands of the
quantize, and the products of the scale with a constant that its readers compute
(quantize_dynamic's ``s_x·s_w``, the float32 Mul of the reference): those Muls of a rank-0
value would otherwise each be a numpy kernel of their own. Against the onnxruntime island this
replaces, 4 kernels for 1, but no session call and no reorder to a plain layout.
"""

from __future__ import annotations

import numpy as np

from qfuse.compiler.lower.context import LowerContext
from qfuse.compiler.lower.layouts import md_like, plain_md
from qfuse.compiler.lower.lower_compute import s32_zero_point
from qfuse.ir import Node
from qfuse.ir.graph import scale_product
from qfuse.ir.chain import ONNX_FORM
from qfuse.runtime.onednn import Alg, Arg, DataType, PostOps, PrimitiveAttr, binary, reduction
from qfuse.runtime.reference.ops_quant import dynamic_params

F32 = np.float32


def lower_dynamic_quantize(ctx: LowerContext, node: Node) -> None:
    x = node.inputs[0]
    y, scale, zero_point = node.outputs
    home = ctx.home_slot(x)
    md = ctx.slots[home].md
    if not md.is_plain or md.size != md.nelems * 4:  # not dense: a row-major copy first
        home = ctx.source(x, plain_md(md.dims, DataType.f32))
        md = ctx.slots[home].md
    row = ctx.temp(f"{x}@row", plain_md((1, md.nelems), DataType.f32), alias=home)
    one = plain_md((1, 1), DataType.f32)
    ends = []
    for alg in (Alg.reduction_min, Alg.reduction_max):
        end = ctx.temp(f"{x}@{alg.name.removeprefix('reduction_')}", one)
        pd = reduction(alg, ctx.slots[row].md, one)
        ctx.add_primitive(f"{node.name}:{alg.name}", pd, {int(Arg.SRC): row, int(Arg.DST): end},
                          info=ctx.info_for(node, role="op", note=f"{alg.name} of '{x}'"))
        ends.append(end)
    ndims = len(md.dims)
    operand = plain_md((1,) * ndims, DataType.f32)
    scale_f32 = ctx.temp(f"{scale}@operand", operand)
    zp_f32 = ctx.temp(f"{zero_point}@operand", operand)
    zp_s32 = ctx.temp(s32_zero_point(zero_point), plain_md((1,), DataType.s32))
    writes = [ctx.define_plain(scale), ctx.define_plain(zero_point), scale_f32, zp_f32, zp_s32]
    products = _scale_products(ctx, scale)
    ctx.lowered.update(mul.name for mul, _ in products)  # computed here: no kernel of their own
    writes += [ctx.define_plain(mul.outputs[0]) for mul, _ in products]
    constants = [c for _, c in products]

    def params(arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        # each output a one-element view written in place (np.copyto per output cost 8 of
        # the kernel's 13 us); the products broadcast into theirs (a float32 Mul)
        s, z = dynamic_params(float(arrays[0].flat[0]), float(arrays[1].flat[0]))
        s32 = F32(s)
        for out, value in zip(outs, (s32, z, s32, z, z)):
            out[...] = value
        for out, c in zip(outs[5:], constants):
            np.multiply(s32, c, out=out, casting="unsafe")

    info = ctx.info_for(node, note="scale and zero point from the range of "
                                   f"'{x}' (ONNX Runtime's float32 steps)")
    info.absorbed += [mul.name for mul, _ in products]
    ctx.add_numpy(f"{node.name}:params", params,  # type: ignore[arg-type]  (into=True)
                  ends, writes, info, into=True)
    ctx.home[s32_zero_point(zero_point)] = zp_s32
    posts = PostOps()
    posts.append_eltwise(Alg.eltwise_round)
    posts.append_binary(Alg.binary_add, operand)
    attr = PrimitiveAttr()
    attr.set_post_ops(posts)
    dst_md = md_like(md, DataType.u8)
    assert dst_md is not None
    pd = binary(Alg.binary_div, md, operand, dst_md, attr=attr)
    out = ctx.define(y, dst_md)
    info = ctx.info_for(node, role="op", post_ops=["eltwise_round", "binary_add"],
                        post_op_details=["eltwise_round", f"binary_add('{zero_point}')"],
                        rounding=ONNX_FORM, note=f"binary_div: x / '{scale}' (run time)")
    ctx.add_primitive(node.name, pd, {int(Arg.SRC_0): home, int(Arg.SRC_1): scale_f32,
                                      Arg.post_op(1, Arg.SRC_1): zp_f32, int(Arg.DST): out},
                      info=info)


def _scale_products(ctx: LowerContext, scale: str) -> list[tuple[Node, np.ndarray]]:
    """The readers of ``scale`` that multiply it by a float32 constant (quantize_dynamic's
    ``s_x·s_w``, ir.graph.scale_product), with the constant: the params kernel computes them
    (a float32 multiply, broadcast as the Mul's output)."""
    found = []
    for reader, _ in ctx.graph.consumers(scale):
        product = scale_product(ctx.graph, reader.outputs[0], ctx.const)
        if product is not None and product[0] == scale:
            found.append((reader, product[1]))
    return found
