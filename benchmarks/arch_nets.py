"""Small published architectures that neither torchvision nor timm builds, written from their
papers for arch_sweep.py (``net_<name>``): the patterns they bring (a raw-audio front end, a
sub-pixel upsampler, a U-Net's odd-sized skips, a causal decoder) matter more than their size.

- ``net_espcn``: ESPCN (Shi et al., "Real-Time Single Image and Video Super-Resolution Using an
  Efficient Sub-Pixel Convolutional Neural Network", 2016): 5x5 and 3x3 convolutions with tanh,
  a PixelShuffle (DepthToSpace) by 3.
- ``net_srres``: an EDSR / ESRGAN-style upsampler (Lim et al. 2017, Wang et al. 2018):
  residual blocks scaled by 0.2 with LeakyReLU, two nearest x2 enlargements.
- ``net_unet_<bilinear|nearest|pad>``: U-Net (Ronneberger et al. 2015) on 100 x 140 with
  transposed-convolution upsampling; its 25 x 35 → 12 x 17 → 24 x 34 path meets its skip after
  a resize to the skip's size (bilinear, nearest: non-integer factors) or a pad.
- ``net_audio1d``: M5 (Dai et al., "Very Deep Convolutional Neural Networks for Raw
  Waveforms", 2017): a Conv1d of one channel, kernel 80, stride 4 over 16000 samples, then
  BatchNorm / ReLU / MaxPool stages and a LogSoftmax head.
- ``net_gpt``: a GPT-2-style causal decoder over embeddings (Radford et al. 2019): pre-norm
  blocks, a lower-triangular mask applied with ``masked_fill(-inf)`` (ONNX Where), GELU with
  the tanh approximation.
- ``net_tcn``: a temporal convolutional network (Bai et al. 2018): dilated causal Conv1d
  residual blocks, the causality as left pads.
- ``net_conformer``: Conformer blocks (Gulati et al. 2020) after a Conv2d subsampling of
  80-bin features: half-step feed-forward with SiLU, the convolution module (pointwise, GLU,
  depthwise Conv1d of kernel 31, BatchNorm1d, SiLU, pointwise).
- ``net_wavenet``: WaveNet-style gated units (van den Oord et al. 2016): dilated causal
  Conv1d pairs through tanh · sigmoid, residual and summed skip connections.
- ``net_gru``: a keyword-spotting-style recurrent classifier: a Conv1d over 40 features, a
  GRU of 96 hidden units over 100 frames (PyTorch's, linear before reset), a Linear head.
- ``net_bert``: a BERT-style encoder (Devlin et al. 2019) over int64 token ids and attention
  mask (``NET_INPUTS``, fed by ``feeds``): an embedding Gather, the mask extended as Hugging
  Face writes it (``masked_fill`` of the inverted mask with the dtype's minimum, added to the
  scores), post-norm blocks with erf GELU, a classifier on the first token.
"""

from __future__ import annotations

from typing import Any

NET_MODELS = ("net_espcn", "net_srres", "net_unet_bilinear", "net_unet_nearest", "net_unet_pad",
              "net_audio1d", "net_gpt", "net_tcn", "net_conformer", "net_wavenet", "net_gru",
              "net_bert")
# graph input names of the models that take more than one input or integer ones
NET_INPUTS = {"net_bert": ("input_ids", "attention_mask")}
_VOCAB, _TOKENS = 1000, 32


def feeds(name: str, rng: Any) -> dict[str, Any]:
    """Inputs of the kind ``name`` (a key of NET_INPUTS) reads: token ids and a mask of ones
    then zeros (padding from a random length on)."""
    import numpy as np

    length = int(rng.integers(8, _TOKENS + 1))
    mask = (np.arange(_TOKENS) < length).astype(np.int64)[None]
    return {"input_ids": rng.integers(0, _VOCAB, (1, _TOKENS)).astype(np.int64),
            "attention_mask": mask}


def build(name: str) -> tuple[Any, Any]:
    """(module, example input) for ``name`` in NET_MODELS."""
    import torch

    if name == "net_espcn":
        return _espcn(), torch.randn(1, 3, 90, 120)
    if name == "net_srres":
        return _srres(), torch.randn(1, 3, 48, 64)
    if name.startswith("net_unet_"):
        mode = name.removeprefix("net_unet_")
        return _unet(None if mode == "pad" else mode), torch.randn(1, 3, 100, 140)
    if name == "net_audio1d":
        return _m5(), torch.randn(1, 1, 16000)
    if name == "net_gpt":
        return _gpt(), torch.randn(1, 48, 192)
    if name == "net_tcn":
        return _tcn(), torch.randn(1, 8, 400)
    if name == "net_conformer":
        return _conformer(), torch.randn(1, 1, 200, 80)
    if name == "net_wavenet":
        return _wavenet(), torch.randn(1, 1, 4000)
    if name == "net_gru":
        return _gru(), torch.randn(1, 40, 100)
    if name == "net_bert":
        example = {k: torch.from_numpy(v) for k, v in feeds(name, __import__("numpy").random
                                                               .default_rng(0)).items()}
        return _bert(), (example["input_ids"], example["attention_mask"])
    raise KeyError(f"unknown architecture {name!r}: one of {', '.join(NET_MODELS)}")


