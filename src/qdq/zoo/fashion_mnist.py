"""Fashion-MNIST, offline: an IDX reader, the data splits and a small pretrained ResNet.

The data come from the Debian package ``dataset-fashion-mnist`` (``make data`` installs it), which
puts the four gzipped IDX files in ``/usr/share/datasets/fashion-mnist/``. Set the environment
variable ``QDQ_FASHION_MNIST_DIR`` to read them from somewhere else.

The model, :class:`ResNetish`, is a three-block ResNet of about 78k parameters whose forward is
``torch.fx`` traceable; its weights ship with the package (``zoo/weights/fashion_resnet.pt``,
produced by ``scripts/train_fashion_mnist.py``) and reach about 92% top-1 on the test split.

Example:
    >>> from qdq.zoo import fashion_mnist as fm
    >>> images, labels = fm.load_split("test")
    >>> images.shape, labels.dtype
    (torch.Size([10000, 1, 28, 28]), torch.int64)
    >>> model = fm.load_pretrained()
    >>> fm.evaluate(model, images, labels) > 0.91
    True
"""

from __future__ import annotations

import functools
import gzip
import itertools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = [
    "CLASSES",
    "DEFAULT_DIR",
    "DEFAULT_WEIGHTS",
    "ENV_DIR",
    "MEAN",
    "STD",
    "BasicBlock",
    "ResNetish",
    "calibration_batches",
    "data_dir",
    "evaluate",
    "load_pretrained",
    "load_split",
    "read_idx",
]

#: The ten class names, indexed by label.
CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

#: Fixed normalization constants (pixel values scaled to [0, 1] first).
MEAN = 0.2860
STD = 0.3530

#: Where the Debian package ``dataset-fashion-mnist`` installs the IDX files.
DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
#: Environment variable that overrides :data:`DEFAULT_DIR`.
ENV_DIR = "QDQ_FASHION_MNIST_DIR"
#: The packaged checkpoint (a plain ``state_dict``) of :class:`ResNetish`.
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "fashion_resnet.pt"

