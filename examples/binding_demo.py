"""One int8 convolution through the oneDNN binding, checked bit for bit against numpy.

u8 src with a zero point, s8 weights with per-output-channel scales (filled by a reorder into
the layout the kernel chose), f32 bias, src and dst scales, post-ops relu then sum (with a scale
and a zero point), u8 dst with a zero point. The numpy side is runtime/onednn/reference.py:

    acc = sum((src - zp_src) * wei)                       exact int32, padding contributes 0
    x   = f32(acc) * f32(s_src * s_wei[oc]) + bias        float32
    x   = relu(x);  x = fma(sum_scale, dst_prev - sum_zp, x)
    dst = saturate(rint(x * f32(1 / s_dst) + zp_dst))

Run: python -m qfuse.examples.binding_demo (exit status 0 when bit-exact).
"""

from __future__ import annotations

import sys

import numpy as np

from qfuse.runtime.numerics import step_diff
from qfuse.runtime.onednn import (
    Alg,
    Arg,
    DataType,
    FormatTag,
    Memory,
    MemoryDesc,
    PostOps,
    PrimitiveAttr,
    convolution,
    effective_cpu_isa,
    filled,
    version,
)
from qfuse.runtime.onednn import reference as ref

F32 = np.float32


def main() -> int:
    rng = np.random.default_rng(0)
    n, c, o, h, w = 2, 32, 64, 14, 14
    src = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    weights = rng.integers(-128, 128, (o, c, 3, 3)).astype(np.int8)
    zp_src, zp_dst, sum_scale, sum_zp = 128, 5, 0.8, 3
    s_src, s_dst = F32(0.02), F32(0.15)
    s_wei = rng.uniform(0.002, 0.01, o).astype(F32)
    bias = rng.normal(0.0, 1.0, o).astype(F32)
    residual = rng.integers(0, 256, (n, o, h, w)).astype(np.uint8)  # dst before the conv

    post_ops = PostOps().append_eltwise(Alg.eltwise_relu).append_sum(sum_scale, sum_zp)
    attr = (PrimitiveAttr().set_scales_mask(Arg.SRC, 0).set_scales_mask(Arg.WEIGHTS, 1)
            .set_scales_mask(Arg.DST, 0).set_zero_points_mask(Arg.SRC, 0)
            .set_zero_points_mask(Arg.DST, 0).set_post_ops(post_ops))
    src_md = MemoryDesc.from_tag(src.shape, DataType.u8, FormatTag.nhwc)
    dst_md = MemoryDesc.from_tag((n, o, h, w), DataType.u8, FormatTag.nhwc)
    pd = convolution(src_md, MemoryDesc.from_tag(weights.shape, DataType.s8, FormatTag.any),
                     dst_md, bias=MemoryDesc.from_tag((o,), DataType.f32),
                     padding_l=(1, 1), padding_r=(1, 1), attr=attr)
    conv = pd.create()
    dst = filled(dst_md, residual)
    conv.execute(conv.with_scratchpad({
        Arg.SRC: filled(src_md, src),
        Arg.WEIGHTS: filled(pd.weights_md, weights),  # reorder into the kernel's layout
        Arg.BIAS: Memory.from_array(bias),
        Arg.DST: dst,
        Arg.scales(Arg.SRC): Memory.scales(s_src),
        Arg.scales(Arg.WEIGHTS): Memory.scales(s_wei),
        Arg.scales(Arg.DST): Memory.scales(s_dst),
        Arg.zero_points(Arg.SRC): Memory.zero_points(zp_src),
        Arg.zero_points(Arg.DST): Memory.zero_points(zp_dst),
    }))

    acc = ref.conv_acc(src, weights, zp_src=zp_src, padding_l=(1, 1), padding_r=(1, 1))
    expected = ref.epilogue(acc, np.uint8, src_scale=s_src, wei_scales=s_wei, bias=bias,
                            post_ops=post_ops.records, dst_prev=residual, dst_scale=s_dst,
                            dst_zp=zp_dst)
    max_lsb, identical = step_diff(dst.read(), expected)
    print(f"oneDNN {version()}, cpu isa {effective_cpu_isa().name}")
    print(f"int8 convolution {src.shape} x {weights.shape} -> {expected.shape}, "
          f"post-ops {post_ops.names()}")
    print(f"implementation: {pd.impl_name}")
    print(f"vs numpy float32 reference: max difference {max_lsb} LSB, "
          f"{identical:.2%} identical")
    if max_lsb and not pd.impl_name.endswith(("amx", "vnni")):
        print("note: without VNNI/AMX, pairs of u8*s8 products saturate in int16 "
              "(vpmaddubsw); tests/runtime/test_onednn_int8.py models this exactly")
    return 0 if max_lsb == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
