"""``qdq.qat.prepare``: a calibrated prepared model, ready to fine-tune in any training loop.

What it does to its copy of the model (the model passed in is not modified):

* every quantizer fake-quantizes with the straight-through estimator (:mod:`qdq.quant.primitives`),
  the same numerics the ONNX export runs, so the Q/DQ set trained is the one deployed;
* amax stays frozen (pytorch-quantization's and ModelOpt's recipe) unless ``learn_amax`` asks for
  LSQ or PACT, per tensor for activations and per channel for weights (not block formats: NVFP4,
  MXFP8 and INT4 keep theirs, their block scales follow the data);
* BatchNorm: ``"freeze"`` (default) runs every BatchNorm on its running statistics even in
  ``train()``; ``"fold"`` folds each BatchNorm that reads only a Conv's output into that Conv's
  weight and bias first (exact with per-channel weight scales) and re-derives the weight amax;
  ``"train"`` leaves BatchNorm as PyTorch trains it;
* state that :mod:`qdq.ptq` learned for the float weights (AdaRound codes, bias corrections) is
  dropped with a warning: QAT moves the weights, so it would be stale after the first step.

The result is the user's model class with the same ``forward``, ``parameters()`` (plus learned
amax), ``state_dict()`` and train/eval behaviour. It records what was done at ``.qdq_qat``
(:class:`QatState`), which :func:`qdq.qat.finetune` updates and the export manifest carries.

Example:
    >>> import torch, qdq
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    >>> m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
    >>> _ = qdq.calibrate(m, [torch.randn(2, 3, 8, 8)], method="max", show_progress=False)
    >>> qat = prepare(m, learn_amax="lsq")
    >>> qat.training, qat.qdq_qat.learn_amax
    (True, 'lsq')
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from qdq.api import plan_of, quantizers_of
from qdq.quant import Quantizer, QuantMode, quantizer_mode
from qdq.quant.primitives import AMAX_GRADS

__all__ = ["BN_MODES", "LEARN_SCOPES", "QatState", "prepare", "qat_state"]

_log = logging.getLogger("qdq")
_STATE_ATTR = "qdq_qat"
#: what :func:`prepare` does with BatchNorm
BN_MODES = ("freeze", "fold", "train")
#: which quantizers learn their amax when ``learn_amax`` is set
LEARN_SCOPES = ("all", "activations", "weights")
_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: a fold must leave the float model's output within this relative error (else it is undone)
_FOLD_TOLERANCE = 1e-4


@dataclass
class QatState:
    """What quantization-aware training did to a model (``model.qdq_qat``); plain data.

    Attributes:
        learn_amax: ``"lsq"``, ``"pact"`` or ``None`` (amax frozen).
        learn_scope: which quantizers learn amax (``"all"``, ``"activations"``, ``"weights"``).
        bn: ``"freeze"``, ``"fold"`` or ``"train"``.
        folded: ``(conv, batchnorm)`` module paths folded together (``bn="fold"``).
        not_folded: BatchNorm paths left as they were, with the reason.
        dropped_ptq: weight quantizers whose :mod:`qdq.ptq` state was dropped.
        epochs, steps: fine-tuning done so far (:func:`qdq.qat.finetune` counts them; a user's
            own loop may set them).
        recipe: the schedule used (:func:`qdq.qat.recipe`), when known.
        distill: the distillation settings used, when any.
    """

    learn_amax: str | None = None
    learn_scope: str = "all"
    bn: str = "freeze"
    folded: list[tuple[str, str]] = field(default_factory=list)
    not_folded: list[tuple[str, str]] = field(default_factory=list)
    dropped_ptq: list[str] = field(default_factory=list)
    epochs: float = 0.0
    steps: int = 0
    recipe: dict[str, Any] | None = None
    distill: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the manifest's ``"qat"`` entry)."""
        out = dataclasses.asdict(self)
        out["folded"] = [list(p) for p in self.folded]
        out["not_folded"] = [list(p) for p in self.not_folded]
        return out


