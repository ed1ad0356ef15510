"""Plain and residual CNN classifiers: resnet, resnet50, vgg, mobilenetv2.

Every builder returns a float `onnx.ModelProto` (opset 17 unless `opset=` says otherwise) whose
graph is what `torch.onnx.export` writes for the equivalent torchvision-style module in eval
mode *without* constant folding of BatchNorm: Conv(bias=False) -> BatchNormalization -> act,
GlobalAveragePool -> Flatten -> Gemm(transB=1). Input name ``input``, output name ``logits``.
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

# A residual branch ends in a BatchNorm with small gamma (the "zero-init last BN" idea, softened)
# so that the variance of x + f(x) grows slowly with depth instead of doubling per block.
RESIDUAL_GAMMA = (0.2, 0.5)


def _classifier_head(b: GraphBuilder, x: str, num_classes: int) -> None:
    with b.scope("head"):
        x = b.flatten(b.global_avgpool(x))
        b.output(b.gemm(x, num_classes, gain=1.0, name="fc"), "logits")


def _basic_block(b: GraphBuilder, x: str, cout: int, stride: int, name: str) -> str:
    cin = b.shape(x)[1]
    with b.scope(name):
        y = b.conv_bn_act(x, cout, 3, stride=stride, name="conv1")
        y = b.conv_bn_act(y, cout, 3, act=None, gamma=RESIDUAL_GAMMA, name="conv2")
        if stride != 1 or cin != cout:
            x = b.conv_bn_act(x, cout, 1, stride=stride, act=None, name="downsample")
        return b.relu(b.add(y, x))


def resnet(
    *,
    batch: int = 1,
    size: int = 32,
    num_classes: int = 10,
    widths: tuple[int, ...] = (16, 32),
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """ResNet with BasicBlocks: stem Conv-BN-ReLU, then per stage two BasicBlocks
    (Conv-BN-ReLU, Conv-BN, residual Add, ReLU); every stage after the first starts with a
    stride-2 block whose shortcut is a 1x1 stride-2 Conv-BN projection. GlobalAveragePool,
    Flatten, Gemm.

    Exercises: BN folding, Conv+ReLU fusion, the residual Add as a `sum` post-op (with ReLU
    after the sum), the two Add inputs arriving with different scales (identity vs. projection
    shortcut), 1x1 strided conv, the Gemm head.
    """
    b = GraphBuilder("resnet", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    x = b.conv_bn_act(x, widths[0], 3, name="stem")
    for i, w in enumerate(widths):
        for j in range(2):
            stride = 2 if (i > 0 and j == 0) else 1
            x = _basic_block(b, x, w, stride, f"layer{i + 1}.{j}")
    _classifier_head(b, x, num_classes)
    return b.build(doc=resnet.__doc__ or "")


def _bottleneck(b: GraphBuilder, x: str, width: int, stride: int, name: str) -> str:
    cin, cout = b.shape(x)[1], width * 4
    with b.scope(name):
        y = b.conv_bn_act(x, width, 1, name="conv1")
        y = b.conv_bn_act(y, width, 3, stride=stride, name="conv2")  # torchvision v1.5
        y = b.conv_bn_act(y, cout, 1, act=None, gamma=RESIDUAL_GAMMA, name="conv3")
        if stride != 1 or cin != cout:
            x = b.conv_bn_act(x, cout, 1, stride=stride, act=None, name="downsample")
        return b.relu(b.add(y, x))


def resnet50(
    *, batch: int = 1, size: int = 224, num_classes: int = 1000, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """ResNet-50 (torchvision v1.5 layout) at full size, for benchmarks: 7x7/2 stem Conv-BN-ReLU,
    3x3/2 MaxPool, bottleneck blocks [3, 4, 6, 3] (1x1 reduce, 3x3 with the stage stride, 1x1
    expand x4, residual Add, ReLU; 1x1 strided projection on the first block of each stage),
    widths 64..2048, GlobalAveragePool, Flatten, Gemm 2048 -> 1000. Input 1x3x224x224,
    about 25.6 M parameters and 4.1 GMAC.

    Exercises: everything `resnet` does, at a size where fusion and layout choices show up in
    the timings; MaxPool with padding; large-K 1x1 convs.
    """
    b = GraphBuilder("resnet50", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    with b.scope("stem"):
        x = b.conv_bn_act(x, 64, 7, stride=2, name="conv1")
        x = b.maxpool(x, 3, 2, pad=1)
    for i, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for j in range(blocks):
            stride = 2 if (i > 0 and j == 0) else 1
            x = _bottleneck(b, x, width, stride, f"layer{i + 1}.{j}")
    _classifier_head(b, x, num_classes)
    return b.build(doc=resnet50.__doc__ or "")


def vgg(
    *, batch: int = 1, size: int = 32, num_classes: int = 10, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """VGG-style: [Conv(bias)-ReLU x2, MaxPool] x2 with 16 then 32 channels, Flatten,
    Gemm-ReLU (hidden 64), Gemm; Gemms with transB=1 as PyTorch exports nn.Linear. No BatchNorm.

    Exercises: convs that carry their own bias (int32 bias initializers in the QDQ model),
    Conv+ReLU fusion, MaxPool moved across the dequantize, Flatten of a 4-D feature map into a
    large-K Gemm, Gemm+ReLU fusion.
    """
    b = GraphBuilder("vgg", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    for i, c in enumerate((16, 32)):
        with b.scope(f"features{i + 1}"):
            x = b.relu(b.conv(x, c, 3))
            x = b.relu(b.conv(x, c, 3))
            x = b.maxpool(x, 2)
    with b.scope("classifier"):
        x = b.flatten(x)
        x = b.relu(b.gemm(x, 64, name="fc1"))
        b.output(b.gemm(x, num_classes, gain=1.0, name="fc2"), "logits")
    return b.build(doc=vgg.__doc__ or "")


def _inverted_residual(
    b: GraphBuilder, x: str, cout: int, stride: int, expand: int, name: str
) -> str:
    cin = b.shape(x)[1]
    hidden = cin * expand
    with b.scope(name):
        y = x
        if expand != 1:
            y = b.conv_bn_act(y, hidden, 1, act="relu6", name="expand")
        y = b.conv_bn_act(y, hidden, 3, stride=stride, group=hidden, act="relu6", name="dw")
        use_res = stride == 1 and cin == cout
        y = b.conv_bn_act(
            y, cout, 1, act=None, gamma=RESIDUAL_GAMMA if use_res else (0.5, 1.5), name="project"
        )
        return b.add(x, y) if use_res else y


def mobilenetv2(
    *, batch: int = 1, size: int = 32, num_classes: int = 10, seed: int = 0, opset: int = 17
) -> onnx.ModelProto:
    """MobileNetV2-style: stem 3x3 Conv-BN-Clip(0,6), inverted residual blocks
    (t, c, n, s) = (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2) — 1x1 expand Conv-BN-Clip(0,6),
    3x3 depthwise (group = channels) Conv-BN-Clip(0,6), 1x1 project Conv-BN (linear bottleneck),
    residual Add when stride 1 and channels match — then 1x1 Conv-BN-Clip(0,6) to 128,
    GlobalAveragePool, Flatten, Gemm.

    Exercises: depthwise convolution, Clip(0,6) (ReLU6) fusion, a residual Add with no
    activation after it, strided depthwise, per-channel weight scales with very different
    ranges across channels (depthwise kernels have fan-in 9).
    """
    b = GraphBuilder("mobilenetv2", opset=opset, seed=seed)
    x = b.input("input", (batch, 3, size, size))
    x = b.conv_bn_act(x, 16, 3, act="relu6", name="stem")
    for i, (t, c, n, s) in enumerate(((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2))):
        for j in range(n):
            x = _inverted_residual(b, x, c, s if j == 0 else 1, t, f"features{i + 1}.{j}")
    x = b.conv_bn_act(x, 128, 1, act="relu6", name="last")
    _classifier_head(b, x, num_classes)
    return b.build(doc=mobilenetv2.__doc__ or "")
