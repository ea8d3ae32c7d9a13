"""YOLOv5/v8-style and CenterNet-style building blocks, written from scratch for the tests.

The blocks follow the public YOLOv5/YOLOv8 architecture descriptions (Conv-BN-SiLU, C3, C2f, SPPF,
a nearest-upsample + Concat neck, 1x1 detection heads) and the CenterNet "ResNet + deconv" head, at a
size that runs in milliseconds on a CPU for 64x64 inputs. They are plain ``nn.Module`` code that
torch.fx can trace (no data-dependent control flow).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "C3",
    "SPPF",
    "Bottleneck",
    "C2f",
    "CenterNetStyleNet",
    "Conv",
    "Detect",
    "YoloStyleNet",
]


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + SiLU, 'same' padding for odd kernels."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    """1x1 (or 3x3) Conv → 3x3 Conv, plus a residual Add when ``shortcut`` and shapes allow."""

    def __init__(
        self, c1: int, c2: int, shortcut: bool = True, e: float = 0.5, k1: int = 1
    ) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, k1)
        self.cv2 = Conv(c_, c2, 3)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """YOLOv5 C3: two 1x1 branches, Bottlenecks on one, Concat, 1x1 fuse."""

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        c_ = c2 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c1, c_, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C2f(nn.Module):
    """YOLOv8 C2f: 1x1 Conv, split in two (``chunk`` or ``split``), Bottlenecks on the last part,
    Concat of every intermediate, 1x1 fuse."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = False, use_split: bool = False
    ) -> None:
        super().__init__()
        self.c = c2 // 2
        self.use_split = use_split
        self.cv1 = Conv(c1, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c2, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, e=1.0, k1=3) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.cv1(x)
        parts = t.split((self.c, self.c), 1) if self.use_split else t.chunk(2, 1)
        y = [parts[0], parts[1]]
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: one MaxPool2d(5, 1, 2) applied three times in series (as in
    YOLOv5/v8, the same module object), Concat of the four tensors, 1x1 fuse."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1)
        self.cv2 = Conv(c_ * 4, c2, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        y3 = self.m(y2)
        return self.cv2(torch.cat((x, y1, y2, y3), 1))


class Detect(nn.Module):
    """1x1 conv heads (with bias) per level; eval output ``(batch, anchors, 5 + classes)``."""

    def __init__(self, nc: int, ch: tuple[int, ...], na: int = 3) -> None:
        super().__init__()
        self.na, self.no = na, nc + 5
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * na, 1) for c in ch)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        out = []
        for x, m in zip(xs, self.m, strict=True):
            y = m(x)
            b, _, h, w = y.shape
            y = y.view(b, self.na, self.no, h, w).permute(0, 1, 3, 4, 2)
            out.append(y.reshape(b, -1, self.no))
        return torch.cat(out, 1)


class YoloStyleNet(nn.Module):
    """A tiny YOLOv5/v8 hybrid for 64x64 inputs.

    Backbone: Conv s2 → Conv s2 → C3 (residual) → Conv s2 → C2f (chunk, residual) [P3, 8x8]
    → Conv s2 → C2f (split, residual) [P4, 4x4] → Conv s2 → SPPF [P5, 2x2].
    Neck (PAN): Upsample(P5) ⧺ P4 → C2f → Upsample ⧺ P3 → C3 [N3] → Conv s2 ⧺ N4 → C2f [N4'].
    Head: :class:`Detect` on (N3, N4').
    """

    def __init__(self, nc: int = 3) -> None:
        super().__init__()
        self.stem = Conv(3, 16, 3, 2)
        self.down1 = Conv(16, 32, 3, 2)
        self.c3_1 = C3(32, 32, n=1, shortcut=True)
        self.down2 = Conv(32, 64, 3, 2)
        self.c2f_p3 = C2f(64, 64, n=1, shortcut=True)
        self.down3 = Conv(64, 96, 3, 2)
        self.c2f_p4 = C2f(96, 96, n=1, shortcut=True, use_split=True)
        self.down4 = Conv(96, 128, 3, 2)
        self.sppf = SPPF(128, 128)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck_c2f = C2f(128 + 96, 96, n=1, shortcut=False)
        self.neck_c3 = C3(96 + 64, 64, n=1, shortcut=False)
        self.pan_down = Conv(64, 64, 3, 2)
        self.pan_c2f = C2f(64 + 96, 96, n=1, shortcut=False)
        self.detect = Detect(nc, (64, 96))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c3_1(self.down1(self.stem(x)))
        p3 = self.c2f_p3(self.down2(x))
        p4 = self.c2f_p4(self.down3(p3))
        p5 = self.sppf(self.down4(p4))
        n4 = self.neck_c2f(torch.cat((self.up(p5), p4), 1))
        n3 = self.neck_c3(torch.cat((self.up(n4), p3), 1))
        n4b = self.pan_c2f(torch.cat((self.pan_down(n3), n4), 1))
        return self.detect([n3, n4b])


class _ConvBNReLU(nn.Sequential):
    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1) -> None:
        super().__init__(
            nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.ReLU(inplace=True)
        )


class _BasicBlock(nn.Module):
    """ResNet basic block (conv-bn-relu, conv-bn, + identity or 1x1 projection, relu)."""

    def __init__(self, c1: int, c2: int, s: int = 1) -> None:
        super().__init__()
        self.conv1 = _ConvBNReLU(c1, c2, 3, s)
        self.conv2 = nn.Conv2d(c2, c2, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c2)
        self.down = (
            nn.Sequential(nn.Conv2d(c1, c2, 1, s, bias=False), nn.BatchNorm2d(c2))
            if s != 1 or c1 != c2
            else None
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        return self.relu(self.bn2(self.conv2(self.conv1(x))) + identity)


class CenterNetStyleNet(nn.Module):
    """CenterNet ("Objects as Points", ResNet + deconv variant) at toy size.

    Backbone to stride 32, three [3x3 Conv-BN-ReLU, ConvTranspose2d(4, 2, 1)-BN-ReLU] stages back
    to stride 4, and three heads (3x3 Conv-ReLU, 1x1 Conv): class heatmap (sigmoid), box size and
    centre offset. Returns ``{"hm": ..., "wh": ..., "reg": ...}``.
    """

    def __init__(self, num_classes: int = 4, head_conv: int = 32) -> None:
        super().__init__()
        self.stem = _ConvBNReLU(3, 16, 3, 2)  # 32x32
        self.layer1 = _BasicBlock(16, 32, 2)  # 16x16
        self.layer2 = _BasicBlock(32, 64, 2)  # 8x8
        self.layer3 = _BasicBlock(64, 96, 2)  # 4x4
        self.layer4 = _BasicBlock(96, 128, 2)  # 2x2
        deconv: list[nn.Module] = []
        c = 128
        for out in (64, 48, 32):
            deconv += [
                _ConvBNReLU(c, out, 3, 1),
                nn.ConvTranspose2d(out, out, 4, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
            ]
            c = out
        self.deconv = nn.Sequential(*deconv)  # 16x16 (stride 4)
        self.hm = self._head(c, head_conv, num_classes)
        self.wh = self._head(c, head_conv, 2)
        self.reg = self._head(c, head_conv, 2)
        self.hm[-1].bias.data.fill_(-2.19)  # CenterNet's focal-loss prior

    @staticmethod
    def _head(c: int, mid: int, out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c, mid, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(mid, out, 1)
        )

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(x)))))
        x = self.deconv(x)
        return {"hm": torch.sigmoid(self.hm(x)), "wh": self.wh(x), "reg": self.reg(x)}
