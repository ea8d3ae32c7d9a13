"""Model specs for ``qdq quantize``: a zoo name, a factory, a ``.pt2``, TorchScript or ``.onnx`` file.

* a built-in zoo name (``qdq zoo list``): its pretrained model, data, preprocessing and metric;
* ``pkg.module:factory`` or ``path/to/file.py:factory`` (:func:`qdq.specs.load_model_spec`; this
  imports or executes that code);
* ``model.pt2``: a saved ``torch.export.ExportedProgram``, run as ``torch.export.load(p).module()``.
  Unless ``trust_model`` is set, the archive is checked first and refused when loading it would
  run code (a pickle, AOTInductor code, a shape expression or guard that is not plain size
  arithmetic: :mod:`qdq.pipeline.model_files`); a normal ``torch.export.save``-d program passes.
  Its ATen calls that qdq places Q/DQ around (``aten.conv2d``, ``aten.linear``, ``aten.add`` ...) are
  mapped back to the ``torch`` functions with the same signature, so the planner sees them; a batch
  dimension the export made static stays static (every batch then has that size); the graph runs
  in the mode it was exported in (export in eval mode);
* ``model.onnx``: an FP32 ONNX model converted with ``onnx2torch`` (optional: ``pip install onnx2torch``),
  its external data checked against each tensor's size before it is read;
* TorchScript archives are refused with the reason: ScriptModules allow no Python hooks, which qdq's
  capture needs; export the model with ``torch.export`` and pass the ``.pt2``, or pass its factory.
"""

from __future__ import annotations

import contextlib
import logging
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from qdq.specs import load_model_spec
from qdq.zoo.registry import MODELS, ZooEntry, get_model

__all__ = ["ModelSource", "resolve_model"]

_log = logging.getLogger("qdq.pipeline")
_TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript", ".zip")


@dataclass(frozen=True)
class ModelSource:
    """A float model and where it came from.

    Attributes:
        module: the model, in eval mode.
        kind: ``"zoo"``, ``"factory"``, ``"pt2"``, ``"onnx"`` or ``"module"`` (given as an object).
        spec: what the user passed (or the class name).
        zoo: the zoo entry for ``kind == "zoo"``.
        static_batch: the batch size the model only accepts (a ``.pt2`` exported with a static
            batch dimension), else ``None``.
        input_shape: the input shape the model was exported with, when known (a ``.pt2`` with
            one input).
    """

    module: nn.Module
    kind: str
    spec: str
    zoo: ZooEntry | None = None
    static_batch: int | None = None
    input_shape: tuple[int, ...] | None = None


def resolve_model(spec: str | nn.Module, *, trust_model: bool = False) -> ModelSource:
    """Load the model a spec names (a factory spec executes user code).

    Args:
        spec: a model spec (above) or an ``nn.Module``.
        trust_model: load a ``.pt2`` as ``torch.export.load`` does, unchecked: it may then run
            code the file holds. Only for a file whose sender you trust.

    Raises:
        ValueError: an unknown name (listing the zoo), a malformed spec, a file qdq cannot use
            (TorchScript, a pickled checkpoint, a ``.pt2`` that would run code, an ONNX whose
            external data does not match its tensors), a missing optional package (naming it).
        FileNotFoundError: a path that does not exist.
    """
    if isinstance(spec, nn.Module):
        return ModelSource(spec, "module", type(spec).__name__)
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"model must be an nn.Module or a spec string, got {spec!r}")
    if spec in MODELS:
        entry = get_model(spec)
        missing = [f"pip install {pip}" for mod, pip in entry.requires if not _importable(mod)]
        if missing:
            raise ValueError(f"zoo model {spec!r} needs: {'; '.join(missing)}")
        return ModelSource(entry.build().eval(), "zoo", spec, zoo=entry)
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix in (".pt2", ".onnx") or (suffix in _TORCHSCRIPT_SUFFIXES and ":" not in spec):
        if not path.is_file():
            if path.exists():
                raise ValueError(f"model {spec}: not a regular file")
            raise FileNotFoundError(f"no model file at {spec}")
        if suffix == ".pt2":
            return _load_pt2(path, trust_model)
        if suffix == ".onnx":
            return _load_onnx(path)
        _refuse_archive(path)
    if ":" in spec:
        return ModelSource(load_model_spec(spec), "factory", spec)
    if path.exists():
        raise ValueError(
            f"model {spec!r}: not a .pt2, TorchScript or .onnx file; for Python code give "
            "path/to/file.py:factory (the function that returns the model)"
        )
    if "/" in spec or "\\" in spec or suffix == ".py":
        raise FileNotFoundError(f"no model file at {spec}")
    raise ValueError(
        f"unknown model {spec!r}; built-in zoo models: {', '.join(sorted(MODELS))}; or give "
        "pkg.module:factory, path/to/file.py:factory, a .pt2 or an .onnx file"
    )


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _refuse_archive(path: Path) -> None:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        if any(n.endswith("constants.pkl") for n in names) and any("/code/" in n for n in names):
            raise ValueError(
                f"{path} is a TorchScript archive: qdq cannot look inside ScriptModules (they take "
                "no Python hooks, which qdq's capture relies on). Export the model with "
                "torch.export.export(model, (x,)) and torch.export.save(ep, 'model.pt2') and pass "
                "the .pt2, or pass its Python factory as pkg.module:factory"
            )
    raise ValueError(
        f"{path} is not a TorchScript archive nor an ExportedProgram (a pickled checkpoint or "
        "state_dict holds no model code): pass the model's factory as pkg.module:factory or "
        "path/to/file.py:factory, or save it with torch.export.save as a .pt2"
    )


