"""The helpers NVIDIA's recipes (yolov7 QAT, BEVFusion's lean quantizer) copy between projects,
written for :mod:`qdq.compat.pytorch_quantization`.

* :class:`QuantAdd` / :class:`QuantConcat` — hand-placed quantized ``+`` and ``torch.cat``;
* :func:`replace_to_quantization_module` — swap float modules for quant modules after the model
  was built (instead of :func:`~qdq.compat.pytorch_quantization.quant_modules.initialize`);
* :class:`disable_quantization` / :class:`enable_quantization` — ``.apply()`` or ``with``;
* :func:`calibrate_model` — the collect-statistics loop, then ``load_calib_amax(method)``.

* :func:`apply_custom_rules_to_quantizer` — share input quantizers where TensorRT needs one scale,
  from qdq's scale groups (no temporary ONNX file).

* :func:`build_sensitivity_profile` — the metric with one layer in float (yolov7) or with only
  one layer quantized (pytorch-quantization's example).

As upstream, these change the given model in place (``build_sensitivity_profile`` restores it).

Example:
    >>> import torch
    >>> add = QuantAdd()
    >>> add(torch.ones(2), torch.ones(2)).tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from qdq.compat.pytorch_quantization import calib, quant_modules
from qdq.compat.pytorch_quantization import nn as quant_nn
from qdq.compat.pytorch_quantization.nn.modules._utils import QuantInputMixin, QuantMixin
from qdq.compat.pytorch_quantization.tensor_quant import QuantDescriptor

__all__ = [
    "QuantAdd",
    "QuantConcat",
    "apply_custom_rules_to_quantizer",
    "build_sensitivity_profile",
    "calibrate_model",
    "disable_quantization",
    "enable_quantization",
    "replace_to_quantization_module",
]

_log = logging.getLogger("qdq.compat")

IgnorePolicy = str | Sequence[str] | Callable[[str], bool] | None


def _histogram_desc() -> QuantDescriptor:
    return QuantDescriptor(num_bits=8, calib_method="histogram")


class QuantAdd(nn.Module):
    """``x + y`` with each input quantized (yolov7's QuantAdd: ``_input0_quantizer``,
    ``_input1_quantizer``, histogram calibration); ``quantization=False`` adds in float.

    For a residual add, TensorRT fuses ``conv + add`` when only the *skip* input is quantized:
    disable ``_input0_quantizer`` or ``_input1_quantizer`` for the conv branch.
    """

    def __init__(self, quantization: bool = True) -> None:
        super().__init__()
        self.quantization = quantization
        if quantization:
            self._input0_quantizer = quant_nn.TensorQuantizer(_histogram_desc())
            self._input1_quantizer = quant_nn.TensorQuantizer(_histogram_desc())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.quantization:
            out: torch.Tensor = self._input0_quantizer(x) + self._input1_quantizer(y)
            return out
        return x + y


class QuantConcat(nn.Module):
    """``torch.cat`` whose inputs share one quantizer (``_input_quantizer``), as TensorRT needs
    for concat elimination: every input (and the output) in one scale.

    Example:
        >>> QuantConcat(dim=1)(torch.ones(1, 2), torch.ones(1, 3)).shape
        torch.Size([1, 5])
    """

    def __init__(self, dim: int = 1, quantization: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.quantization = quantization
        if quantization:
            self._input_quantizer = quant_nn.TensorQuantizer(_histogram_desc())

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        items: Sequence[torch.Tensor] = tensors
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            items = tensors[0]
        if self.quantization:
            items = [self._input_quantizer(t) for t in items]
        return torch.cat(list(items), dim=self.dim)


def _ignored(policy: IgnorePolicy, path: str) -> bool:
    if policy is None:
        return False
    if callable(policy):
        return bool(policy(path))
    patterns = [policy] if isinstance(policy, str) else list(policy)
    return any(path == p or re.match(p, path) for p in patterns)


def _check_policy(policy: object) -> None:
    ok = policy is None or callable(policy) or isinstance(policy, str)
    if isinstance(policy, (list, tuple)):
        ok = all(isinstance(p, str) for p in policy)
    if not ok:
        raise TypeError(
            f"ignore_policy must be None, a regex, a list of regexes or a callable, got {policy!r}"
        )


def _to_quant(module: nn.Module, quant_cls: type) -> nn.Module:
    """A quant module holding ``module``'s parameters and settings (not its dicts: the float
    module is left as it was)."""
    quant: Any = object.__new__(quant_cls)
    for key, value in vars(module).items():
        object.__setattr__(quant, key, copy.copy(value) if isinstance(value, dict) else value)

    # init_quantizer accepts only a caller named __init__ (upstream's check); the recipes
    # call it from such a function too
    def __init__(self: Any) -> None:  # noqa: N807
        if issubclass(quant_cls, QuantMixin):
            self.init_quantizer(
                quant_cls.default_quant_desc_input, quant_cls.default_quant_desc_weight
            )
        elif issubclass(quant_cls, QuantInputMixin):
            self.init_quantizer(quant_cls.default_quant_desc_input)

    __init__(quant)
    calibrator = quant._input_quantizer._calibrator
    if isinstance(calibrator, calib.HistogramCalibrator):
        calibrator._torch_hist = True  # as the recipes set
    result: nn.Module = quant
    return result


def replace_to_quantization_module(model: nn.Module, ignore_policy: IgnorePolicy = None) -> None:
    """Replace, in place, every submodule whose type is in the default quant map (exact types:
    ``nn.Conv2d``, ``nn.Linear``, ...) by its quant class, unless ``ignore_policy`` matches its
    dotted name (a regex matched at the start, a list of them, or a callable ``name -> bool``).

    Raises:
        TypeError: an ``ignore_policy`` of another kind.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1))
        >>> replace_to_quantization_module(m, ignore_policy=r"2$")
        >>> [type(c).__name__ for c in m]
        ['QuantConv2d', 'ReLU', 'Conv2d']
    """
    _check_policy(ignore_policy)
    table = {
        getattr(e.orig_mod, e.mod_name): e.replace_mod for e in quant_modules._DEFAULT_QUANT_MAP
    }
    # the float classes, also while quant_modules.initialize() is active
    for mod, name, original in quant_modules._HELPER.orginal_func_map:
        if mod is torch.nn and name in {e.mod_name for e in quant_modules._DEFAULT_QUANT_MAP}:
            table[original] = next(
                e.replace_mod for e in quant_modules._DEFAULT_QUANT_MAP if e.mod_name == name
            )
    table = {float_cls: q for float_cls, q in table.items() if float_cls is not q}

    def walk(parent: nn.Module, prefix: str) -> None:
        for name, child in parent.named_children():
            path = f"{prefix}.{name}" if prefix else name
            quant_cls = table.get(type(child))
            if quant_cls is None:
                walk(child, path)
            elif _ignored(ignore_policy, path):
                _log.info("quantization ignored: %s", path)
            else:
                setattr(parent, name, _to_quant(child, quant_cls))

    walk(model, "")


def _quantizers(model: nn.Module) -> list[quant_nn.TensorQuantizer]:
    return [m for m in model.modules() if isinstance(m, quant_nn.TensorQuantizer)]


class disable_quantization:  # noqa: N801 (the recipes' name)
    """Bypass every TensorQuantizer of ``model``: ``disable_quantization(m).apply()``, or
    ``with disable_quantization(m):`` (on exit each quantizer returns to its state before)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._saved: list[tuple[quant_nn.TensorQuantizer, bool]] = []

    def apply(self, disabled: bool = True) -> None:
        for q in _quantizers(self.model):
            q._disabled = disabled

    def __enter__(self) -> disable_quantization:
        self._saved = [(q, q._disabled) for q in _quantizers(self.model)]
        self.apply(True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for q, state in self._saved:
            q._disabled = state


class enable_quantization(disable_quantization):  # noqa: N801 (the recipes' name)
    """Re-enable every TensorQuantizer of ``model``: ``.apply()`` or ``with`` (restores on exit)."""

    def apply(self, enabled: bool = True) -> None:
        super().apply(not enabled)

    def __enter__(self) -> enable_quantization:
        self._saved = [(q, q._disabled) for q in _quantizers(self.model)]
        self.apply(True)
        return self


def calibrate_model(
    model: nn.Module,
    dataloader: Iterable[Any],
    device: torch.device | str | None = None,
    num_batch: int = 25,
    *,
    method: str = "mse",
    percentile: float = 99.99,
) -> None:
    """Collect statistics on ``num_batch`` batches, then load amax into every quantizer: max
    calibrators by max, histogram calibrators by ``method`` (yolov7 uses ``"mse"``).

    A batch is a tensor or a sequence whose first item is the model input, fed as it is (the
    recipes' ``/ 255`` image scaling belongs to the data loader). The model runs in eval mode
    under ``no_grad``; its train/eval mode and every quantizer's stages are restored afterwards.

    Raises:
        ValueError: ``num_batch`` < 1 or an unknown method.
    """
    if num_batch < 1:
        raise ValueError(f"num_batch must be >= 1, got {num_batch}")
    if method not in ("entropy", "mse", "percentile", "max"):
        raise ValueError(f"method must be entropy, mse, percentile or max, got {method!r}")
    quantizers = _quantizers(model)
    saved = [(q, q._if_quant, q._if_calib, q._disabled) for q in quantizers]
    was_training = model.training
    try:
        for q in quantizers:
            q.disable_quant()
            q.enable_calib()
        model.eval()
        with torch.no_grad():
            for i, batch in enumerate(dataloader):
                if i >= num_batch:
                    break
                x = batch if isinstance(batch, torch.Tensor) else batch[0]
                model(x.to(device) if device is not None else x)
    finally:
        model.train(was_training)
        for q, if_quant, if_calib, disabled in saved:
            q._if_quant, q._if_calib, q._disabled = if_quant, if_calib, disabled
    for q in quantizers:
        if isinstance(q._calibrator, calib.MaxCalibrator):
            q.load_calib_amax(strict=False)  # a quantizer the data never reached keeps its amax
        elif method == "percentile":
            q.load_calib_amax("percentile", percentile=percentile, strict=False)
        else:
            q.load_calib_amax(method, strict=False)
        q.enable_quant()
        q.disable_calib()


def _float_shadow(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every compat quant module turned back into its torch class
    (same names, same parameters copied) and bare TensorQuantizers into ``nn.Identity``: what
    qdq's planner sees as the float model."""
    shadow = copy.deepcopy(model)

    def walk(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, quant_nn.TensorQuantizer):
                setattr(parent, name, nn.Identity())
            elif isinstance(child, (QuantMixin, QuantInputMixin)):
                base = next(c for c in type(child).__mro__ if c.__module__.startswith("torch.nn"))
                plain: Any = object.__new__(base)
                for key, value in vars(child).items():
                    object.__setattr__(
                        plain, key, copy.copy(value) if isinstance(value, dict) else value
                    )
                for q in ("_input_quantizer", "_weight_quantizer"):
                    plain._modules.pop(q, None)
                setattr(parent, name, plain)
            else:
                walk(child)

    walk(shadow)
    return shadow


def apply_custom_rules_to_quantizer(
    model: nn.Module, example_inputs: Sequence[torch.Tensor]
) -> list[tuple[str, str]]:
    """Make quant modules whose inputs TensorRT needs in one scale share one input quantizer
    (yolov7's rules: e.g. a downsample conv and the conv beside it read the same tensor).

    The groups come from qdq's placement plan of the float model (:func:`qdq.prepare` on a
    shadow copy traced with ``example_inputs``), not from a temporary ONNX export; only quant
    modules' ``_input_quantizer`` are shared (qdq's plan also puts residual adds, concats and
    pooling into groups: use ``qdq.prepare`` for those). Run it before calibration, so the shared
    quantizer calibrates on all its inputs.

    Returns:
        ``(module, leader)`` name pairs: ``module._input_quantizer`` is now ``leader``'s.

    Raises:
        TypeError: a callable instead of example inputs (yolov7 passes an ``export_onnx``
            function; qdq needs no ONNX file, only inputs to trace with).
    """
    if callable(example_inputs):
        raise TypeError(
            "apply_custom_rules_to_quantizer needs example inputs (a tuple of tensors), not an "
            "export function: qdq computes the groups without exporting ONNX"
        )
    from qdq.api import plan_of, prepare  # lazy: the planner is heavy

    inputs = (
        (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    )
    plan = plan_of(prepare(_float_shadow(model), inputs))
    holders = {
        n: m for n, m in model.named_modules() if isinstance(m, (QuantMixin, QuantInputMixin))
    }
    pairs: list[tuple[str, str]] = []
    for group in plan.groups:
        owners: list[str] = []
        for member in group.members:
            point = plan.point(member)
            if point.kind == "input" and point.owner in holders and point.owner not in owners:
                owners.append(point.owner)
        for owner in owners[1:]:
            holder: Any = holders[owner]
            holder._input_quantizer = holders[owners[0]].input_quantizer
            pairs.append((owner, owners[0]))
            _log.info("%s._input_quantizer shared with %s (%s)", owner, owners[0], group.rules)
    return pairs


SENSITIVITY_MODES = ("leave_one_out", "one_at_a_time")


def build_sensitivity_profile(
    model: nn.Module,
    evaluate: Callable[[nn.Module], float],
    *,
    mode: str = "leave_one_out",
) -> list[tuple[str, float]]:
    """``evaluate(model)`` once per quantized layer (a module owning TensorQuantizers directly).

    ``mode="leave_one_out"`` (yolov7's ``qat.py sensitive``): that layer's quantizers disabled, all
    others on — a high metric marks a layer worth keeping in float. ``"one_at_a_time"``
    (pytorch-quantization's example): only that layer's quantizers on. Every quantizer's state is
    restored afterwards, also when ``evaluate`` raises. Sort the result to rank, e.g.
    ``sorted(profile, key=lambda p: -p[1])[:10]``.

    Returns:
        ``(layer name, metric)`` in module order.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in SENSITIVITY_MODES:
        raise ValueError(f"mode must be one of {SENSITIVITY_MODES}, got {mode!r}")
    layers: list[tuple[str, list[quant_nn.TensorQuantizer]]] = []
    for name, module in model.named_modules():
        own = [c for c in module.children() if isinstance(c, quant_nn.TensorQuantizer)]
        if own and not isinstance(module, quant_nn.TensorQuantizer):
            layers.append((name, own))
    everything = _quantizers(model)
    saved = [(q, q._disabled) for q in everything]
    profile: list[tuple[str, float]] = []
    try:
        for name, own in layers:
            for q, state in saved:
                q._disabled = state if mode == "leave_one_out" else True
            for q in own:
                q._disabled = mode == "leave_one_out" or dict(saved)[q]
            profile.append((name, float(evaluate(model))))
            _log.info("sensitivity %s (%s): %.6g", name, mode, profile[-1][1])
    finally:
        for q, state in saved:
            q._disabled = state
    return profile
