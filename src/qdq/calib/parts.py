"""Calibration statistics kept per part of the data, merged on demand into any union of parts.

The recipe search of ``qdq quantize`` (:mod:`qdq.pipeline.recipe`) calibrates on three quarters of
the calibration samples and scores on the fourth, then on each other quarter in turn (folds), and
finally refits on all of them. Each of those calibrations is a union of the same four parts, and
the statistics of a union are exactly the merge of its parts' (:meth:`qdq.calib.Calibrator.absorb`:
the histograms' power-of-two grids merge bin for bin, and maxima take the maximum). So one pass
over the data gives every fold's calibration and the refit's: :func:`qdq.api.calibrate_parts`
collects each part's statistics apart, :func:`qdq.api.calibrate_from` sets a model's amax from any
union of them, and no calibration batch runs twice.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

from qdq.calib.base import Calibrator

__all__ = ["CalibrationParts"]


@dataclass(frozen=True)
class CalibrationParts:
    """The statistics every activation quantizer collected on each part of the data.

    Attributes:
        parts: per part, each quantizer's calibrator (by module path) holding that part's
            statistics alone.
        batches: the batches each part ran.
    """

    parts: tuple[dict[str, Calibrator], ...]
    batches: tuple[int, ...]

    def merged(self, keep: Iterable[int] | None = None) -> dict[str, Calibrator]:
        """Each quantizer's calibrator holding the union of the parts ``keep`` (default: all;
        new objects, the parts are not changed).

        Raises:
            ValueError: ``keep`` names no part, or a part that does not exist.
        """
        chosen = sorted(set(range(len(self.parts)) if keep is None else keep))
        if not chosen or chosen[0] < 0 or chosen[-1] >= len(self.parts):
            raise ValueError(
                f"keep must name some of the parts 0..{len(self.parts) - 1}, got {chosen}"
            )
        out = {path: copy.deepcopy(cal) for path, cal in self.parts[chosen[0]].items()}
        for i in chosen[1:]:
            for path, cal in self.parts[i].items():
                out[path].absorb(cal)
        return out