def _load_onnx(path: Path) -> ModelSource:
    try:
        import onnx2torch
    except ImportError:
        raise ValueError(
            f"reading the ONNX model {path} needs onnx2torch: pip install onnx2torch"
        ) from None
    from qdq.pipeline.model_files import load_onnx_checked

    model = load_onnx_checked(path)  # external data checked, then read
    try:
        module = onnx2torch.convert(model)  # in memory: nothing written beside the file
    except Exception as err:
        raise ValueError(f"onnx2torch cannot convert {path}: {type(err).__name__}: {err}") from None
    return ModelSource(module.eval(), "onnx", str(path))


def _load_pt2(path: Path, trust_model: bool) -> ModelSource:
    from qdq.pipeline.model_files import check_pt2

    with open(path, "rb") as fh:  # checked and loaded from the same open file
        if not trust_model:
            check_pt2(fh, str(path))
            fh.seek(0)
        with _torch_export_log() as logged:
            try:
                ep = torch.export.load(fh)
            except Exception as err:
                cause = logged.error or err  # torch logs the real cause, then raises a generic one
                text = " ".join(str(cause).split())
                text = text if len(text) <= 300 else text[:297] + "..."
                raise ValueError(
                    f"cannot read {path} as a torch.export ExportedProgram: "
                    f"{type(cause).__name__}: {text}"
                ) from None
    from torch.export.graph_signature import InputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if not users:
        raise ValueError(f"{path} takes no input tensor")
    shapes = {
        node.name: tuple(node.meta["val"].shape)
        for node in ep.graph.nodes
        if node.op == "placeholder"
        and node.name in users
        and hasattr(node.meta.get("val"), "shape")
    }
    batch = {n: s[0] for n, s in shapes.items() if s and isinstance(s[0], int)}
    if len(set(batch.values())) > 1:
        raise ValueError(f"{path} was exported with inputs of different static batch sizes {batch}")
    static = next(iter(batch.values()), None)  # every batch is padded to it
    shape = shapes.get(users[0], ()) if len(users) == 1 else ()
    module = ep.module()
    # ep.module() forbids .train()/.eval() (instance attributes that raise): its graph keeps the
    # mode it was exported in whatever the flag says, so the plain nn.Module methods are harmless
    for name in ("train", "eval"):
        module.__dict__.pop(name, None)
    _aten_to_torch(module)
    dims = tuple(d if isinstance(d, int) else -1 for d in shape) if shape else None
    return ModelSource(module.eval(), "pt2", str(path), static_batch=static, input_shape=dims)