def qat_state(model: nn.Module) -> QatState | None:
    """The :class:`QatState` of a model returned by :func:`prepare` (``None`` for any other)."""
    state = model.__dict__.get(_STATE_ATTR)
    return state if isinstance(state, QatState) else None


def prepare(
    prepared: nn.Module,
    *,
    learn_amax: str | None = None,
    learn_scope: str = "all",
    bn: str = "freeze",
    example_inputs: Sequence[Any] | None = None,
) -> nn.Module:
    """Return a copy of a calibrated prepared model, ready for quantization-aware training.

    Args:
        prepared: a model from :func:`qdq.prepare`, calibrated (:func:`qdq.calibrate`).
        learn_amax: ``None`` (default: amax frozen), ``"lsq"`` or ``"pact"`` to train amax as an
            ``nn.Parameter`` (see :meth:`qdq.Quantizer.learn_amax`).
        learn_scope: which quantizers learn amax: ``"all"``, ``"activations"`` or ``"weights"``.
        bn: ``"freeze"`` (running statistics, also in ``train()``), ``"fold"`` (into the Conv
            first) or ``"train"`` (PyTorch's usual BatchNorm training).
        example_inputs: one batch of inputs, needed by ``bn="fold"`` to find which BatchNorm
            reads which Conv and to check each fold leaves the float model's output unchanged.

    Returns:
        The copy, in ``train()`` mode, with ``.qdq_qat`` (:class:`QatState`).

    Raises:
        ValueError: not a prepared model, a quantizer without amax (calibrate first), an unknown
            option, or ``bn="fold"`` without ``example_inputs``.
    """
    plan = plan_of(prepared)
    if learn_amax is not None and learn_amax not in AMAX_GRADS:
        raise ValueError(f"learn_amax must be None or one of {AMAX_GRADS}, got {learn_amax!r}")
    if learn_scope not in LEARN_SCOPES:
        raise ValueError(f"learn_scope must be one of {LEARN_SCOPES}, got {learn_scope!r}")
    if bn not in BN_MODES:
        raise ValueError(f"bn must be one of {BN_MODES}, got {bn!r}")
    if bn == "fold" and example_inputs is None:
        raise ValueError("bn='fold' needs example_inputs (one batch) to find Conv→BatchNorm pairs")
    if qat_state(prepared) is not None:
        raise ValueError("this model was already prepared for QAT (it has .qdq_qat)")
    missing = [
        n for n, q in quantizers_of(prepared).items()
        if q.mode is QuantMode.QUANTIZE and not q.is_calibrated
    ]  # fmt: skip
    if missing:
        raise ValueError(
            f"{len(missing)} quantizer(s) have no amax (first: {missing[:5]}); run "
            "qdq.calibrate before qdq.qat.prepare"
        )
    model = copy.deepcopy(prepared)
    object.__setattr__(model, "qdq_plan", plan)
    state = QatState(learn_amax=learn_amax, learn_scope=learn_scope, bn=bn)
    state.dropped_ptq = _drop_ptq_state(model)
    if bn == "fold":
        assert example_inputs is not None
        state.folded, state.not_folded = fold_batchnorms(model, tuple(example_inputs))
    if bn in ("freeze", "fold"):
        for m in model.modules():
            if isinstance(m, _BN_TYPES):
                m.register_forward_pre_hook(_run_in_eval)
    if learn_amax is not None:
        for q in quantizers_of(model).values():
            is_weight = q.name.endswith(":weight")
            wanted = learn_scope == "all" or (learn_scope == "weights") == is_weight
            # a block format's scales are the blocks' own: its amax stays frozen
            if wanted and q.mode is QuantMode.QUANTIZE and not q.spec.is_block:
                q.learn_amax(learn_amax)
    object.__setattr__(model, _STATE_ATTR, state)
    model.train()
    return model


def _run_in_eval(module: nn.Module, args: Any) -> None:
    """Forward pre-hook of a frozen BatchNorm: normalise with the running statistics."""
    module.training = False


