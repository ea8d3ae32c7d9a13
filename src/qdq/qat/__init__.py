"""Quantization-aware training: the deployed Q/DQ set, trained in your loop or in ours.

Flow: ``qdq.prepare`` → ``qdq.calibrate`` → :func:`prepare` (a train-ready copy: straight-through
fake quantization, amax frozen or learned, BatchNorm frozen or folded) → your own training loop
(optimizer over ``model.parameters()``, :func:`recipe` for the standard schedule,
:class:`Distiller` for distillation) or :func:`finetune` → ``qdq.export_onnx`` (the same Q/DQ set;
the manifest records the fine-tuning). See ``docs/qat.md``.
"""

from __future__ import annotations

from qdq.qat.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from qdq.qat.distill import Distiller, fp32_teacher, has_distill_hooks
from qdq.qat.finetune import FinetuneResult, finetune
from qdq.qat.prepare import BN_MODES, QatState, fold_batchnorms, prepare, qat_state
from qdq.qat.recipe import Recipe, parameter_groups, recipe

__all__ = [
    "BN_MODES",
    "CheckpointError",
    "Distiller",
    "FinetuneResult",
    "QatState",
    "Recipe",
    "finetune",
    "fold_batchnorms",
    "fp32_teacher",
    "has_distill_hooks",
    "load_checkpoint",
    "parameter_groups",
    "prepare",
    "qat_state",
    "recipe",
    "save_checkpoint",
]
