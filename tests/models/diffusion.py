"""Tiny diffusion-model blocks in plain torch, shaped like diffusers' (read, not copied): a
GroupNorm ResNet block with a time-embedding add and a 1x1 ``conv_shortcut``, a UNet whose up
path concatenates the down path's skips, a VAE decoder whose upsampler changes the channel
count before a ResNet block, and a shifted-window (Swin-style) attention block whose roll is a
``torch.roll`` (Slices and a Concat in both exporters' ONNX).

Channel counts stay at 16 or more so no conv is a small one (H02); every block is a few
thousand parameters, so planning, exporting and linting one takes seconds.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ResBlock", "ShiftedWindowBlock", "TinyDecoder", "TinyUNet"]


class ResBlock(nn.Module):
    """diffusers' ``ResnetBlock2D``: ``(shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))) +
    proj(silu(temb))))) / scale``, the shortcut a 1x1 conv when the channel count changes."""

    def __init__(self, cin: int, cout: int, temb: int | None = None, groups: int = 8) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.time_emb_proj = nn.Linear(temb, cout) if temb else None
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(self.act(self.norm1(x)))
        if self.time_emb_proj is not None and temb is not None:
            h = h + self.time_emb_proj(self.act(temb))[:, :, None, None]
        h = self.conv2(self.act(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return (x + h) / 1.0


class Upsample(nn.Module):
    """Nearest 2x upsampling, then a 3x3 conv."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class TinyUNet(nn.Module):
    """A two-level diffusion UNet: ``forward(sample, timestep)``. The timestep (a float per
    sample) goes through a sinusoidal embedding and an MLP; every ResNet block adds its
    projection. The down path keeps ``conv_in``'s output, each block's and the downsampler's
    output as skips; the up path concatenates them (``cat(h, skip)``), so a block input is read
    by its GroupNorm and its 1x1 ``conv_shortcut``."""

    def __init__(self, cin: int = 4, c: tuple[int, int] = (32, 64), temb: int = 64) -> None:
        super().__init__()
        c0, c1 = c
        self.half = c0 // 2
        self.linear_1 = nn.Linear(c0, temb)
        self.linear_2 = nn.Linear(temb, temb)
        self.conv_in = nn.Conv2d(cin, c0, 3, 1, 1)
        self.down0 = ResBlock(c0, c0, temb)
        self.downsample = nn.Conv2d(c0, c0, 3, 2, 1)
        self.down1 = ResBlock(c0, c1, temb)
        self.mid = ResBlock(c1, c1, temb)
        self.up0 = nn.ModuleList([ResBlock(c1 + c1, c1, temb), ResBlock(c1 + c0, c1, temb)])
        self.upsample = Upsample(c1)
        self.up1 = nn.ModuleList([ResBlock(c1 + c0, c0, temb), ResBlock(c0 + c0, c0, temb)])
        self.norm_out = nn.GroupNorm(8, c0)
        self.conv_out = nn.Conv2d(c0, cin, 3, 1, 1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(-math.log(10000.0) * torch.arange(self.half) / self.half)
        args = timestep.reshape(-1, 1).float() * freqs[None]
        temb = self.linear_2(F.silu(self.linear_1(torch.cat([args.sin(), args.cos()], dim=-1))))
        h = self.conv_in(sample)
        skips = [h]
        h = self.down0(h, temb)
        skips.append(h)
        h = self.downsample(h)
        skips.append(h)
        h = self.down1(h, temb)
        skips.append(h)
        h = self.mid(h, temb)
        for block in self.up0:
            h = block(torch.cat([h, skips.pop()], dim=1), temb)
        h = self.upsample(h)
        for block in self.up1:
            h = block(torch.cat([h, skips.pop()], dim=1), temb)
        return self.conv_out(F.silu(self.norm_out(h)))


class TinyDecoder(nn.Module):
    """A VAE decoder: ``conv_in``, a mid ResNet block, an up block (ResNet block, nearest 2x
    upsampler), a ResNet block that halves the channels (its ``conv_shortcut`` reads the
    upsampler's output, which its GroupNorm reads too), then ``norm_out``, SiLU, ``conv_out``."""

    def __init__(self, latent: int = 4, c: tuple[int, int] = (64, 32)) -> None:
        super().__init__()
        c0, c1 = c
        self.conv_in = nn.Conv2d(latent, c0, 3, 1, 1)
        self.mid = ResBlock(c0, c0)
        self.up = ResBlock(c0, c0)
        self.upsample = Upsample(c0)
        self.last = ResBlock(c0, c1)
        self.norm_out = nn.GroupNorm(8, c1)
        self.conv_out = nn.Conv2d(c1, 3, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.upsample(self.up(self.mid(self.conv_in(z))))
        return self.conv_out(F.silu(self.norm_out(self.last(h))))


class ShiftedWindowBlock(nn.Module):
    """A Swin block with shifted windows on channels-last ``(N, H, W, C)`` input: ``x +
    proj(attn(roll(norm1(x))))`` in windows, rolled back, then ``x + mlp(norm2(x))``. The roll
    sits right before the window partition (no Pad between), as in torchvision's Swin."""

    def __init__(self, c: int = 32, heads: int = 2, window: int = 4, shift: int = 2) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.norm2 = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 2 * c)
        self.fc2 = nn.Linear(2 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, h, w, c = x.shape
        ws, s = self.window, self.shift
        y = torch.roll(self.norm1(x), shifts=(-s, -s), dims=(1, 2))
        y = y.view(n, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        q, k, v = self.qkv(y).reshape(-1, ws * ws, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        y = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, ws * ws, c)
        y = self.proj(y).view(n, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        y = torch.roll(y.reshape(n, h, w, c), shifts=(s, s), dims=(1, 2))
        x = x + y
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