def _drop_ptq_state(model: nn.Module) -> list[str]:
    dropped = [n for n, q in quantizers_of(model).items() if q.learned]
    for n in dropped:
        q = model.get_submodule(n)
        assert isinstance(q, Quantizer)
        q.clear_learned()
    if dropped:
        warnings.warn(
            f"qdq.qat.prepare dropped the AdaRound/bias-correction state of {len(dropped)} weight "
            f"quantizer(s) ({dropped[:3]}...): QAT trains the float weights, so state learned for "
            "them would be stale after the first step",
            stacklevel=3,
        )
    return dropped


# ------------------------------------------------------------------------------ BatchNorm fold
def fold_batchnorms(
    model: nn.Module, example_inputs: tuple[Any, ...]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Fold, in place, each BatchNorm whose input is a Conv module's output into that Conv.

    A pair is found by one float forward on ``example_inputs`` (the BatchNorm's input is the very
    tensor the Conv returned, each called once). Each fold is checked by a float forward: when the
    output moves by more than 1e-4 (relative), the Conv's output had other readers and the fold
    is undone. A folded BatchNorm becomes ``nn.Identity`` at the same path; the Conv gets
    ``w·γ/σ`` and ``(b−μ)·γ/σ + β``, and its per-channel weight amax is re-derived by abs-max.

    Returns:
        ``(folded, not_folded)``: ``(conv, bn)`` path pairs, and ``(bn, reason)`` pairs.
    """
    pairs, unpaired = _conv_bn_pairs(model, example_inputs)
    reference = _float_outputs(model, example_inputs)
    weight_quantizer = _weight_quantizers(model)
    folded: list[tuple[str, str]] = []
    not_folded = list(unpaired)
    for conv_path, bn_path in pairs:
        conv = model.get_submodule(conv_path)
        bnm = model.get_submodule(bn_path)
        assert isinstance(conv, _CONV_TYPES) and isinstance(bnm, _BN_TYPES)
        saved_w = conv.weight.detach().clone()
        saved_b = None if conv.bias is None else conv.bias.detach().clone()
        had_bias = conv.bias is not None
        _fold_into(conv, bnm)
        _set_submodule(model, bn_path, _identity_like(bnm))
        if _close(_float_outputs(model, example_inputs), reference):
            folded.append((conv_path, bn_path))
            continue
        with torch.no_grad():  # undo: the Conv's output is read elsewhere too
            conv.weight.copy_(saved_w)
            if had_bias and saved_b is not None and conv.bias is not None:
                conv.bias.copy_(saved_b)
            else:
                conv.bias = None
        _set_submodule(model, bn_path, bnm)
        not_folded.append((bn_path, f"{conv_path}'s output has readers besides the BatchNorm"))
    for conv_path, _ in folded:
        q = weight_quantizer.get(conv_path)
        conv = model.get_submodule(conv_path)
        if q is not None and q.is_calibrated and isinstance(conv, _CONV_TYPES):
            q.calibrate_from(conv.weight)
    if folded:
        _log.info("folded %d BatchNorm(s) into their Conv", len(folded))
    return folded, not_folded


def _conv_bn_pairs(
    model: nn.Module, example_inputs: tuple[Any, ...]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    produced: dict[int, str] = {}
    calls: dict[str, int] = {}
    found: dict[str, str] = {}
    unpaired: dict[str, str] = {}
    handles = []

    def conv_hook(path: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            calls[path] = calls.get(path, 0) + 1
            if isinstance(output, torch.Tensor):
                produced[id(output)] = path

        return hook

    def bn_hook(path: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            calls[path] = calls.get(path, 0) + 1
            src = produced.get(id(args[0])) if args and isinstance(args[0], torch.Tensor) else None
            if src is None:
                unpaired[path] = "its input is not a Conv module's output"
            else:
                found[path] = src

        return hook

    for path, m in model.named_modules():
        if isinstance(m, _CONV_TYPES) and not isinstance(m, Quantizer):
            handles.append(m.register_forward_hook(conv_hook(path)))
        elif isinstance(m, _BN_TYPES):
            if type(m) not in _BN_TYPES:  # timm's BatchNormAct2d: its forward does more
                unpaired[path] = f"{type(m).__name__} has its own forward (not a plain BatchNorm)"
                continue
            if not (m.affine and m.track_running_stats and m.running_mean is not None):
                unpaired[path] = "it has no affine parameters or running statistics"
                continue
            handles.append(m.register_forward_pre_hook(bn_hook(path)))
    try:
        _float_outputs(model, example_inputs, keep=produced)
    finally:
        for h in handles:
            h.remove()
    pairs = []
    used_convs: set[str] = set()
    for bn_path, conv_path in found.items():
        if bn_path in unpaired:
            continue
        if calls.get(bn_path, 0) != 1 or calls.get(conv_path, 0) != 1:
            unpaired[bn_path] = "it or its Conv is called more than once per forward"
        elif conv_path in used_convs:
            unpaired[bn_path] = f"{conv_path} already feeds another BatchNorm"
        else:
            used_convs.add(conv_path)
            pairs.append((conv_path, bn_path))
    return pairs, sorted(unpaired.items())


def _float_outputs(
    model: nn.Module, example_inputs: tuple[Any, ...], *, keep: dict[int, str] | None = None
) -> list[torch.Tensor]:
    """The float model's output tensors (quantizers bypassed, eval, no grad).

    ``keep`` holds ids of intermediate tensors; the outputs of the forward keep them alive, so
    every id stays unique during the pairing forward (the tensors are gathered, then dropped).
    """
    was_training = model.training
    kept: list[Any] = []
    try:
        model.eval()
        with torch.no_grad(), quantizer_mode(model, QuantMode.BYPASS):
            if keep is not None:  # hold every intermediate so ids are not reused
                handles = [
                    m.register_forward_hook(lambda _m, _a, out: kept.append(out))
                    for m in model.modules()
                ]
                try:
                    out = model(*example_inputs)
                finally:
                    for h in handles:
                        h.remove()
            else:
                out = model(*example_inputs)
    finally:
        model.train(was_training)
    return [t.detach().float() for t in _tensors(out)]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a.shape != b.shape:
            return False
        scale = float(b.abs().max()) if b.numel() else 0.0
        if b.numel() and float((a - b).abs().max()) > _FOLD_TOLERANCE * max(scale, 1e-12):
            return False
    return True


def _fold_into(conv: nn.Module, bnm: nn.Module) -> None:
    assert isinstance(conv, _CONV_TYPES) and isinstance(bnm, _BN_TYPES)
    assert bnm.running_mean is not None and bnm.running_var is not None
    with torch.no_grad():
        std = torch.sqrt(bnm.running_var.float() + bnm.eps)
        factor = bnm.weight.float() / std
        shape = [-1] + [1] * (conv.weight.dim() - 1)
        w = conv.weight.float() * factor.reshape(shape)
        bias = conv.bias.float() if conv.bias is not None else torch.zeros_like(std)
        b = (bias - bnm.running_mean.float()) * factor + bnm.bias.float()
        conv.weight.copy_(w.to(conv.weight.dtype))
        if conv.bias is None:
            conv.bias = nn.Parameter(b.to(conv.weight.dtype))
        else:
            conv.bias.copy_(b.to(conv.bias.dtype))


def _identity_like(bnm: nn.Module) -> nn.Module:
    ident = nn.Identity()
    path = bnm.__dict__.get("_qdq_path")
    if path is not None:  # the call-site runtime names calls by this path
        ident.__dict__["_qdq_path"] = path
    return ident


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def _weight_quantizers(model: nn.Module) -> dict[str, Quantizer]:
    plan = plan_of(model)
    present = quantizers_of(model)
    out: dict[str, Quantizer] = {}
    for g in plan.groups:
        leader = plan.point(g.leader)
        if leader.kind == "weight" and g.quantizer in present:
            out[leader.owner] = present[g.quantizer]
    return out
