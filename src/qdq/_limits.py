"""Size limits checked before a file from someone else is decoded.

A file may declare more than it holds (an ``.npy`` header, a zip member) or hold far more once
decoded than on disk (a deflated ``.npz`` member of zeros, a PNG of one colour). Readers check
what the file declares against these limits first, and refuse with one line naming the file and
the limit:

* :data:`MAX_IMAGE_PIXELS` per image (from its header, before decoding);
* :data:`MAX_EXPANSION`: a compressed zip member may expand at most this many times its stored
  size once it is larger than :data:`EXPANSION_FLOOR` (a decompression bomb otherwise; real
  data saved uncompressed, ``np.savez``, is never refused for its ratio);
* :func:`max_input_bytes`: the decoded bytes of one input (a data file, an image folder, a
  ``.pt2`` archive): half the memory available when it is read, or the environment variable
  ``QDQ_MAX_INPUT_BYTES`` (bytes) when set.
"""

from __future__ import annotations

import os
import zipfile

__all__ = [
    "ENV_MAX_INPUT_BYTES",
    "EXPANSION_FLOOR",
    "MAX_EXPANSION",
    "MAX_IMAGE_PIXELS",
    "InputRefusedError",
    "available_memory",
    "check_expansion",
    "check_input_bytes",
    "human_bytes",
    "max_input_bytes",
]

#: largest image read, in pixels (8192 x 8192): checked from the header before decoding
MAX_IMAGE_PIXELS = 8192 * 8192
#: a compressed member larger than EXPANSION_FLOOR may expand at most this many times
MAX_EXPANSION = 100
EXPANSION_FLOOR = 64 * 2**20
#: the environment variable that sets the decoded-bytes limit of one input (bytes)
ENV_MAX_INPUT_BYTES = "QDQ_MAX_INPUT_BYTES"


class InputRefusedError(ValueError):
    """A file from someone else that qdq will not read; the message names the file and why."""


def human_bytes(n: int) -> str:
    """``n`` bytes for a message: ``"1.07 GB"``, ``"512 B"``."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``), or ``None`` when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def max_input_bytes() -> tuple[int | None, str]:
    """The decoded-bytes limit of one input and where it comes from (for messages).

    Raises:
        ValueError: ``QDQ_MAX_INPUT_BYTES`` is set but not a positive integer.
    """
    text = os.environ.get(ENV_MAX_INPUT_BYTES)
    if text is not None and text.strip():
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(
                f"{ENV_MAX_INPUT_BYTES} must be a positive number of bytes, got {text!r}"
            )
        return value, f"{ENV_MAX_INPUT_BYTES}={value}"
    free = available_memory()
    if free is None:
        return None, "no limit (available memory unknown)"
    return (
        free // 2,
        f"half the {human_bytes(free)} of memory available; {ENV_MAX_INPUT_BYTES} sets it",
    )


def check_input_bytes(nbytes: int, where: str, what: str) -> None:
    """Refuse an input whose decoded size ``nbytes`` exceeds :func:`max_input_bytes`.

    Raises:
        InputRefusedError: naming ``where``, ``what`` it holds, and the limit.
    """
    limit, source = max_input_bytes()
    if limit is not None and nbytes > limit:
        raise InputRefusedError(
            f"{where}: {what} would take {human_bytes(nbytes)} decoded, over qdq's input limit "
            f"of {human_bytes(limit)} ({source})"
        )


def check_expansion(info: zipfile.ZipInfo, nbytes: int, where: str) -> None:
    """Refuse a compressed zip member that declares ``nbytes`` decoded from far fewer stored.

    Raises:
        InputRefusedError: a member past :data:`EXPANSION_FLOOR` expanding more than
            :data:`MAX_EXPANSION` times (naming the file, the member and both sizes).
    """
    stored = max(info.compress_size, 1)
    compressed = info.compress_type != zipfile.ZIP_STORED
    if compressed and nbytes > EXPANSION_FLOOR and nbytes > MAX_EXPANSION * stored:
        raise InputRefusedError(
            f"{where}: member {info.filename!r} expands from {human_bytes(stored)} to "
            f"{human_bytes(nbytes)} ({nbytes // stored}x), past qdq's limit of {MAX_EXPANSION}x "
            f"for compressed members over {human_bytes(EXPANSION_FLOOR)} (a decompression bomb?); "
            "if the data is real, save it uncompressed (np.savez)"
        )