def _espcn(r: int = 3) -> Any:
    from torch import nn

    class ESPCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 64, 5, padding=2)
            self.c2 = nn.Conv2d(64, 32, 3, padding=1)
            self.c3 = nn.Conv2d(32, 3 * r * r, 3, padding=1)
            self.shuffle = nn.PixelShuffle(r)

        def forward(self, x: Any) -> Any:
            return self.shuffle(self.c3((self.c2(self.c1(x).tanh())).tanh()))

    return ESPCN()


def _srres(channels: int = 32, blocks: int = 4) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(channels, channels, 3, padding=1)
            self.b = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x: Any) -> Any:
            return x + 0.2 * self.b(F.leaky_relu(self.a(x), 0.2))

    class SRRes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Conv2d(3, channels, 3, padding=1)
            self.body = nn.Sequential(*[Block() for _ in range(blocks)])
            self.up1 = nn.Conv2d(channels, channels, 3, padding=1)
            self.up2 = nn.Conv2d(channels, channels, 3, padding=1)
            self.out = nn.Conv2d(channels, 3, 3, padding=1)

        def forward(self, x: Any) -> Any:
            f = self.head(x)
            f = f + self.body(f)
            for conv in (self.up1, self.up2):
                f = F.leaky_relu(conv(F.interpolate(f, scale_factor=2, mode="nearest")), 0.2)
            return self.out(f)

    return SRRes()