_SPLIT_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# IDX type codes (third byte of the magic number) → big-endian numpy dtype.
_IDX_DTYPES: dict[int, str] = {
    0x08: ">u1",
    0x09: ">i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}

_GZIP_MAGIC = b"\x1f\x8b"


# --------------------------------------------------------------------------------------------
# IDX files
# --------------------------------------------------------------------------------------------


def read_idx(path: str | Path, *, expect_ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (gzipped or not) into a numpy array.

    The format is a 4-byte magic number ``00 00 TT NN`` (``TT`` the element type, ``NN`` the
    number of dimensions), ``NN`` big-endian uint32 sizes, then the data in C order.

    Args:
        path: the file; gzip compression is detected from its first bytes, not its name.
        expect_ndim: if given, the number of dimensions the file must declare.

    Returns:
        The array, in native byte order, with the shape the header declares.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not valid IDX (bad magic number, unknown element type, wrong
            number of dimensions, or a data size that does not match the header); the message
            names the file.

    Example:
        >>> labels = read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
        >>> labels.shape, labels.dtype
        ((10000,), dtype('uint8'))
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: corrupt gzip data ({exc})") from exc
    if len(raw) < 4:
        raise ValueError(f"{path}: too short to be an IDX file ({len(raw)} bytes)")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{raw[:4].hex()} (the first two bytes must be zero)"
        )
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX element type 0x{type_code:02x}")
    if expect_ndim is not None and ndim != expect_ndim:
        raise ValueError(f"{path}: expected an IDX file of {expect_ndim} dimensions, got {ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, need {header})")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(
            f"{path}: IDX header declares shape {shape} ({expected} bytes in all) "
            f"but the file holds {len(raw)} bytes"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


# --------------------------------------------------------------------------------------------
# Data splits
# --------------------------------------------------------------------------------------------


def data_dir(root: str | Path | None = None) -> Path:
    """The directory the IDX files are read from.

    ``root`` if given, else ``$QDQ_FASHION_MNIST_DIR`` if set and non-empty, else
    :data:`DEFAULT_DIR`.

    Example:
        >>> data_dir("/tmp/fm")
        PosixPath('/tmp/fm')
    """
    if root is not None:
        return Path(root)
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else DEFAULT_DIR


def _find(directory: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}.gz not found in {directory}; run `make data` (it does "
        f"`apt-get install dataset-fashion-mnist`) or set {ENV_DIR} to a directory holding it"
    )


@functools.lru_cache(maxsize=4)
def _read_split_cached(
    images_path: Path, labels_path: Path, _stamp: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path, expect_ndim=3)
    labels = read_idx(labels_path, expect_ndim=1)
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise ValueError(
            f"{images_path} / {labels_path}: expected uint8 IDX data, "
            f"got {images.dtype} / {labels.dtype}"
        )
    if images.shape[1:] != (28, 28):
        raise ValueError(f"{images_path}: expected 28x28 images, got {images.shape[1:]}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds "
            f"{labels.shape[0]} labels"
        )
    if labels.size and int(labels.max()) >= len(CLASSES):
        raise ValueError(f"{labels_path}: label {int(labels.max())} is out of range 0..9")
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def load_split(
    split: str = "test", root: str | Path | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load a Fashion-MNIST split as normalized tensors.

    Args:
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000 images).
        root: directory holding the IDX files; defaults to ``$QDQ_FASHION_MNIST_DIR`` or
            ``/usr/share/datasets/fashion-mnist``.

    Returns:
        ``(images, labels)``: float32 images of shape ``(N, 1, 28, 28)``, normalized as
        ``(pixel / 255 - MEAN) / STD``, and int64 labels of shape ``(N,)`` in ``0..9``. The
        tensors are fresh copies each call, so callers may modify them.

    Raises:
        ValueError: ``split`` is unknown, or a file is malformed.
        FileNotFoundError: the files are missing (run ``make data``).

    Example:
        >>> images, labels = load_split("test")
        >>> images.shape, images.dtype, labels.dtype
        (torch.Size([10000, 1, 28, 28]), torch.float32, torch.int64)
    """
    if split not in _SPLIT_FILES:
        raise ValueError(f"split must be one of {sorted(_SPLIT_FILES)}, got {split!r}")
    directory = data_dir(root)
    images_path, labels_path = (_find(directory, stem) for stem in _SPLIT_FILES[split])
    si, sl = images_path.stat(), labels_path.stat()
    stamp = (si.st_mtime_ns, si.st_size, sl.st_mtime_ns, sl.st_size)
    images_u8, labels_u8 = _read_split_cached(images_path.resolve(), labels_path.resolve(), stamp)
    images = torch.from_numpy(images_u8.astype(np.float32)).unsqueeze(1)
    images.div_(255.0).sub_(MEAN).div_(STD)
    labels = torch.from_numpy(labels_u8.astype(np.int64))
    return images, labels


def calibration_batches(
    num_batches: int = 8, batch_size: int = 32, seed: int = 0, root: str | Path | None = None
) -> list[torch.Tensor]:
    """Random, reproducible batches of training images for INT8 calibration.

    The ``num_batches * batch_size`` images are drawn without replacement from the train split
    (never the test split, which is kept for evaluation).

    Args:
        num_batches: how many batches.
        batch_size: images per batch.
        seed: seed of the sample; the same seed gives the same batches.
        root: as for :func:`load_split`.

    Returns:
        ``num_batches`` float32 tensors of shape ``(batch_size, 1, 28, 28)``, normalized like
        :func:`load_split`.

    Raises:
        ValueError: a count is not a positive int, or more images are asked for than the train
            split holds.

    Example:
        >>> batches = calibration_batches(num_batches=2, batch_size=4)
        >>> len(batches), batches[0].shape
        (2, torch.Size([4, 1, 28, 28]))
    """
    for name, value in (("num_batches", num_batches), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    images, _ = load_split("train", root)
    total = num_batches * batch_size
    if total > images.shape[0]:
        raise ValueError(
            f"num_batches * batch_size = {total} exceeds the {images.shape[0]} training images"
        )
    generator = torch.Generator().manual_seed(seed)
    index = torch.randperm(images.shape[0], generator=generator)[:total]
    return [images[chunk].clone() for chunk in index.split(batch_size)]


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the (projected) input, then ReLU.

    The residual add is the functional ``out + identity`` (no ``nn.Module``) on purpose, so that
    quantization passes must find it in the graph.

    Args:
        in_ch: input channels.
        out_ch: output channels.
        stride: stride of the first convolution; a 1x1 conv + BN projects the input when the
            stride or channel count changes.

    Example:
        >>> BasicBlock(16, 32, stride=2)(torch.zeros(1, 16, 28, 28)).shape
        torch.Size([1, 32, 14, 14])
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(out_ch, out_ch)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu2 = nn.ReLU()
        self.downsample: nn.Sequential | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        out = out + identity
        return self.relu2(out)


class ResNetish(nn.Module):
    """A small ResNet for 1x28x28 inputs (77,754 parameters).

    Stem conv3x3(1→16)-BN-ReLU, basic blocks 16→16 (stride 1), 16→32 (stride 2) and
    32→64 (stride 2), global average pooling, ``torch.flatten`` and ``Linear(64, num_classes)``.
    The forward has no data-dependent control flow, so ``torch.fx.symbolic_trace`` works.

    Args:
        num_classes: number of output logits.

    Example:
        >>> model = ResNetish()
        >>> sum(p.numel() for p in model.parameters())
        77754
        >>> model(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = _conv3x3(1, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = BasicBlock(16, 16, stride=1)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.layer3 = BasicBlock(32, 64, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def load_pretrained(path: str | Path | None = None) -> ResNetish:
    """The pretrained :class:`ResNetish`, on the CPU and in eval mode.

    Args:
        path: a ``state_dict`` checkpoint; defaults to the packaged
            ``qdq/zoo/weights/fashion_resnet.pt``.

    Raises:
        FileNotFoundError: the checkpoint does not exist.
        ValueError: the checkpoint is not a ``state_dict`` matching :class:`ResNetish`.

    Example:
        >>> model = load_pretrained()
        >>> model.training
        False
    """
    path = DEFAULT_WEIGHTS if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Fashion-MNIST checkpoint {path} not found; "
            "run `python scripts/train_fashion_mnist.py` to produce it"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state_dict, got {type(state).__name__}")
    model = ResNetish()
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(f"{path}: not a ResNetish state_dict ({exc})") from exc
    return model.eval()


@torch.no_grad()
def evaluate(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 500
) -> float:
    """Top-1 accuracy of ``model`` on ``(images, labels)``, in eval mode and without gradients.

    The model's previous train/eval mode is restored afterwards. Batches are moved to the device
    of the model's first parameter (or buffer), if it has any.

    Args:
        model: maps a batch of images to logits of shape ``(batch, classes)``.
        images: inputs, batched along the first dimension.
        labels: integer class labels, one per image.
        batch_size: images per forward pass.

    Returns:
        The fraction of images whose arg-max logit equals the label, in ``[0, 1]``.

    Raises:
        ValueError: ``images`` and ``labels`` differ in length, the set is empty, or
            ``batch_size`` is not a positive int.

    Example:
        >>> images, labels = load_split("test")
        >>> round(evaluate(load_pretrained(), images, labels), 2)  # doctest: +SKIP
        0.92
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"images and labels differ in length: {images.shape[0]} vs {labels.shape[0]}"
        )
    if images.shape[0] == 0:
        raise ValueError("cannot evaluate on an empty set of images")
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = images.device if first is None else first.device
    was_training = model.training
    model.eval()
    try:
        correct = 0
        for start in range(0, images.shape[0], batch_size):
            x = images[start : start + batch_size].to(device)
            y = labels[start : start + batch_size].to(device)
            correct += int((model(x).argmax(dim=1) == y).sum())
    finally:
        model.train(was_training)
    return correct / images.shape[0]
