"""Data specs for ``qdq quantize``: a built-in dataset, an image folder, a ``.npy``/``.npz`` file.

Every spec becomes a :class:`QuantData`: calibration samples, evaluation samples (never the same
ones) and, when the data has them, evaluation labels.

* **Built-in datasets** (``fashion-mnist``, ``skimage-photos``, ``crepe-tones``, ``lfw-faces-24``,
  ``lfw-faces-48``, ``rendered-text``): their own split (see :mod:`qdq.zoo.registry`), and for
  some a task metric with its ground truth. Without ``--data``, a zoo model uses its own dataset.
* **An image folder**: ``*.png``/``*.jpg``/... directly in it (no labels), or one sub-folder per class
  (``DIR/cat/1.png``; labels are the sorted sub-folder index, torchvision's ``ImageFolder``
  convention). Images are preprocessed as the zoo model does, or as the options say
  (``image_size`` is then required).
* **A text file** (``.txt``/``.tsv``) with a local tokenizer folder: one sample per line, the
  text or ``label<TAB>text``, tokenized to ``max_length`` tokens (:mod:`qdq.pipeline.text`).
* **``.npy``**: the input samples stacked along axis 0 (no labels). **``.npz``**: one array, or an
  input array named ``x``/``images``/``inputs``/``input``/``data``, or arrays named after the
  parameters of the model's ``forward`` (``image`` and ``mask``; ``input_ids``,
  ``attention_mask`` and ``token_type_ids``), passed to it by name; plus optionally integer labels
  named ``y``/``labels``/``label``/``targets``/``target`` (labels are never passed to the model,
  even when ``forward`` has a parameter of that name). Floating arrays become float32; integer
  and boolean arrays (token ids, masks) keep their dtype.

Files from others are checked before they are decoded (:mod:`qdq._limits`): an image's size
from its header (at most 8192x8192 pixels), only image formats decoded (Pillow would otherwise
pick any plugin by content), a symbolic link leading out of the image folder refused, entries that
are not regular files (FIFOs, devices) skipped, the decoded size of a folder or array file within
half the available memory (``QDQ_MAX_INPUT_BYTES``); ``.npy``/``.npz`` headers are read first and
pickled/object arrays refused (:mod:`qdq._npfile`).

User data (folders and arrays) is split deterministically: a seeded permutation (``seed``, default
0); calibration takes its first ``min(calib_samples, N // 2)`` samples, evaluation the rest (at most
``eval_samples``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from qdq._limits import MAX_IMAGE_PIXELS, InputRefusedError, check_input_bytes
from qdq.pipeline.arrays import named_arrays
from qdq.pipeline.forms import image_size, per_channel
from qdq.pipeline.inputs import (
    Inputs,
    check_inputs,
    input_items,
    num_samples,
    take,
)
from qdq.specs import load_arrays
from qdq.zoo.registry import DATASETS, ImagePreprocess, ZooEntry, ZooMetric, get_dataset

__all__ = ["IMAGE_SUFFIXES", "DataOptions", "QuantData", "resolve_data"]

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
#: text files, one sample per line (``label<TAB>text`` or the text alone), with ``--tokenizer``
TEXT_SUFFIXES = (".txt", ".tsv")
DEFAULT_CALIB = 256


@dataclass(frozen=True)
class DataOptions:
    """How to read and split the data (``None``: the dataset's or zoo model's default).

    Attributes:
        calib_samples: calibration samples (default: the built-in dataset's, else 256).
        eval_samples: evaluation samples (default: the built-in dataset's, else all the rest).
        image_size: ``(H, W)`` for image folders (default: the zoo model's); also ``N``, ``"N"``,
            ``"H,W"`` or ``"HxW"``, as ``--image-size`` takes it.
        mean / std: per-channel normalization for image folders (default: the zoo model's, else
            0 and 1: pixels in ``[0, 1]``); a number, a sequence or ``"M,M,M"``.
        channels: 1 (grayscale) or 3 (RGB) for image folders (default: the zoo model's, else 3).
        seed: seed of the split and of built-in calibration samples.
        tokenizer: text files: a local tokenizer folder (:mod:`qdq.pipeline.text`).
        max_length: text files: tokens per sample (default 128).

    Example:
        >>> DataOptions(image_size=64, mean="0.5", std=(0.25,)).image_size
        (64, 64)
    """

    calib_samples: int | None = None
    eval_samples: int | None = None
    image_size: tuple[int, int] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channels: int | None = None
    seed: int = 0
    tokenizer: str | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("calib_samples", "eval_samples"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.image_size is not None:
            object.__setattr__(self, "image_size", image_size(self.image_size, "image_size"))
        for name in ("mean", "std"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, per_channel(getattr(self, name), name))
        if self.channels is not None and (
            isinstance(self.channels, bool) or self.channels not in (1, 3)
        ):
            raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {self.channels!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")


@dataclass(frozen=True)
class QuantData:
    """Calibration and evaluation samples and optional labels.

    The samples are :data:`~qdq.pipeline.inputs.Inputs`: one tensor (the model's only input), a
    tuple of tensors (positional inputs) or a dict of tensors named after ``forward``'s parameters
    (keyword inputs), samples along dimension 0; calibration and evaluation in the same form.

    A built-in dataset may also carry a task ``metric`` and its ground truth ``targets`` (one per
    evaluation sample, e.g. the true pitch of every CREPE frame); the metric then replaces the
    generic one (see :mod:`qdq.pipeline.evaluate`).
    """

    calibration: Inputs
    evaluation: Inputs
    labels: torch.Tensor | None
    source: str
    split: str
    metric: ZooMetric | None = None
    targets: object = None

    def __post_init__(self) -> None:
        n_cal = check_inputs(self.calibration, f"{self.source}: calibration")
        n_eval = check_inputs(self.evaluation, f"{self.source}: evaluation")
        if n_cal == 0 or n_eval == 0:
            raise ValueError(f"{self.source}: calibration and evaluation need at least 1 sample")
        forms = [[name for name, _ in input_items(x)] for x in (self.calibration, self.evaluation)]
        if type(self.calibration) is not type(self.evaluation) or forms[0] != forms[1]:
            raise ValueError(
                f"{self.source}: calibration inputs {forms[0]} and evaluation inputs {forms[1]} "
                "differ; give both in the same form"
            )
        if self.labels is not None and len(self.labels) != n_eval:
            raise ValueError(f"{self.source}: {len(self.labels)} labels for {n_eval} samples")
        count = len(self.targets) if isinstance(self.targets, (torch.Tensor, list)) else None
        if count is not None and count != n_eval:
            raise ValueError(f"{self.source}: {count} metric targets for {n_eval} samples")


def resolve_data(
    spec: object,
    zoo: ZooEntry | None = None,
    options: DataOptions | None = None,
    *,
    model: nn.Module | None = None,
) -> QuantData:
    """Load and split the data a spec names.

    Args:
        spec: a built-in dataset name, an image folder, a ``.npy``/``.npz`` file, ``None`` for
            the zoo model's own dataset, or in-memory data (:mod:`qdq.pipeline.memory`: a
            tensor, a dict of arrays, a list or ``DataLoader`` of batches).
        zoo: the zoo entry of the model, if it is one (its dataset and preprocessing).
        options: counts, image preprocessing and the seed.
        model: the model the data is for: the arrays of a ``.npz`` named after the parameters of
            its ``forward`` are its keyword inputs.

    Raises:
        ValueError: an unknown name (listing the built-in datasets), an unusable file or folder
            (naming it), missing packages or data, too few samples.
        FileNotFoundError: a path that does not exist.
    """
    opts = options or DataOptions()
    if is_in_memory(spec):
        from qdq.pipeline.memory import from_memory

        inputs, labels, what = from_memory(spec, model)
        return _split(inputs, labels, "data", opts, f" (in memory: {what})")
    if spec is None:
        if zoo is None:
            raise ValueError("--data is required for a model that is not a zoo entry")
        spec = zoo.dataset
    if not isinstance(spec, (str, Path)):
        raise TypeError(f"data is a {type(spec).__name__}: expected a data spec or in-memory data")
    spec = str(spec)
    if spec in DATASETS:
        ds = get_dataset(spec)
        missing = ds.missing()
        if missing:
            raise ValueError(f"built-in dataset {spec!r} needs: {'; '.join(missing)}")
        calib = opts.calib_samples or ds.default_calib
        evaluate = opts.eval_samples or ds.default_eval
        loaded = ds.load(calib, evaluate, opts.seed)
        return QuantData(
            loaded.calibration,
            loaded.evaluation,
            loaded.labels,
            spec,
            loaded.split,
            ds.metric,
            loaded.targets,
        )
    path = Path(spec)
    if path.is_dir():
        pre = _preprocess(zoo, opts)
        x, y, classes = _image_folder(path, pre)
        labelled = f"labels from {len(classes)} sub-folders (sorted)" if classes else "no labels"
        return _split(x, y, str(path), opts, f"; images {pre.describe()}; {labelled}")
    if opts.tokenizer is not None and path.suffix not in TEXT_SUFFIXES:
        raise ValueError(f"--tokenizer is for text files ({'/'.join(TEXT_SUFFIXES)}), not {spec!r}")
    if path.suffix in TEXT_SUFFIXES and path.is_file():
        if opts.tokenizer is None:
            raise ValueError(f"{spec} is text: give --tokenizer DIR (a local tokenizer folder)")
        from qdq.pipeline.text import token_arrays

        arrays, note = token_arrays(path, opts.tokenizer, opts.max_length, model)
        inputs, y = named_arrays(arrays, str(path), model)
        return _split(inputs, y, str(path), opts, note)
    if path.suffix in (".npy", ".npz"):
        inputs, y = _arrays(path, model)
        return _split(inputs, y, str(path), opts)
    if path.exists():
        raise ValueError(
            f"data {spec!r}: expected an image folder, a .npy or a .npz file, or a text file "
            "(.txt/.tsv) with --tokenizer"
        )
    if "/" in spec or "\\" in spec or path.suffix:
        raise FileNotFoundError(f"no data at {spec}")
    raise ValueError(
        f"unknown dataset {spec!r}; built-in datasets: {', '.join(sorted(DATASETS))}; or give an "
        "image folder, a .npy or a .npz file"
    )


# ------------------------------------------------------------------------------------ arrays


def is_in_memory(data: object) -> bool:
    """Whether ``data`` is in-memory data (:mod:`qdq.pipeline.memory`), not a spec string or
    path, a ``QuantData`` or ``None``."""
    from pathlib import PurePath

    return not (data is None or isinstance(data, (str, bytes, PurePath, QuantData)))


def _arrays(path: Path, model: nn.Module | None) -> tuple[Inputs, torch.Tensor | None]:
    return named_arrays(load_arrays(path), str(path), model)


def _split(
    x: Inputs, y: torch.Tensor | None, source: str, opts: DataOptions, note: str = ""
) -> QuantData:
    n = num_samples(x)
    if n < 2:
        raise ValueError(f"{source} holds {n} sample(s); need at least 2 (calibration, evaluation)")
    n_cal = min(opts.calib_samples or DEFAULT_CALIB, n // 2)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(opts.seed))
    cal_idx, ev_idx = order[:n_cal], order[n_cal:]
    if opts.eval_samples is not None:
        ev_idx = ev_idx[: opts.eval_samples]
    split = (
        f"{n} samples split by a seeded permutation (seed {opts.seed}): {len(cal_idx)} for "
        f"calibration, {len(ev_idx)} other ones for evaluation{note}"
    )
    labels = None if y is None else y[ev_idx]
    return QuantData(take(x, cal_idx), take(x, ev_idx), labels, source, split)


# ------------------------------------------------------------------------------- image folders


def _preprocess(zoo: ZooEntry | None, opts: DataOptions) -> ImagePreprocess:
    """The zoo model's preprocessing with the options given on top, else the options alone."""
    if zoo is None and opts.image_size is None:
        raise ValueError(
            "an image folder needs --image-size H,W (and usually --mean/--std) for a model that "
            "is not a zoo entry"
        )
    if zoo is not None and zoo.preprocess is None and opts.image_size is None:
        raise ValueError(
            f"the zoo model {zoo.name!r} does not take images ({zoo.task}); give its inputs as "
            "a .npy/.npz file, or --image-size for an image folder"
        )
    base = ImagePreprocess(size=(1, 1)) if zoo is None or zoo.preprocess is None else zoo.preprocess
    return ImagePreprocess(
        size=opts.image_size or base.size,
        channels=opts.channels or base.channels,
        mean=opts.mean or base.mean,
        std=opts.std or base.std,
        resize=base.resize,
    )


#: the Pillow formats an image folder may hold (Image.open would otherwise pick any plugin by
#: content, whatever the suffix: EPS, for one, runs Ghostscript)
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")


def _image_files(folder: Path) -> tuple[list[Path], list[int] | None, list[str]]:
    """The images directly in ``folder``, or in its class sub-folders, sorted.

    Entries that are not regular files (FIFOs, devices, sockets) are skipped: they are never
    opened. A symbolic link is followed only when it resolves inside ``folder``.
    """
    root = folder.resolve()

    def inside(p: Path) -> bool:
        if p.is_symlink() and not p.resolve().is_relative_to(root):
            raise ValueError(
                f"image folder {folder}: {p} is a symbolic link to {p.resolve()}, outside the "
                "folder; qdq reads only files inside the folder it is given (copy them in)"
            )
        return True

    def images(d: Path) -> list[Path]:
        return sorted(
            p
            for p in d.iterdir()
            if p.suffix.lower() in IMAGE_SUFFIXES and inside(p) and p.is_file()
        )

    top = images(folder)
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and inside(d) and images(d))
    if top or not classes:
        if not top:
            raise ValueError(
                f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder} or its sub-folders"
            )
        return top, None, []
    files, labels = [], []
    for i, name in enumerate(classes):
        for p in images(folder / name):
            files.append(p)
            labels.append(i)
    return files, labels, classes


def _image_folder(
    folder: Path, pre: ImagePreprocess
) -> tuple[torch.Tensor, torch.Tensor | None, list[str]]:
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("reading an image folder needs Pillow: pip install pillow") from None
    files, labels, classes = _image_files(folder)
    h, w = pre.size
    what = f"{len(files)} images of {pre.channels}x{h}x{w} float32"
    check_input_bytes(len(files) * pre.channels * h * w * 4, str(folder), what)
    tensors = [torch.from_numpy(_read_image(Image, p, pre)).permute(2, 0, 1) for p in files]
    x = torch.stack(tensors)
    mean = torch.tensor(pre.mean, dtype=torch.float32).reshape(1, -1, 1, 1)
    std = torch.tensor(pre.std, dtype=torch.float32).reshape(1, -1, 1, 1)
    x = ((x - mean) / std).contiguous()
    return x, None if labels is None else torch.tensor(labels, dtype=torch.int64), classes


def _read_image(image: Any, p: Path, pre: ImagePreprocess) -> np.ndarray:
    """One image as ``(H, W, C)`` float32 in ``[0, 1]``; its size is checked from the header
    (:data:`qdq._limits.MAX_IMAGE_PIXELS`) before it is decoded."""
    h, w = pre.size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", image.DecompressionBombWarning)
            with image.open(p, formats=IMAGE_FORMATS) as im:
                if im.width * im.height > MAX_IMAGE_PIXELS:
                    raise InputRefusedError(
                        f"image {p} is {im.width}x{im.height} pixels, over qdq's limit of "
                        f"{MAX_IMAGE_PIXELS} (8192x8192, qdq._limits.MAX_IMAGE_PIXELS), checked "
                        "before decoding; downscale it"
                    )
                img = im.convert("L" if pre.channels == 1 else "RGB")
                if pre.resize == "stretch":
                    img = img.resize((w, h), image.Resampling.BILINEAR)
                else:
                    scale = max(h / img.height, w / img.width)
                    size = (max(w, round(img.width * scale)), max(h, round(img.height * scale)))
                    img = img.resize(size, image.Resampling.BILINEAR)
                    left, top = (img.width - w) // 2, (img.height - h) // 2
                    img = img.crop((left, top, left + w, top + h))
                arr = np.asarray(img, dtype=np.float32) / 255.0
    except InputRefusedError:
        raise
    except Exception as err:  # any decoder error of a malformed file: one line naming it
        text = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"cannot read image {p}: {text}") from None
    return arr.reshape(h, w, pre.channels)