def _unet(mode: str | None) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    def double(i: int, o: int) -> Any:
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                             nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down = nn.ModuleList([double(3, 16), double(16, 32), double(32, 64)])
            self.middle = double(64, 128)
            self.ups = nn.ModuleList([nn.ConvTranspose2d(c, c // 2, 2, 2) for c in (128, 64, 32)])
            self.decode = nn.ModuleList([double(128, 64), double(64, 32), double(32, 16)])
            self.out = nn.Conv2d(16, 2, 1)

        def forward(self, x: Any) -> Any:
            skips = []
            for i, block in enumerate(self.down):
                x = block(x if i == 0 else F.max_pool2d(x, 2))
                skips.append(x)
            x = self.middle(F.max_pool2d(x, 2))
            for up, block, skip in zip(self.ups, self.decode, reversed(skips)):
                y = up(x)
                if y.shape[-2:] != skip.shape[-2:]:
                    if mode is None:
                        y = F.pad(y, [0, skip.shape[-1] - y.shape[-1], 0,
                                      skip.shape[-2] - y.shape[-2]])
                    else:
                        y = F.interpolate(y, size=skip.shape[-2:], mode=mode)
                x = block(torch.cat([y, skip], 1))
            return self.out(x)

    return UNet()


def _m5(classes: int = 35) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class M5(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            widths = (1, 64, 64, 128, 256)
            self.convs = nn.ModuleList([nn.Conv1d(1, 64, 80, stride=4)] + [
                nn.Conv1d(i, o, 3) for i, o in zip(widths[1:], widths[2:])])
            self.norms = nn.ModuleList(nn.BatchNorm1d(w) for w in widths[1:])
            self.fc = nn.Linear(256, classes)

        def forward(self, x: Any) -> Any:
            for conv, norm in zip(self.convs, self.norms):
                x = F.max_pool1d(F.relu(norm(conv(x))), 4)
            return F.log_softmax(self.fc(x.mean(-1)), -1)

    return M5()


def _gpt(dim: int = 192, heads: int = 4, layers: int = 3, tokens: int = 48,
         vocab: int = 500) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: Any, mask: Any) -> Any:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, heads, -1).transpose(1, 2)
                       for z in self.qkv(self.ln1(x)).split(d, 2))
            a = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            a = a.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.register_buffer("mask", torch.tril(torch.ones(tokens, tokens))
                                 .view(1, 1, tokens, tokens))

        def forward(self, x: Any) -> Any:
            x = x + self.pos
            for block in self.blocks:
                x = block(x, self.mask)
            return self.head(self.ln(x))

    return GPT()


def _tcn(channels: int = 64, levels: int = 5) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class TCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Conv1d(8, channels, 1)
            self.a = nn.ModuleList(nn.Conv1d(channels, channels, 3, dilation=2 ** i)
                                   for i in range(levels))
            self.b = nn.ModuleList(nn.Conv1d(channels, channels, 3, dilation=2 ** i)
                                   for i in range(levels))
            self.out = nn.Linear(channels, 10)

        def forward(self, x: Any) -> Any:
            x = self.inp(x)
            for i, (a, b) in enumerate(zip(self.a, self.b)):
                pad = 2 * 2 ** i
                y = F.relu(b(F.pad(F.relu(a(F.pad(x, (pad, 0)))), (pad, 0))))
                x = F.relu(x + y)
            return self.out(x[:, :, -1])

    return TCN()


def _conformer(dim: int = 144, kernel: int = 31, blocks: int = 2) -> Any:
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ff = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.SiLU(),
                                    nn.Linear(4 * dim, dim))
            self.ln = nn.LayerNorm(dim)
            self.pw1 = nn.Conv1d(dim, 2 * dim, 1)
            self.dw = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
            self.bn = nn.BatchNorm1d(dim)
            self.pw2 = nn.Conv1d(dim, dim, 1)

        def forward(self, x: Any) -> Any:
            x = x + 0.5 * self.ff(x)
            y = F.glu(self.pw1(self.ln(x).transpose(1, 2)), dim=1)
            return x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)

    class Conformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sub = nn.Sequential(nn.Conv2d(1, dim, 3, 2), nn.ReLU(),
                                     nn.Conv2d(dim, dim, 3, 2), nn.ReLU())
            self.lin = nn.Linear(dim * 19, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))

        def forward(self, x: Any) -> Any:  # [1, 1, 200 frames, 80 bins]
            x = self.sub(x)
            b, c, t, f = x.shape
            x = self.lin(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
            for block in self.blocks:
                x = block(x)
            return x

    return Conformer()


def _wavenet(channels: int = 32, layers: int = 6) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class WaveNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Conv1d(1, channels, 2)
            self.f = nn.ModuleList(nn.Conv1d(channels, channels, 2, dilation=2 ** i)
                                   for i in range(layers))
            self.g = nn.ModuleList(nn.Conv1d(channels, channels, 2, dilation=2 ** i)
                                   for i in range(layers))
            self.r = nn.ModuleList(nn.Conv1d(channels, channels, 1) for _ in range(layers))
            self.out = nn.Conv1d(channels, 256, 1)

        def forward(self, x: Any) -> Any:
            x = self.inp(F.pad(x, (1, 0)))
            skip = 0
            for i, (f, g, r) in enumerate(zip(self.f, self.g, self.r)):
                padded = F.pad(x, (2 ** i, 0))
                h = torch.tanh(f(padded)) * torch.sigmoid(g(padded))
                skip = skip + h
                x = x + r(h)
            return self.out(F.relu(skip))

    return WaveNet()


def _gru() -> Any:
    import torch.nn.functional as F
    from torch import nn

    class GRUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(40, 64, 3, padding=1)
            self.gru = nn.GRU(64, 96, batch_first=True)
            self.fc = nn.Linear(96, 12)

        def forward(self, x: Any) -> Any:
            y, _ = self.gru(F.relu(self.conv(x)).transpose(1, 2))
            return self.fc(y[:, -1])

    return GRUNet()


def _bert(dim: int = 128, heads: int = 4, layers: int = 2) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: Any, bias: Any) -> Any:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, heads, -1).transpose(1, 2)
                       for z in self.qkv(x).split(d, 2))
            a = ((q @ k.transpose(-2, -1)) / (q.size(-1) ** 0.5) + bias).softmax(-1)
            x = self.ln1(x + self.out((a @ v).transpose(1, 2).reshape(b, t, d)))
            return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))

    class BERT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(_VOCAB, dim)
            self.pos = nn.Parameter(torch.randn(1, _TOKENS, dim) * 0.02)
            self.ln = nn.LayerNorm(dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.cls = nn.Linear(dim, 2)

        def forward(self, ids: Any, mask: Any) -> Any:
            x = self.ln(self.embed(ids) + self.pos)
            inverted = 1.0 - mask[:, None, None, :].to(x.dtype)
            bias = inverted.masked_fill(inverted.to(torch.bool), torch.finfo(x.dtype).min)
            for block in self.blocks:
                x = block(x, bias)
            return self.cls(x[:, 0])

    return BERT()
