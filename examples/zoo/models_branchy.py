"""Multi-branch CNNs: inception, shufflenet, unet.

These are the graphs where tensors fork and join: Concat of branches quantized with different
scales, Split, channel shuffle (Reshape/Transpose/Reshape), ConvTranspose and Resize.
Input name ``input``; output ``logits`` (classifiers) or ``mask`` (unet).
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder
from .models import RESIDUAL_GAMMA, _classifier_head


def _inception_module(
    b: GraphBuilder,
    x: str,
    c1: int,
    c3r: int,
    c3: int,
    c5r: int,
    c5: int,
    cp: int,
    *,
    double3x3: bool,
    name: str,
) -> str:
    with b.scope(name):
        b1 = b.conv_bn_act(x, c1, 1, name="branch1x1")
        b2 = b.conv_bn_act(b.conv_bn_act(x, c3r, 1, name="branch3x3_1"), c3, 3, name="branch3x3_2")
        b3 = b.conv_bn_act(x, c5r, 1, name="branch5x5_1")
        if double3x3:
            b3 = b.conv_bn_act(b3, c5, 3, name="branch5x5_2a")
            b3 = b.conv_bn_act(b3, c5, 3, name="branch5x5_2b")
        else:
            b3 = b.conv_bn_act(b3, c5, 5, name="branch5x5_2")
        with b.scope("branch_pool"):
            p = b.avgpool(x, 3, 1, pad=1, count_include_pad=False)
        b4 = b.conv_bn_act(p, cp, 1, name="branch_pool")
        return b.concat([b1, b2, b3, b4], axis=1)


def inception(
    *, batch: int = 1, size: int = 32, num_classes: int = 10, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """GoogLeNet/Inception-style: stem 3x3 Conv-BN-ReLU (32), 3x3/2 MaxPool, inception module A
    (branches 1x1; 1x1->3x3; 1x1->3x3->3x3; 3x3 AveragePool(stride 1, pad 1,
    count_include_pad=0)->1x1; Concat on channels = 64), 3x3/2 MaxPool, inception module B
    (same with a 1x1->5x5 branch; Concat = 96), GlobalAveragePool, Flatten, Gemm.

    Exercises: Concat of four branches whose activations have different quantization scales
    (the quantizer gives each branch its own Q/DQ), AveragePool with count_include_pad=0 at the
    borders, a 5x5 kernel, one tensor feeding four consumers, MaxPool with padding.
    """
    b = GraphBuilder("inception", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    with b.scope("stem"):
        x = b.conv_bn_act(x, 32, 3, name="conv")
        x = b.maxpool(x, 3, 2, pad=1)
    x = _inception_module(b, x, 16, 16, 24, 8, 12, 12, double3x3=True, name="mixed_a")
    x = b.maxpool(x, 3, 2, pad=1)
    x = _inception_module(b, x, 24, 24, 32, 8, 16, 24, double3x3=False, name="mixed_b")
    _classifier_head(b, x, num_classes)
    return b.build(doc=inception.__doc__ or "")


def _shuffle_v1_unit(b: GraphBuilder, x: str, groups: int, name: str) -> str:
    c = b.shape(x)[1]
    mid = c // 4
    with b.scope(name):
        y = b.conv_bn_act(x, mid, 1, group=groups, name="gconv1")
        y = b.channel_shuffle(y, groups)
        y = b.conv_bn_act(y, mid, 3, group=mid, act=None, name="dw")
        y = b.conv_bn_act(y, c, 1, group=groups, act=None, gamma=RESIDUAL_GAMMA, name="gconv2")
        return b.relu(b.add(x, y))


def _shuffle_v2_unit(b: GraphBuilder, x: str, name: str) -> str:
    c = b.shape(x)[1]
    with b.scope(name):
        left, right = b.split(x, [c // 2, c // 2], axis=1)
        y = b.conv_bn_act(right, c // 2, 1, name="pw1")
        y = b.conv_bn_act(y, c // 2, 3, group=c // 2, act=None, name="dw")
        y = b.conv_bn_act(y, c // 2, 1, name="pw2")
        return b.channel_shuffle(b.concat([left, y], axis=1), 2)


def _shuffle_v2_down(b: GraphBuilder, x: str, cout: int, name: str) -> str:
    cin, half = b.shape(x)[1], cout // 2
    with b.scope(name):
        left = b.conv_bn_act(x, cin, 3, stride=2, group=cin, act=None, name="left_dw")
        left = b.conv_bn_act(left, half, 1, name="left_pw")
        right = b.conv_bn_act(x, half, 1, name="right_pw1")
        right = b.conv_bn_act(right, half, 3, stride=2, group=half, act=None, name="right_dw")
        right = b.conv_bn_act(right, half, 1, name="right_pw2")
        return b.channel_shuffle(b.concat([left, right], axis=1), 2)


def shufflenet(
    *,
    batch: int = 1,
    size: int = 32,
    num_classes: int = 10,
    groups: int = 4,
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """ShuffleNet v1 + v2 units: stem 3x3 Conv-BN-ReLU (32); a v1 unit (grouped 1x1 conv with
    `groups` groups, channel shuffle, 3x3 depthwise, grouped 1x1, residual Add, ReLU); a v2
    downsampling unit (two stride-2 branches, Concat, shuffle g=2) to 64 channels; two v2 units
    (Split into halves, 1x1 -> depthwise 3x3 -> 1x1 on one half, Concat, shuffle); 1x1
    Conv-BN-ReLU to 128, GlobalAveragePool, Flatten, Gemm.

    Channel shuffle is exported the torchvision way: Reshape(n, g, c/g, h, w) ->
    Transpose(0, 2, 1, 3, 4) -> Reshape(n, c, h, w).

    Exercises: grouped (non-depthwise) convolution, 5-D Reshape/Transpose between quantized
    convs (precision-preserving ops the dequantize must move through), Split, Concat of an
    untouched half with a computed half (different scales), depthwise stride 2.
    """
    b = GraphBuilder("shufflenet", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    x = b.conv_bn_act(x, 32, 3, name="stem")
    x = _shuffle_v1_unit(b, x, groups, "stage1.0")
    x = _shuffle_v2_down(b, x, 64, "stage2.0")
    x = _shuffle_v2_unit(b, x, "stage2.1")
    x = _shuffle_v2_unit(b, x, "stage2.2")
    x = b.conv_bn_act(x, 128, 1, name="conv5")
    _classifier_head(b, x, num_classes)
    return b.build(doc=shufflenet.__doc__ or "")


def _double_conv(b: GraphBuilder, x: str, c: int, name: str) -> str:
    with b.scope(name):
        return b.conv_bn_act(b.conv_bn_act(x, c, 3, name="conv1"), c, 3, name="conv2")


def unet(
    *, batch: int = 1, size: int = 32, num_classes: int = 2, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """U-Net with three levels: encoder double-convs (Conv-BN-ReLU x2) with 16, 32, 64 channels
    separated by 2x2 MaxPool, bottleneck double-conv (64) at 1/8 resolution; decoder:
    level 3 upsamples with ConvTranspose(k=2, stride 2), level 2 with Resize(nearest, x2,
    asymmetric/floor), level 1 with Resize(linear, x2, half_pixel); each upsampled tensor is
    Concat'ed with the encoder feature of the same resolution (skip connection) and followed by
    a double-conv; final 1x1 Conv (with bias) to `num_classes` channels. Output ``mask`` of
    shape (batch, num_classes, size, size).

    Exercises: ConvTranspose (deconvolution, its own weight layout [Cin, Cout, k, k]), nearest
    and bilinear Resize on quantized tensors, Concat of a decoder tensor and an encoder tensor
    with different scales, a plain Conv with bias and no activation at the output.
    """
    b = GraphBuilder("unet", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    e1 = _double_conv(b, x, 16, "enc1")
    e2 = _double_conv(b, b.maxpool(e1, 2), 32, "enc2")
    e3 = _double_conv(b, b.maxpool(e2, 2), 64, "enc3")
    mid = _double_conv(b, b.maxpool(e3, 2), 64, "bottleneck")
    with b.scope("up3"):
        u = b.conv_transpose(mid, 64, 2, stride=2)
        d = _double_conv(b, b.concat([u, e3]), 32, "dec3")
    with b.scope("up2"):
        u = b.resize(d, 2, mode="nearest")
        d = _double_conv(b, b.concat([u, e2]), 16, "dec2")
    with b.scope("up1"):
        u = b.resize(d, 2, mode="linear")
        d = _double_conv(b, b.concat([u, e1]), 16, "dec1")
    with b.scope("out"):
        b.output(b.conv(d, num_classes, 1, gain=1.0), "mask")
    return b.build(doc=unet.__doc__ or "")
