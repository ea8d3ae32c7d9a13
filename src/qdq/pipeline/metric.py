"""A user's own metric for ``qdq quantize``: ``--metric file.py:fn`` / ``pkg.module:fn``, or
``qdq.quantize(..., metric=fn)``; it is then the headline figure (``metric_name``,
``fp32_metric``, ``int8_metric``).

The function is called as ``fn(outputs, labels)``:

* ``outputs``: a list with every output tensor of the model, in ``torch.utils._pytree`` order
  (the order of the exported ONNX's outputs, ``report.json: outputs``), each holding all the
  evaluation samples concatenated along dimension 0 (batch-major: ``outputs[i][n]`` is output
  ``i`` of sample ``n``), float32, on the CPU;
* ``labels``: the evaluation labels (int64, ``(N,)``) when the data has them, else ``None``.

It returns a number (``float``, ``int``, a NumPy scalar or a one-element tensor), named after the
function (``user_metric`` for a lambda), or a dict of named numbers whose **first key** is the
headline; every figure is kept under ``figures`` in ``report.json``. Higher is better:
``--max-drop`` keeps in float what brings the INT8 value back within the budget of FP32's.

Every model is scored alike: FP32 (torch), the exported INT8 (ONNX Runtime), torch fake-quant,
each ``--compare-methods`` method and each candidate of the ``--max-drop`` search. A user metric
takes the place of a dataset's task metric (a zoo dataset's own is then not computed), and
labels need not be class labels of the first output.

Errors are raised early and name the metric: loading the spec (before the model is loaded:
``ValueError``, ``FileNotFoundError``, ``TypeError`` when it is not callable), and the ``check``
stage, which calls the function once on the outputs of one calibration sample (with the first
evaluation label repeated as its labels, or ``None``) and discards the value: a failure inside it
is a ``ValueError``, a return that is not a number nor a dict of them a ``TypeError``.

Example:
    >>> import torch
    >>> def mean_score(outputs, labels):
    ...     return {"mean_score": float(outputs[0].mean()), "samples": len(outputs[0])}
    >>> m = load_metric(mean_score)
    >>> m.figures([torch.ones(4, 2)], None)
    {'mean_score': 1.0, 'samples': 4.0}
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from qdq.pipeline.data import QuantData
from qdq.zoo.registry import ZooMetric

__all__ = ["MetricFn", "UserMetric", "load_metric"]

#: ``fn(outputs, labels) -> number | dict[str, number]``
MetricFn = Callable[[list[torch.Tensor], "torch.Tensor | None"], Any]


@dataclass(frozen=True)
class UserMetric:
    """A user metric and the spec it came from (named in every error).

    Attributes:
        spec: what the user passed: ``file.py:fn``, ``pkg.module:fn``, or the function's name.
        fn: the function, ``fn(outputs, labels)`` (see the module docstring).
    """

    spec: str
    fn: MetricFn

    @property
    def name(self) -> str:
        """The figure's name for a function that returns a number: its ``__name__``."""
        name = getattr(self.fn, "__name__", "")
        return name if isinstance(name, str) and name.isidentifier() else "user_metric"

    def figures(
        self, outputs: Sequence[torch.Tensor], labels: torch.Tensor | None, when: str = ""
    ) -> dict[str, float]:
        """Call the metric; its figures (the headline first).

        Raises:
            ValueError: the metric raised (its error is in the message).
            TypeError: it returned something else than a number or a dict of numbers.
        """
        try:
            value = self.fn(list(outputs), labels)
        except Exception as err:  # user code: one message naming the metric
            why = " ".join(str(err).split())[:300]
            raise ValueError(
                f"metric {self.spec}{when} raised {type(err).__name__}: {why}"
            ) from err
        if isinstance(value, dict):
            if not value:
                raise TypeError(f"metric {self.spec} returned an empty dict")
            return {self._key(k): self._number(v, k) for k, v in value.items()}
        return {self.name: self._number(value, None)}

    def bind(self, qdata: QuantData, sample_outputs: Sequence[torch.Tensor]) -> QuantData:
        """Check the metric on one sample's outputs and make it ``qdata``'s task metric (its
        targets: the labels), so that every stage scores with it."""
        labels = qdata.labels
        if labels is not None:  # the first evaluation label, for its type and shape
            labels = labels[[0] * len(sample_outputs[0])]
        name = next(iter(self.figures(sample_outputs, labels, " on the outputs of one sample")))

        def score(
            outputs: Sequence[torch.Tensor], _reference: Sequence[torch.Tensor], targets: object
        ) -> dict[str, float]:
            labels = targets if isinstance(targets, torch.Tensor) else None
            figures = self.figures(outputs, labels)
            if name not in figures:
                raise ValueError(
                    f"metric {self.spec} returned {sorted(figures)}, without {name!r} (its first "
                    "key on the check sample, the headline)"
                )
            return {name: figures.pop(name), **figures}

        task = ZooMetric(name, score, lambda outputs: None)  # checked above
        return dataclasses.replace(qdata, metric=task, targets=qdata.labels)

    def _key(self, key: object) -> str:
        if not isinstance(key, str) or not key:
            raise TypeError(f"metric {self.spec} returned a dict with key {key!r}, not a name")
        return key

    def _number(self, value: object, key: str | None) -> float:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        what = "" if key is None else f"[{key!r}]"
        kind = type(value).__name__
        if isinstance(value, (torch.Tensor, np.ndarray)):
            kind += f" of shape {tuple(value.shape)}"
        raise TypeError(
            f"metric {self.spec} returned{what} {kind} ({str(value)[:60]}), not a number: "
            "return a float, or a dict of named floats (the first key is the headline)"
        )


def load_metric(metric: str | MetricFn | None) -> UserMetric | None:
    """The user metric ``metric`` names: a ``file.py:fn`` / ``pkg.module:fn`` spec (loaded with
    :func:`qdq.specs.load_attribute`; this executes that code), a callable, or ``None``.

    Raises:
        ValueError / FileNotFoundError: a malformed spec, a missing file or attribute.
        TypeError: ``metric`` (or what the spec names) is not callable.
    """
    if metric is None:
        return None
    if isinstance(metric, str):
        from qdq.specs import load_attribute

        fn = load_attribute(metric, "metric", "fn")
        if not callable(fn):
            raise TypeError(
                f"metric spec {metric!r} names a {type(fn).__name__}, not a function "
                "fn(outputs, labels)"
            )
        return UserMetric(metric, fn)
    if not callable(metric):
        raise TypeError(
            f"metric must be a function fn(outputs, labels) or a 'file.py:fn' spec, got {metric!r}"
        )
    return UserMetric(getattr(metric, "__qualname__", None) or repr(metric), metric)
