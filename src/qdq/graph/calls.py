"""Call sites: how qdq sees, names and counts the torch calls a model makes.

qdq places Q/DQ on the user's *own* modules (a deep copy), at the call sites of their ``forward``
code. One mechanism serves both directions, so that what is planned is exactly what runs:

* the recorder (:mod:`qdq.graph.record`) runs the model once on the example inputs and writes every
  call as a graph node, tagged with its :data:`SiteKey`;
* the runtime (:mod:`qdq.graph.runtime`) sees the same calls whenever the prepared model runs
  (eager, training, ``torch.export``, the TorchScript tracer) and applies the plan's quantizers at
  the keys the plan names.

A call is seen through a :class:`torch.overrides.TorchFunctionMode` (every ``torch.*`` function,
``torch.nn.functional`` function and ``Tensor`` method or operator), the module it ran in through
forward hooks on every module of the copy. Its key is ``(module path, family, ordinal)``: the
innermost module's path, the call's name (``"conv2d"``, ``"add"``, ``"cat"`` ...) and how many
calls of that name the module made before it since the outermost module was entered. A built-in
``torch.nn`` module that is not a Conv/Linear (ReLU, BatchNorm, MaxPool, AvgPool ...) is one call
``(path, "module", invocation)``; what it does inside is not looked at (as torch.fx treats leaves).
``F.scaled_dot_product_attention`` is seen as its parts (:mod:`qdq.graph.attention`).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Container
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from qdq.graph.attention import attention_math, is_mha, is_sdpa, multi_head_attention_math
from qdq.graph.capture import TRACE_THROUGH

__all__ = [
    "MODULE",
    "PARTS",
    "CallTracker",
    "LeafCalls",
    "SiteKey",
    "compiling",
    "is_leaf",
    "normalize_call",
]

#: ``(module path, family, ordinal)``; the ordinal is ``None`` in a key that matches every call
SiteKey = tuple[str, str, int | None]
#: the family of a call to a leaf module
MODULE = "module"
#: in :data:`LeafCalls` families: a call the mode sees as its parts (SDPA, MHA), which it keys
#: outside a leaf module whatever the families wanted
PARTS = "*parts"
#: what one leaf module did in a recorded forward: the families of the torch calls its forward
#: made (as the mode saw them) and the paths it was called at (the innermost module path below it)
LeafCalls = tuple[frozenset[str], frozenset[str]]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
#: torch.nn modules whose Python forward is seen into: MultiheadAttention's projections are GEMMs
#: and its products attention MatMuls (P01, P16); the Transformer layers around it hold Linears.
#: Their native fast paths are not taken while a torch function mode is active (recording, the
#: call-site runtime, export), so all three see the same functional calls.
_SEEN_INTO = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.Transformer,
)
_PATH_ATTR = "_qdq_path"
#: ``(path, is_leaf)`` of a module, kept on the module with its path: what the hooks read per call
_ENTRY_ATTR = "_qdq_entry"


def _path_of(module: nn.Module) -> str | None:
    path = module.__dict__.get(_PATH_ATTR)
    return path if isinstance(path, str) else None


class _Every:
    """The families a tracker that keys every call (the recorder) wants at a path: all of them."""

    def __contains__(self, family: object) -> bool:
        return True

    def __bool__(self) -> bool:
        return True


#: every family, at every path (:attr:`CallTracker.wanted` ``None``)
EVERY = _Every()
_NONE: frozenset[str] = frozenset()


_TENSOR_QUALNAMES = ("TensorBase.", "Tensor.")


_LEAF_TYPES: dict[type, bool] = {}


def is_leaf(module: nn.Module) -> bool:
    """A module seen as one call: built-in ``torch.nn`` modules except containers and Conv/Linear
    (which are seen through, so their subclasses and functional forms are planned alike), and
    TorchScript modules (whose insides no Python hook can see)."""
    kind = type(module)
    leaf = _LEAF_TYPES.get(kind)
    if leaf is None:
        leaf = _LEAF_TYPES[kind] = _is_leaf_type(module)
    return leaf


def _is_leaf_type(module: nn.Module) -> bool:
    if isinstance(module, torch.jit.ScriptModule):
        return True
    if isinstance(module, (*TRACE_THROUGH, *_CONTAINERS, *_SEEN_INTO)):
        return False
    from qdq.quant import Quantizer

    if isinstance(module, Quantizer):
        return True
    return type(module).__module__.startswith(("torch.nn", "torch.ao.nn"))


def normalize_call(func: Callable[..., Any]) -> tuple[str, Any, str]:
    """``(fx op, fx target, family)`` of a call seen by a torch function mode.

    Tensor methods and operators become ``call_method`` nodes named like torch.fx names them
    (``x + y`` is ``add``, ``x @ w`` is ``matmul``), indexing ``operator.getitem``/``setitem``,
    tensor properties (``x.T``) ``getattr``; everything else is a ``call_function`` of ``func``.

    Example:
        >>> normalize_call(torch.Tensor.add)
        ('call_method', 'add', 'add')
        >>> normalize_call(torch.cat)[2]
        'cat'
    """
    name = getattr(func, "__name__", "") or ""
    qual = getattr(func, "__qualname__", "") or ""
    owner = getattr(func, "__self__", None)
    if name == "__get__" and hasattr(owner, "__name__") and hasattr(owner, "__objclass__"):
        return "call_function", getattr, f"getattr.{getattr(owner, '__name__', '')}"
    if qual.startswith(_TENSOR_QUALNAMES):
        if name == "__getitem__":
            return "call_function", operator.getitem, "getitem"
        if name == "__setitem__":
            return "call_function", operator.setitem, "setitem"
        return "call_method", name, name
    return "call_function", func, name or type(func).__name__


#: :func:`normalize_call` per function object, and whether it is seen as its parts (SDPA, MHA):
#: a model calls the same few dozen functions thousands of times per forward
_CALL_INFO: dict[Any, tuple[str, Any, str, bool]] = {}


_dynamo_compiling = torch.compiler.is_dynamo_compiling


def compiling() -> bool:
    """Whether dynamo (``torch.compile``) is tracing this call. ``torch.export``'s default
    (non-strict) tracing, which the ONNX exporter uses, runs the eager runtime: that is what
    keeps one Q per shared tensor in the exported graph."""
    return bool(torch.compiler.is_dynamo_compiling())


def _call_info(func: Callable[..., Any]) -> tuple[str, Any, str, bool]:
    if _dynamo_compiling():  # compiling(), one Python call less per torch call
        op, name, family, parts_seen = _call_info_constant(func)
        return op, (func if op == "call_function" else name), family, parts_seen
    try:
        return _CALL_INFO[func]
    except KeyError:  # never a method bound to a tensor: the cache would keep the tensor alive
        cache = not isinstance(getattr(func, "__self__", None), torch.Tensor)
    except TypeError:  # an unhashable callable: not cached
        cache = False
    info = (*normalize_call(func), is_sdpa(func) or is_mha(func))
    if cache and len(_CALL_INFO) < 4096:
        _CALL_INFO[func] = info
    return info


@torch.compiler.assume_constant_result
def _call_info_constant(func: Callable[..., Any]) -> tuple[str, str, str, bool]:
    """:func:`_call_info` as dynamo sees it: run once while tracing, its result a constant
    (dynamo cannot trace the attribute reads of :func:`normalize_call`, and a cache that grows
    while a frame is traced fails that frame's own guards)."""
    op, target, family = normalize_call(func)
    return op, target if isinstance(target, str) else family, family, is_sdpa(func) or is_mha(func)


class _Mode(TorchFunctionMode):
    """Routes every torch call made while a tracker is active to :meth:`CallTracker.on_call`."""

    def __init__(self, tracker: CallTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        tracker = self.tracker
        if tracker.leaf_depth:  # inside a leaf module: run as it is
            if tracker.notes_leaf_calls:
                tracker.on_leaf_call(func)
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or {}
        op, target, family, parts_seen = _call_info(func)
        # a family no site of this module wants is not counted: its keys name nothing
        if (not parts_seen and family not in tracker.here) or (
            _size_arithmetic(args, kwargs) and getattr(func, "__name__", "") not in VALUE_READS
        ):
            return func(*args, **kwargs)
        if parts_seen:
            if is_sdpa(func):  # seen as its parts, so Q·Kᵀ and P·V can be planned (P16)
                with self:
                    return attention_math(*args, **kwargs)
            with self:  # nn.MultiheadAttention: its GEMMs (P01) and products (P16)
                parts = multi_head_attention_math(*args, **kwargs)
            if parts is not None:
                return parts
        key = tracker.next_key(family)
        return tracker.on_call(func, key, op, target, args, kwargs)


#: calls that turn a tensor value into a Python value (control flow may depend on it): seen even
#: on a 0-dim tensor, where ``bool(x.mean() > 0)`` decides a branch
VALUE_READS = frozenset({"__bool__", "item", "tolist", "__int__", "__float__", "__index__"})


def _size_arithmetic(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether every tensor operand is a 0-dim integer or bool tensor: arithmetic on sizes.

    In eager mode ``H + pad`` with ``H = x.shape[1]`` is Python arithmetic and no torch call; the
    TorchScript tracer hands out sizes as 0-dim int64 tensors, so the same line becomes a torch
    ``add``. Counted, it would take the call-site key of the module's next real Add (TinyViT's
    window padding shifted every Add of its blocks by one). Such calls are not counted in any
    mode: eager and traced runs then key the same calls. A 0-dim integer tensor is never quantized.
    """
    found = False
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor):
                if item.dim() != 0 or item.is_floating_point() or item.is_complex():
                    return False
                found = True
    return found


def _hooks_run_eagerly_as_frames() -> None:
    """Have dynamo run the tracker's hooks eagerly where they are frames of their own.

    ``torch.compile(prepared)`` runs the root module's hooks outside the compiled forward (as
    ``_call_impl`` calls them): dynamo would compile each as a frame, with guards of its own
    (the grad mode, the output's batch size) and so recompilations the float model has not
    (issue 48). They only keep the tracker's books, so those frames, and every call they make,
    run as plain Python. Where dynamo inlines them (a module called inside a compiled forward,
    a prepared model inside a compiled parent with ``fullgraph=True``) they are traced as before:
    a frame's strategy is not looked at when it is inlined (``torch.compiler.disable`` would
    break the graph there). Set at every :meth:`CallTracker.install` (``torch._dynamo`` resets
    may clear it).
    """
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # a torch without per-code strategies: the hooks compile as frames
        return
    try:  # a private API: another torch may spell it otherwise (then as above)
        skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
        for hook in (CallTracker._pre, CallTracker._post):
            set_code_exec_strategy(hook.__code__, skip)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return


class CallTracker:
    """Module stack, per-path call counters and the torch function mode, shared by the recorder
    and the runtime. Hooks on every module of ``root`` keep the stack; the first module entered
    (usually ``root``) activates the mode and resets the counters, and deactivates on exit.

    Subclasses implement :meth:`on_call` and may override :meth:`on_leaf_enter`/``on_leaf_exit``.
    """

    #: whether the mode reports the calls made inside leaf modules (:meth:`on_leaf_call`)
    notes_leaf_calls = False

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        #: the first qualified name of every module object (shared modules have one path)
        self.paths: dict[nn.Module, str] = {m: name for name, m in root.named_modules()}
        for module, name in self.paths.items():
            # kept on the module itself: exporters may run shallow copies of the modules
            object.__setattr__(module, _PATH_ATTR, name)
            object.__setattr__(module, _ENTRY_ATTR, (name, is_leaf(module)))
        #: the families keyed at each path (a path not in it: none); ``None``: every family at
        #: every path (the recorder keys every call). A call of a family not wanted at the
        #: innermost module's path is run as it is and not counted.
        self.wanted: dict[str, frozenset[str]] | None = None
        #: the families wanted at the innermost module's path, set as modules are entered and left
        self.here: Container[str] = EVERY
        self.leaf_depth = 0
        self._stack: list[nn.Module] = []
        #: the innermost named module's path at each depth of ``_stack`` ("" below the root)
        self._path_stack: list[str] = []
        #: :attr:`here` at each depth of ``_stack``
        self._here_stack: list[Container[str]] = []
        self._counters: Counter[tuple[str, str]] = Counter()
        self._mode: _Mode | None = None
        self._active_by: nn.Module | None = None

    # ------------------------------------------------------------------ hooks
    def hooked(self) -> list[nn.Module]:
        """The modules whose calls the tracker follows (every module of ``root``; a subclass
        may leave out modules it runs itself, whose calls it never keys)."""
        return list(self.paths)

    def install(self, *, prepend: bool = False) -> list[Any]:
        """Register the stack hooks on every module of :meth:`hooked`; return the handles.

        With ``prepend`` the tracker is entered before the model's other hooks (and so before
        another tracker already installed): its torch function mode then sits *below* the other
        one and sees the calls after the other one changed them.
        """
        _hooks_run_eagerly_as_frames()
        handles = []
        for module in self.hooked():
            handles.append(
                module.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=prepend)
            )
            handles.append(  # exits mirror entries: the tracker entered first leaves last
                module.register_forward_hook(self._post, always_call=True, prepend=not prepend)
            )
        return handles

    def _pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self._active_by is None:
            self._activate(module)
        entry = module.__dict__.get(_ENTRY_ATTR)
        if entry is None:  # not a module of root when the tracker was made
            own, leaf = _path_of(module), is_leaf(module)
        else:
            own, leaf = entry
        wanted = self.wanted
        if own is None and self._path_stack:  # seen as part of the module that runs it
            path, here = self._path_stack[-1], self.here
        else:
            path = own or ""
            here = EVERY if wanted is None else wanted.get(path, _NONE)
        self._stack.append(module)
        self._path_stack.append(path)
        self._here_stack.append(here)
        self.here = here
        if self.leaf_depth:
            self.leaf_depth += 1
            return None
        if not leaf:
            return None
        self.leaf_depth = 1
        own = own or ""
        if wanted is not None and MODULE not in wanted.get(own, _NONE):
            return None
        key = self.next_key(MODULE, path=own)
        return self.on_leaf_enter(module, key, args, kwargs)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        stack = self._stack
        if stack and stack[-1] is module:
            stack.pop()
            self._path_stack.pop()
            here_stack = self._here_stack
            here_stack.pop()
            self.here = here_stack[-1] if here_stack else EVERY
        if self.leaf_depth:
            self.leaf_depth -= 1
            if self.leaf_depth == 0:
                self.on_leaf_exit(module, output)
        if module is self._active_by:
            self._deactivate()

    def _activate(self, module: nn.Module) -> None:
        self._active_by = module
        # a new counter, not clear(): under torch.compile, clear() reads the old counter's size,
        # a guard of the compiled hook on what the last forward counted (a recompile: issue 48)
        self._counters = Counter()
        self._clear_stacks()
        self._mode = _Mode(self)
        self._mode.__enter__()
        self.on_activate()

    def _clear_stacks(self) -> None:
        self._stack.clear()
        self._path_stack.clear()
        self._here_stack.clear()
        self.here = EVERY
        self.leaf_depth = 0

    def abandon(self) -> None:
        """Forget a forward that never returned through the hooks.

        ``torch.export`` can fail inside a module and unwind without running the outer modules'
        forward hooks; the tracker would then stay active, and the next forward (another
        exporter's trace) would continue the old call counters and miss the planned sites. The
        torch function mode of that forward must already be off torch's mode stack.
        """
        self._mode, self._active_by = None, None
        self._clear_stacks()
        self._counters.clear()
        self.on_deactivate()

    def _deactivate(self) -> None:
        mode, self._mode, self._active_by = self._mode, None, None
        self._clear_stacks()
        try:
            if mode is not None:
                mode.__exit__(None, None, None)
        finally:
            self.on_deactivate()

    # ----------------------------------------------------------------- keys
    def current_path(self) -> str:
        """The path of the innermost module being run ("" for the root or none)."""
        return self._path_stack[-1] if self._path_stack else ""

    def stack_paths(self) -> list[tuple[str, type]]:
        """``(path, type)`` of the modules being run, outermost first (root excluded)."""
        out = []
        for module in self._stack:
            path = _path_of(module)
            if path:
                out.append((path, type(module)))
        return out

    def next_key(self, family: str, *, path: str | None = None) -> SiteKey:
        """The key of the next call of ``family`` in ``path`` (default: the innermost module)."""
        p = self.current_path() if path is None else path
        i = self._counters[(p, family)]
        self._counters[(p, family)] = i + 1
        return (p, family, i)

    # ---------------------------------------------------------- subclass API
    def on_call(
        self,
        func: Callable[..., Any],
        key: SiteKey,
        op: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run one torch call (``func(*args, **kwargs)``) and return its result."""
        return func(*args, **kwargs)

    def on_leaf_enter(
        self, module: nn.Module, key: SiteKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """A leaf module is entered; may return replacement ``(args, kwargs)``."""
        return None

    def on_leaf_exit(self, module: nn.Module, output: Any) -> None:
        """The leaf module entered last returned ``output``."""

    def on_leaf_call(self, func: Callable[..., Any]) -> None:
        """A torch call inside a leaf module (with :attr:`notes_leaf_calls`); it is run as is."""

    def on_activate(self) -> None:
        """The outermost module was entered."""

    def on_deactivate(self) -> None:
        """The outermost module returned (or raised)."""