class _LogCapture(logging.Handler):
    """The last exception ``torch.export.load`` logged (it logs a traceback, then retries)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.error: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.error = record.exc_info[1]


@contextlib.contextmanager
def _torch_export_log() -> Iterator[_LogCapture]:
    """Keep ``torch.export``'s load warnings (a traceback) off stderr; capture their cause."""
    logger = logging.getLogger("torch.export")
    handler = _LogCapture()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


#: ATen op packets whose positional schema equals that of these ``torch`` functions
_ATEN_TO_TORCH: dict[str, Callable[..., Any]] = {
    "conv1d": F.conv1d,
    "conv2d": F.conv2d,
    "conv3d": F.conv3d,
    "conv_transpose1d": F.conv_transpose1d,
    "conv_transpose2d": F.conv_transpose2d,
    "conv_transpose3d": F.conv_transpose3d,
    "linear": F.linear,
    "matmul": torch.matmul,
    "mm": torch.mm,
    "bmm": torch.bmm,
    "add": torch.add,
    "mul": torch.mul,
    "cat": torch.cat,
    "max_pool1d": F.max_pool1d,
    "max_pool2d": F.max_pool2d,
    "max_pool3d": F.max_pool3d,
    "avg_pool1d": F.avg_pool1d,
    "avg_pool2d": F.avg_pool2d,
    "avg_pool3d": F.avg_pool3d,
    "adaptive_avg_pool1d": F.adaptive_avg_pool1d,
    "adaptive_avg_pool2d": F.adaptive_avg_pool2d,
    "adaptive_avg_pool3d": F.adaptive_avg_pool3d,
    "relu": torch.relu,
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "gelu": F.gelu,
    "flatten": torch.flatten,
    "clamp": torch.clamp,
}


#: in-place ATen ops (``torch.export``'s default IR keeps ``relu_``/``add_`` of the eager code)
#: and their out-of-place ``torch`` functions: mapped where no later node reads the mutated input
_INPLACE_TO_TORCH: dict[str, Callable[..., Any]] = {
    "add_": torch.add,
    "mul_": torch.mul,
    "relu_": torch.relu,
    "hardtanh_": F.hardtanh,
    "silu_": F.silu,
    "sigmoid_": torch.sigmoid,
    "hardswish_": F.hardswish,
    "hardsigmoid_": F.hardsigmoid,
    "clamp_": torch.clamp,
}


def _last_reader(node: Any, order: dict[Any, int]) -> bool:
    """Whether no node after ``node`` reads the input it mutates (its first argument)."""
    target: Any = node.args[0] if node.args else None
    if not hasattr(target, "users"):
        return False
    return all(order[user] <= order[node] for user in target.users if user is not node)


def _aten_to_torch(gm: nn.Module) -> None:
    """Map the ATen calls of an unlifted ExportedProgram to their ``torch`` functions in place.

    The planner knows ``torch`` functions. A program exported from eager code also holds in-place
    ops (``aten.add_`` of a residual ``out += identity``, ``aten.relu_`` of ``inplace=True``): one
    is mapped to its out-of-place function when nothing after it reads the input it mutates
    (everything reads its result), so the graph computes the same; otherwise it is left alone.
    ``aten.batch_norm`` becomes ``F.batch_norm`` with its arguments in that function's order.
    Without these the residual Adds of a ``.pt2`` ResNet-18 were invisible to the planner (lint
    P03a on all 8, P04 on 5); with them its plan and lint equal the eager model's.
    """
    graph = getattr(gm, "graph", None)
    if graph is None:
        return
    mapped = 0
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name = node.target.overloadpacket.__name__
            fn = _ATEN_TO_TORCH.get(name)
            if name == "batch_norm" and len(node.args) >= 8 and not node.kwargs:
                # aten: (input, weight, bias, mean, var, training, momentum, eps, cudnn_enabled)
                a = node.args
                node.args = (a[0], a[3], a[4], a[1], a[2], a[5], a[6], a[7])
                fn = F.batch_norm
            if fn is None and name in _INPLACE_TO_TORCH and _last_reader(node, order):
                fn = _INPLACE_TO_TORCH[name]
            if fn is not None:
                node.target = fn
                mapped += 1
    gm.recompile()  # type: ignore[operator]
    _log.debug("mapped %d ATen calls to torch functions", mapped)
