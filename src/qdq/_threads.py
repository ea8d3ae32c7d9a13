"""OpenMP threads that sleep while they wait, unless the user chose otherwise (issue 57).

PyTorch's CPU kernels run on OpenMP threads that, by default, spin between parallel regions. On
a machine shared with other CPU-bound processes a spinning thread holds a core another thread of
the same forward is waiting for: on this project's 2-core CPU beside two busy processes, the
demo's forwards ran 3x slower (1.9 vs 0.6 ms per sample) and the whole ``make demo`` job took
156 s instead of 84 s, while on an idle machine passive waiting costs within noise (53 vs 56 s).
So ``import qdq`` sets ``OMP_WAIT_POLICY=PASSIVE`` when torch is not imported yet (OpenMP reads
it once, when torch loads it) and the variable is not set: the ``qdq`` command always, a script
that imports qdq before torch too. A value you set is kept; once torch is loaded nothing changes.
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
