"""Read back what computing the amax of many calibrators needs, in one transfer per device.

A calibrator keeps its statistics on the data's device and reads them back when its amax is
computed: a histogram its range, its first bad batch and its counts, a max calibrator whether each
batch was finite. One calibrator after another, that is a host synchronisation or two per
quantizer (issue 48: 689 computing the ``mse`` amax of EfficientNet-B0's 115 activation
quantizers). :func:`read_back` gathers those tensors of every calibrator into one int64 tensor per
device (a float64 travels as its bits), reads it back once and hands each calibrator its values;
they stand for the device values until the calibrator collects again, so the amax computed after
are the same, bit for bit, and so are the errors (raised by ``compute_amax``, as before).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from qdq.calib.base import Calibrator

__all__ = ["read_back"]


def read_back(calibrators: Iterable[tuple[Calibrator, str]]) -> int:
    """Read back, in one transfer per device, what each ``(calibrator, method)`` needs to compute
    its amax by ``method`` (a calibrator listed twice reads for the methods it is listed with).

    Returns:
        The number of transfers (devices read from).

    Example:
        >>> from qdq.calib import HistogramCalibrator
        >>> cals = [HistogramCalibrator() for _ in range(3)]
        >>> for i, cal in enumerate(cals):
        ...     cal.collect(torch.linspace(-1.0, 1.0, 1000) * (i + 1))
        >>> read_back((cal, "mse") for cal in cals)  # the compute_amax below read nothing back
        1
        >>> [round(float(cal.compute_amax("mse")), 4) for cal in cals]
        [0.9963, 1.9927, 2.9893]
    """
    methods: dict[int, tuple[Calibrator, str]] = {}
    for cal, method in calibrators:
        _, known = methods.get(id(cal), (cal, "max"))
        methods[id(cal)] = (cal, method if known == "max" else known)  # any but max reads more
    asked: dict[torch.device, list[tuple[Calibrator, list[torch.Tensor]]]] = {}
    for cal, method in methods.values():
        parts = cal._pending_reads(method)
        if parts:
            asked.setdefault(parts[0].device, []).append((cal, parts))
    for items in asked.values():
        flat = [p for _, parts in items for p in parts]
        host = torch.cat(flat).cpu().numpy()  # the one read back from this device
        bounds = np.cumsum([0] + [p.numel() for p in flat])
        k = 0
        for cal, parts in items:
            cal._receive_reads([host[bounds[k + j] : bounds[k + j + 1]] for j in range(len(parts))])
            k += len(parts)
    return len(asked)
