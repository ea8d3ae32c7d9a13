"""Distillation against a frozen FP32 copy: output KL/MSE and per-module feature MSE.

The yolov7 QAT recipe trains with no task loss at all: the loss is the sum of MSEs between each
quantized module's output and the same module's output in the float model. :class:`Distiller` does
that (``features="quantized"``: every Conv/Linear that has a weight quantizer), or with the
modules you name, plus an output term (``"mse"`` for any output, ``"kl"`` for logits).

The teacher is a deep copy of the student taken when the distiller is made, with every quantizer
bypassed (the float model), no gradients, and BatchNorm/Dropout running deterministically. It runs
in the student's train/eval mode otherwise, so heads whose outputs differ between training and
inference (detectors) give outputs of the same structure.

The hooks live only while the distiller is open: :meth:`Distiller.close` (or leaving a ``with``
block) removes them, and :func:`qdq.export_onnx` refuses a model that still carries them.

Example:
    >>> import torch, qdq
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    >>> m = qdq.prepare(net, (torch.randn(2, 4),))
    >>> _ = qdq.calibrate(m, [torch.randn(8, 4)], method="max", show_progress=False)
    >>> x = torch.randn(8, 4)
    >>> with Distiller(m, output="kl", features="quantized") as d:
    ...     loss = d.loss(m(x), x)
    >>> bool(loss >= 0), d.active
    (True, False)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.quant import Quantizer, QuantMode

__all__ = ["OUTPUT_LOSSES", "Distiller", "fp32_teacher", "has_distill_hooks"]

#: output terms of :class:`Distiller`
OUTPUT_LOSSES = ("mse", "kl", None)
_MARK = "_qdq_distill"
_DETERMINISTIC = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
    nn.Dropout3d, nn.AlphaDropout,
)  # fmt: skip


def fp32_teacher(student: nn.Module) -> nn.Module:
    """A frozen float copy of ``student``: quantizers bypassed, no gradients, deterministic
    BatchNorm and Dropout (they run as in eval even when the copy is in ``train()``)."""
    teacher = copy.deepcopy(student)
    for m in teacher.modules():
        if isinstance(m, Quantizer):
            m.mode = QuantMode.BYPASS
        elif isinstance(m, _DETERMINISTIC):
            m.register_forward_pre_hook(_as_eval)
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _as_eval(module: nn.Module, args: Any) -> None:
    module.training = False


def has_distill_hooks(model: nn.Module) -> list[str]:
    """Module paths of ``model`` that still carry a :class:`Distiller`'s hooks."""
    return [
        path
        for path, m in model.named_modules()
        if any(getattr(h, _MARK, False) for h in m._forward_hooks.values())
    ]


