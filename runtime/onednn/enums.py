"""oneDNN 3.2 C enums and argument indices as Python IntEnums.

Values come from include/oneapi/dnnl/dnnl_types.h and dnnl_common_types.h of
onednn-devel-cpu-gomp==2023.2.0. tests/runtime/test_onednn_enums.py parses the installed headers
and checks every member below against them (C name: `dnnl_<member>` unless the class says
otherwise), so a mistyped value fails a test instead of selecting the wrong kernel.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Status(IntEnum):
    """dnnl_status_t (C name dnnl_<member>)."""

    success = 0
    out_of_memory = 1
    invalid_arguments = 2
    unimplemented = 3
    last_impl_reached = 4
    runtime_error = 5
    not_required = 6
    invalid_graph = 7
    invalid_graph_op = 8
    invalid_shape = 9
    invalid_data_type = 10


class DataType(IntEnum):
    """dnnl_data_type_t (undef is dnnl_data_type_undef)."""

    undef = 0
    f16 = 1
    bf16 = 2
    f32 = 3
    s32 = 4
    s8 = 5
    u8 = 6
    f64 = 7
    boolean = 8


class FormatKind(IntEnum):
    """dnnl_format_kind_t (C name dnnl_format_kind_<member>, blocked is dnnl_blocked)."""

    undef = 0
    any = 1
    blocked = 2
    opaque = 3


class FormatTag(IntEnum):
    """dnnl_format_tag_t: plain and permuted tags plus the usual CNN aliases."""

    undef = 0  # dnnl_format_tag_undef
    any = 1  # dnnl_format_tag_any
    a = 2
    ab = 3
    abc = 4
    abcd = 5
    abcde = 6
    abcdef = 7
    ba = 14
    acb = 15
    bac = 16
    bca = 17
    cab = 18
    cba = 19
    abdc = 20
    acbd = 21
    acdb = 22
    adbc = 23
    adcb = 24
    bacd = 25
    bcda = 26
    cdab = 27
    cdba = 28
    dcab = 29
    abced = 30
    abdec = 31
    acbde = 32
    acdeb = 33
    adecb = 34
    bacde = 35
    bcdea = 36
    cdeab = 37
    cdeba = 38
    decab = 39
    # aliases (same values)
    x = 2
    nc = 3
    oi = 3
    io = 14
    ncw = 4
    nwc = 15
    nchw = 5
    nhwc = 22
    oihw = 5
    hwio = 28
    ncdhw = 6
    ndhwc = 33
    goihw = 6
    goidhw = 7


class PropKind(IntEnum):
    """dnnl_prop_kind_t (undef is dnnl_prop_kind_undef)."""

    undef = 0
    forward_training = 64
    forward_inference = 96


class PrimitiveKind(IntEnum):
    """dnnl_primitive_kind_t (undefined_primitive is dnnl_undefined_primitive)."""

    undefined_primitive = 0
    reorder = 1
    shuffle = 2
    concat = 3
    sum = 4
    convolution = 5
    deconvolution = 6
    eltwise = 7
    lrn = 8
    batch_normalization = 9
    inner_product = 10
    rnn = 11
    gemm = 12
    binary = 13
    matmul = 14
    resampling = 15
    pooling = 16
    reduction = 17
    prelu = 18
    softmax = 19
    layer_normalization = 20


class Alg(IntEnum):
    """dnnl_alg_kind_t (C name dnnl_<member>)."""

    undef = 0  # dnnl_alg_kind_undef
    convolution_direct = 0x1
    deconvolution_direct = 0xA
    eltwise_relu = 0x20
    eltwise_tanh = 0x21
    eltwise_elu = 0x22
    eltwise_square = 0x23
    eltwise_abs = 0x24
    eltwise_sqrt = 0x25
    eltwise_linear = 0x26
    eltwise_soft_relu = 0x27
    eltwise_hardsigmoid = 0x28
    eltwise_logistic = 0x29
    eltwise_exp = 0x2A
    eltwise_gelu_tanh = 0x2B
    eltwise_swish = 0x2C
    eltwise_log = 0x2D
    eltwise_clip = 0x2E
    eltwise_clip_v2 = 0x2F
    eltwise_pow = 0x30
    eltwise_gelu_erf = 0x31
    eltwise_round = 0x32
    eltwise_mish = 0x33
    eltwise_hardswish = 0x34
    pooling_max = 0x1FF
    pooling_avg_include_padding = 0x2FF
    pooling_avg_exclude_padding = 0x3FF
    lrn_across_channels = 0xAFF
    lrn_within_channel = 0xBFF
    vanilla_rnn = 0x1FFF
    vanilla_lstm = 0x2FFF
    vanilla_gru = 0x3FFF
    lbr_gru = 0x4FFF
    binary_add = 0x1FFF0
    binary_mul = 0x1FFF1
    binary_max = 0x1FFF2
    binary_min = 0x1FFF3
    binary_div = 0x1FFF4
    binary_sub = 0x1FFF5
    resampling_nearest = 0x2FFF0
    resampling_linear = 0x2FFF1
    reduction_max = 0x2FFF2
    reduction_min = 0x2FFF3
    reduction_sum = 0x2FFF4
    reduction_mul = 0x2FFF5
    reduction_mean = 0x2FFF6
    reduction_norm_lp_max = 0x2FFF7
    reduction_norm_lp_sum = 0x2FFF8
    reduction_norm_lp_power_p_max = 0x2FFF9
    reduction_norm_lp_power_p_sum = 0x2FFFA
    softmax_accurate = 0x30000
    softmax_log = 0x30001


ELTWISE_ALGS = frozenset(a for a in Alg if a.name.startswith("eltwise_"))
BINARY_ALGS = frozenset(a for a in Alg if a.name.startswith("binary_"))
POOLING_ALGS = frozenset(a for a in Alg if a.name.startswith("pooling_"))
SOFTMAX_ALGS = frozenset(a for a in Alg if a.name.startswith("softmax_"))
RESAMPLING_ALGS = frozenset(a for a in Alg if a.name.startswith("resampling_"))
REDUCTION_ALGS = frozenset(a for a in Alg if a.name.startswith("reduction_"))
LRN_ALGS = frozenset(a for a in Alg if a.name.startswith("lrn_"))


class Query(IntEnum):
    """dnnl_query_t (C name dnnl_query_<member>)."""

    undef = 0
    engine = 1
    primitive_kind = 2
    num_of_inputs_s32 = 3
    num_of_outputs_s32 = 4
    impl_info_str = 8
    prop_kind = 11
    strides = 14
    dilations = 15
    padding_l = 16
    padding_r = 17
    epsilon_f32 = 18
    flags = 19
    alg_kind = 20
    axis_s32 = 23
    factors = 27
    kernel = 31
    src_md = 129
    diff_src_md = 130
    weights_md = 131
    diff_weights_md = 132
    dst_md = 133
    diff_dst_md = 134
    workspace_md = 135
    scratchpad_md = 136
    exec_arg_md = 255
    ndims_s32 = 256
    dims = 257
    data_type = 258
    submemory_offset_s64 = 259
    padded_dims = 260
    padded_offsets = 261
    format_kind = 262
    inner_nblks_s32 = 263
    inner_blks = 264
    inner_idxs = 265


class Arg(IntEnum):
    """DNNL_ARG_* execution argument indices (C name DNNL_ARG_<member>)."""

    SRC = 1
    SRC_0 = 1
    SRC_1 = 2
    SRC_2 = 3
    SRC_3 = 4
    DST = 17
    DST_1 = 18
    DST_2 = 19
    WEIGHTS = 33
    WEIGHTS_1 = 34
    WEIGHTS_2 = 35
    WEIGHTS_3 = 36
    BIAS = 41
    MEAN = 49
    VARIANCE = 50
    SCALE = 51
    SHIFT = 52
    WORKSPACE = 64
    SCRATCHPAD = 80
    MULTIPLE_SRC = 1024
    MULTIPLE_DST = 2048
    ATTR_SCALES = 4096
    ATTR_ZERO_POINTS = 8192
    ATTR_POST_OP_DW = 16384
    ATTR_MULTIPLE_POST_OP_BASE = 32768

    @staticmethod
    def attr_multiple_post_op(index: int) -> int:
        """DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx): base of the args of post-op `index`."""
        return int(Arg.ATTR_MULTIPLE_POST_OP_BASE) * (index + 1)

    @staticmethod
    def multiple_src(index: int) -> int:
        """DNNL_ARG_MULTIPLE_SRC + index (concat inputs)."""
        return int(Arg.MULTIPLE_SRC) + index

    @staticmethod
    def scales(arg: int) -> int:
        """DNNL_ARG_ATTR_SCALES | arg: the f32 scales of `arg`."""
        return int(Arg.ATTR_SCALES) | int(arg)

    @staticmethod
    def zero_points(arg: int) -> int:
        """DNNL_ARG_ATTR_ZERO_POINTS | arg: the s32 zero points of `arg`."""
        return int(Arg.ATTR_ZERO_POINTS) | int(arg)

    @staticmethod
    def post_op(index: int, arg: int) -> int:
        """DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | arg (SRC_1 for binary, WEIGHTS for prelu)."""
        return Arg.attr_multiple_post_op(index) | int(arg)


def arg_name(arg: int) -> str:
    """Readable name of an execution argument index, e.g. 'ATTR_SCALES|WEIGHTS'."""
    base = int(Arg.ATTR_MULTIPLE_POST_OP_BASE)
    if arg >= base:
        index, rest = divmod(arg, base)
        return f"ATTR_MULTIPLE_POST_OP({index - 1})|{arg_name(rest)}"
    for prefix in (Arg.ATTR_ZERO_POINTS, Arg.ATTR_SCALES):
        if arg & prefix and arg != prefix:
            return f"{prefix.name}|{arg_name(arg & ~prefix)}"
    for multiple in (Arg.MULTIPLE_DST, Arg.MULTIPLE_SRC):
        if multiple <= arg < multiple + 1024:
            return f"{multiple.name}+{arg - multiple}"
    try:
        return Arg(arg).name
    except ValueError:
        return str(arg)


class EngineKind(IntEnum):
    """dnnl_engine_kind_t (any is dnnl_any_engine)."""

    any = 0
    cpu = 1
    gpu = 2


class StreamFlags(IntFlag):
    """dnnl_stream_flags_t (C name dnnl_stream_<member>)."""

    in_order = 0x1
    out_of_order = 0x2
    default_flags = 0x1


class ScratchpadMode(IntEnum):
    """dnnl_scratchpad_mode_t (C name dnnl_scratchpad_mode_<member>)."""

    library = 0
    user = 1


class FpMathMode(IntEnum):
    """dnnl_fpmath_mode_t (C name dnnl_fpmath_mode_<member>)."""

    strict = 0
    bf16 = 1
    f16 = 2
    any = 3
    tf32 = 4


class RnnDirection(IntEnum):
    """dnnl_rnn_direction_t (C name dnnl_<member>)."""

    unidirectional_left2right = 1
    unidirectional_right2left = 2
    bidirectional_concat = 3
    bidirectional_sum = 4


RNN_CELL_ALGS = frozenset({Alg.vanilla_rnn, Alg.vanilla_lstm, Alg.vanilla_gru, Alg.lbr_gru})


class NormFlags(IntFlag):
    """dnnl_normalization_flags_t (C name dnnl_<member>, none is dnnl_normalization_flags_none)."""

    none = 0x0
    use_global_stats = 0x1
    use_scale = 0x2
    use_shift = 0x4


class CpuIsa(IntEnum):
    """dnnl_cpu_isa_t (C name dnnl_cpu_isa_<member>)."""

    default = 0x0
    sse41 = 0x1
    avx = 0x3
    avx2 = 0x7
    avx2_vnni = 0xF
    avx2_vnni_2 = 0x1F
    avx512_core = 0x27
    avx512_core_vnni = 0x67
    avx512_core_bf16 = 0xE7
    avx512_core_fp16 = 0x1EF
    avx512_core_amx = 0xFEF
    avx512_core_amx_fp16 = 0x1FEF