class Distiller:
    """Distillation loss of a student (a QAT model) against its frozen FP32 teacher.

    Args:
        student: the model being trained (from :func:`qdq.qat.prepare`).
        teacher: the reference; default :func:`fp32_teacher` of ``student`` (copied now).
        output: ``"mse"`` (every output tensor), ``"kl"`` (softmax over dim 1 of a single
            logits tensor, with ``temperature``) or ``None``.
        features: module paths whose outputs are matched by MSE, or ``"quantized"`` for every
            module owning a weight quantizer (the yolov7 recipe), or ``()``.
        temperature: for ``"kl"``; the loss is scaled by ``temperature²``.
        output_weight, feature_weight: the terms' weights.

    Raises:
        ValueError: an unknown ``output``, no term at all, or a feature path not in both models.
    """

    def __init__(
        self,
        student: nn.Module,
        teacher: nn.Module | None = None,
        *,
        output: str | None = "mse",
        features: Sequence[str] | str = (),
        temperature: float = 1.0,
        output_weight: float = 1.0,
        feature_weight: float = 1.0,
    ) -> None:
        if output not in OUTPUT_LOSSES:
            raise ValueError(f"output must be one of {OUTPUT_LOSSES}, got {output!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        paths = _feature_paths(student, features)
        if output is None and not paths:
            raise ValueError("the distiller has no term: give output= or features=")
        self.student = student
        self.teacher = fp32_teacher(student) if teacher is None else teacher
        self.output = output
        self.features = tuple(paths)
        self.temperature = float(temperature)
        self.output_weight = float(output_weight)
        self.feature_weight = float(feature_weight)
        self._seen: dict[str, dict[str, Any]] = {"student": {}, "teacher": {}}
        self._handles: list[Any] = []
        for path in self.features:
            for side, model in (("student", student), ("teacher", self.teacher)):
                try:
                    module = model.get_submodule(path)
                except AttributeError:
                    self.close()
                    raise ValueError(
                        f"distillation feature {path!r} is not a module of the {side}"
                    ) from None
                self._handles.append(module.register_forward_hook(self._recorder(side, path)))

    def _recorder(self, side: str, path: str) -> Any:
        seen = self._seen[side]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            seen[path] = output

        setattr(hook, _MARK, True)
        return hook

    @property
    def active(self) -> bool:
        """Whether the hooks are still attached."""
        return bool(self._handles)

    def settings(self) -> dict[str, Any]:
        """What the distiller does, as plain data (recorded in ``qdq_qat.distill``)."""
        return {
            "output": self.output,
            "features": len(self.features),
            "temperature": self.temperature,
            "output_weight": self.output_weight,
            "feature_weight": self.feature_weight,
        }

    def loss(self, student_output: Any, *inputs: Any, **kw_inputs: Any) -> torch.Tensor:
        """The distillation loss for one batch: runs the teacher on ``inputs`` (no grad) and
        compares with ``student_output`` and the student features seen in its last forward.

        Raises:
            RuntimeError: the distiller was closed, or a feature was not reached by a forward.
            ValueError: student and teacher outputs differ in structure or shape.
        """
        if not self._handles and self.features:
            raise RuntimeError("this Distiller is closed; make a new one")
        self.teacher.train(self.student.training)
        with torch.no_grad():
            teacher_output = self.teacher(*inputs, **kw_inputs)
        total = _zero_like(student_output)
        if self.output is not None:
            total = total + self.output_weight * self._output_term(student_output, teacher_output)
        if self.features:
            s_seen, t_seen = self._seen["student"], self._seen["teacher"]
            missing = [p for p in self.features if p not in s_seen or p not in t_seen]
            if missing:
                raise RuntimeError(
                    f"distillation features not reached by the last forward: {missing[:5]}"
                )
            terms = [_mse(s_seen[p], t_seen[p], p) for p in self.features]
            total = total + self.feature_weight * torch.stack(terms).sum()
            s_seen.clear()
            t_seen.clear()
        return total

    def _output_term(self, student: Any, teacher: Any) -> torch.Tensor:
        if self.output == "kl":
            if not (isinstance(student, torch.Tensor) and isinstance(teacher, torch.Tensor)):
                raise ValueError("output='kl' needs a model returning one logits tensor")
            t = self.temperature
            log_p = F.log_softmax(student.float() / t, dim=1)
            q = F.softmax(teacher.float() / t, dim=1)
            return F.kl_div(log_p, q, reduction="batchmean") * t * t
        return _mse(student, teacher, "output")

    def close(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for seen in self._seen.values():
            seen.clear()

    def __enter__(self) -> Distiller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _feature_paths(student: nn.Module, features: Sequence[str] | str) -> list[str]:
    if features == "quantized":
        return [
            path
            for path, m in student.named_modules()
            if isinstance(getattr(m, "weight_quantizer", None), Quantizer)
        ]
    if isinstance(features, str):
        raise ValueError(
            f"features must be a sequence of module paths or 'quantized', got {features!r}"
        )
    return list(dict.fromkeys(features))


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value, key=str) for t in _tensors(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _mse(student: Any, teacher: Any, what: str) -> torch.Tensor:
    s, t = _tensors(student), _tensors(teacher)
    if len(s) != len(t) or not s:
        raise ValueError(
            f"distillation {what}: the student gives {len(s)} tensor(s), the teacher {len(t)}"
        )
    terms = []
    for a, b in zip(s, t, strict=True):
        if a.shape != b.shape:
            raise ValueError(
                f"distillation {what}: student shape {tuple(a.shape)} vs teacher {tuple(b.shape)}"
            )
        if a.is_floating_point():
            terms.append(F.mse_loss(a.float(), b.float()))
    return torch.stack(terms).sum()


def _zero_like(value: Any) -> torch.Tensor:
    ts = _tensors(value)
    return ts[0].new_zeros((), dtype=torch.float32) if ts else torch.zeros(())
