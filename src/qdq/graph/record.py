"""Capture by recording: run the model once and write every call as a ``torch.fx`` graph node.

The graph has torch.fx's vocabulary (``call_function`` / ``call_method`` / ``call_module`` /
``get_attr`` / ``placeholder`` / ``output``), module paths in ``node.meta["nn_module_stack"]``,
shapes in ``node.meta["tensor_meta"]`` and each call's :data:`~qdq.graph.calls.SiteKey` in
``node.meta["qdq_site"]``. Dataflow is followed by tensor identity: a call's tensor arguments
are the nodes that produced those tensor objects; parameters and buffers become ``get_attr`` nodes.

Only tensors are dataflow: shapes, sizes and other Python values read from tensors
(``x.shape``, ``x.ndim``, ``interpolate(size=y.shape[-2:])``) are constants of the recorded call,
so a shape read never counts as a reader of a tensor. Control flow follows the example inputs,
like every tracer; unlike torch.fx and ``torch.export``, recording runs any code that runs in eager
mode (data-dependent branches, NMS, Python containers), because it *is* an eager run.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import operator
import os
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from qdq.graph.calls import (
    PARTS,
    VALUE_READS,
    CallTracker,
    LeafCalls,
    SiteKey,
    _call_info,
    _path_of,
)
from qdq.graph.capture import CaptureError, ForwardError
from qdq.graph.patterns import call_name

__all__ = ["Recording", "record"]


@dataclass
class Recording:
    """A recorded forward pass: the graph and the module copy it refers to."""

    graph: fx.Graph
    root: nn.Module
    data_dependent: tuple[str, ...] = ()
    #: ``file:line`` of each of those value reads (the user's code that called ``bool(t)``...)
    value_reads: tuple[str, ...] = ()
    #: per leaf module path: what its calls did (:data:`~qdq.graph.calls.LeafCalls`)
    leaf_calls: dict[str, LeafCalls] | None = None
    #: module paths of calls whose results reach no output of the model (dropped from ``graph``,
    #: as the exporters drop them)
    unused: frozenset[str] = frozenset()


class _Recorder(CallTracker):
    notes_leaf_calls = True

    def __init__(self, root: nn.Module) -> None:
        super().__init__(root)
        #: per leaf module path: the families called inside it, the paths it was called at
        self.leaf_calls: dict[str, tuple[set[str], set[str]]] = {}
        self._leaf_path: str | None = None
        self.graph = fx.Graph()
        self._values: dict[int, tuple[fx.Node, torch.Tensor]] = {}
        self._attrs: dict[int, str] = {}
        for name, p in itertools.chain(
            root.named_parameters(remove_duplicate=True), root.named_buffers(remove_duplicate=True)
        ):
            self._attrs.setdefault(id(p), name)
        self._attr_nodes: dict[str, fx.Node] = {}
        self._constants = 0
        self._leaf: fx.Node | None = None
        #: module paths where a tensor value decided Python control flow (``if x.sum() > 0``)
        self.data_dependent: list[str] = []
        self.value_reads: list[str] = []
        self._input_dependent: dict[fx.Node, bool] = {}

    # ------------------------------------------------------------ dataflow
    def bind(self, node: fx.Node, value: Any) -> None:
        """Record ``value`` (a tensor or a tuple/list of tensors) as produced by ``node``."""
        if isinstance(value, torch.Tensor):
            self._values[id(value)] = (node, value)
            node.meta["tensor_meta"] = _meta(value)
            node.meta["type"] = type(value)
            return
        if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
            node.meta["type"] = type(value)
            node.meta["tensor_meta"] = tuple(
                _meta(v) if isinstance(v, torch.Tensor) else None for v in value
            )
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    item = self.graph.create_node("call_function", operator.getitem, (node, i))
                    item.meta["nn_module_stack"] = node.meta.get("nn_module_stack", {})
                    self.bind(item, v)

    def arg(self, value: Any) -> Any:
        """``value`` with every tensor replaced by the node that produced it."""
        if isinstance(value, torch.Tensor):
            known = self._values.get(id(value))
            if known is not None and known[1] is value:
                return known[0]
            return self._attr(value)
        if isinstance(value, (tuple, list)):
            mapped = [self.arg(v) for v in value]
            return tuple(mapped) if isinstance(value, tuple) else mapped
        if isinstance(value, dict):
            return {k: self.arg(v) for k, v in value.items()}
        if isinstance(value, slice):
            return slice(self.arg(value.start), self.arg(value.stop), self.arg(value.step))
        if value is None or isinstance(
            value, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format)
        ):
            return value
        if isinstance(value, torch.Size):
            return tuple(value)
        return repr(value)  # an opaque Python object: a constant of this call

    def _attr(self, t: torch.Tensor) -> fx.Node:
        name = self._attrs.get(id(t))
        if name is None:  # a tensor made outside the recorded calls: a constant
            name = f"_qdq_constant_{self._constants}"
            self._constants += 1
            self._attrs[id(t)] = name
        node = self._attr_nodes.get(name)
        if node is None:
            node = self.graph.get_attr(name)
            node.meta["tensor_meta"] = _meta(t)
            node.meta["type"] = type(t)
            self._attr_nodes[name] = node
        self._values[id(t)] = (node, t)
        return node

    def _from_input(self, node: fx.Node) -> bool:
        """Whether ``node``'s value is computed from the model's inputs (not only from parameters,
        constants and sizes, which are the same for every input of this shape)."""
        memo = self._input_dependent
        stack = [node]
        while stack:  # post-order without recursion: recorded graphs run to thousands of nodes
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            todo = [i for i in n.all_input_nodes if i not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[n] = n.op == "placeholder" or any(memo[i] for i in n.all_input_nodes)
        return memo[node]

    def _node(self, op: str, target: Any, args: Any, kwargs: dict[str, Any], key: SiteKey) -> Any:
        node = self.graph.create_node(op, target, tuple(self.arg(args)), self.arg(kwargs))
        node.meta["nn_module_stack"] = OrderedDict((p, (p, t)) for p, t in self.stack_paths())
        node.meta["qdq_site"] = key
        return node

    # ------------------------------------------------------------ tracker
    def on_call(
        self,
        func: Callable[..., Any],
        key: SiteKey,
        op: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if key[1] in VALUE_READS and args and isinstance(args[0], torch.Tensor):
            known = self._values.get(id(args[0]))
            if known is not None and self._from_input(known[0]):
                if key[0] not in self.data_dependent:
                    self.data_dependent.append(key[0])
                site = _user_site()
                if site is not None and site not in self.value_reads:
                    self.value_reads.append(site)
        node_args: tuple[Any, ...] = args
        if target is getattr:
            node_args = (args[0], key[1].partition(".")[2])
        node = self._node(op, target, node_args, kwargs, key)
        out = func(*args, **kwargs)
        if target is operator.setitem and isinstance(args[0], torch.Tensor):
            out_value: Any = args[0]  # the mutated tensor now comes from the setitem node
        else:
            out_value = out
        if _has_tensor(out_value):
            self.bind(node, out_value)
        else:
            self.graph.erase_node(node)
        return out

    def on_leaf_enter(
        self, module: nn.Module, key: SiteKey, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        path = _path_of(module)
        if not path:
            self._leaf = None
            return None
        node = self.graph.create_node("call_module", path, tuple(self.arg(args)), self.arg(kwargs))
        node.meta["nn_module_stack"] = OrderedDict((p, (p, t)) for p, t in self.stack_paths())
        node.meta["qdq_site"] = key
        self._leaf = node
        # where the leaf's calls would be keyed without its hooks: the path it is called at
        below = self._path_stack[-2] if len(self._path_stack) > 1 else ""
        self.leaf_calls.setdefault(path, (set(), set()))[1].add(below)
        self._leaf_path = path
        return None

    def on_leaf_call(self, func: Callable[..., Any]) -> None:
        if self._leaf_path is not None:
            _, _, family, parts_seen = _call_info(func)
            self.leaf_calls[self._leaf_path][0].add(PARTS if parts_seen else family)

    def on_leaf_exit(self, module: nn.Module, output: Any) -> None:
        self._leaf_path = None
        leaf, self._leaf = self._leaf, None
        if leaf is None:
            return
        if _has_tensor(output):
            self.bind(leaf, output)
        else:
            self.graph.erase_node(leaf)


def record(model: nn.Module, example_inputs: Sequence[Any]) -> Recording:
    """Record one forward of a deep copy of ``model`` (in eval mode, without gradients).

    The copy runs once before the recorded forward, so the recording sees the calls of every
    later forward, not those of a first one that fills caches.

    Args:
        model: the float model (never modified).
        example_inputs: positional inputs for one forward.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ForwardError: the model's own forward raised (before any recording).
        CaptureError: the forward raised only under the recorder (the message names the model
            and the error).

    Example:
        >>> rec = record(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU()), (torch.randn(1, 4),))
        >>> [n.op for n in rec.graph.nodes]
        ['placeholder', 'get_attr', 'get_attr', 'call_function', 'call_module', 'output']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    clone = copy.deepcopy(model)
    clone.eval()
    try:
        # one forward first: code that builds a cache on its first call (anchor grids, masks)
        # makes calls then that later forwards skip; recording that first forward would number
        # every later call of the same op in that module wrongly, and the runtime would quantize
        # the wrong ones. The prepared model is this clone, so it stays warm too.
        with torch.no_grad():
            clone(*example_inputs)
    except Exception as err:
        raise ForwardError(
            f"{type(model).__name__} raised on the example inputs: {type(err).__name__}: {err}"
        ) from err
    rec = _Recorder(clone)
    names = _input_names(clone, len(example_inputs))
    for name, value in zip(names, example_inputs, strict=True):
        if isinstance(value, torch.Tensor):
            rec.bind(rec.graph.placeholder(name), value)
    handles = rec.install(prepend=True)  # under a prepared model's runtime: see its quantizers
    try:
        with torch.no_grad():
            out = clone(*example_inputs)
    except Exception as err:
        raise CaptureError(
            f"{type(model).__name__} raised on the example inputs: {type(err).__name__}: {err}"
        ) from err
    finally:
        for h in handles:
            h.remove()
        if rec._active_by is not None:  # pragma: no cover - the post hook always runs
            rec._deactivate()
    rec.graph.output(rec.arg(out))
    _drop_dead_getitems(rec.graph)
    unused = _drop_unused_calls(rec.graph) if _plain_output(out) else frozenset()
    leaves = {p: (frozenset(f), frozenset(at)) for p, (f, at) in rec.leaf_calls.items()}
    return Recording(
        rec.graph, clone, tuple(rec.data_dependent), tuple(rec.value_reads), leaves, unused
    )


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value)


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of a recorded tensor (``node.meta["tensor_meta"]``)."""

    shape: torch.Size
    dtype: torch.dtype


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.dtype)


def _input_names(model: nn.Module, n: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    names += [f"input_{i}" for i in range(len(names), n)]
    return names[:n]


def _plain_output(value: Any) -> bool:
    """Whether the recorded output holds every tensor the model returned: tensors in tuples,
    lists and dicts (``ModelOutput`` is one), beside plain Python values. Tensors inside another
    object (a dataclass, a results class) are not followed, so nothing may be called unused."""
    if isinstance(value, (tuple, list)):
        return all(_plain_output(v) for v in value)
    if isinstance(value, dict):
        return all(_plain_output(v) for v in value.values())
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, str, torch.Size))


def _mutates(node: fx.Node) -> bool:
    """An in-place call (``x.add_(y)``, ``x[i] = y``, ``out=``): it may write a tensor that
    something else reads (a view's base), so it counts as used, as the exporters keep it."""
    name = call_name(node)
    in_place = name.endswith("_") and not name.startswith("__")
    return (
        in_place
        or node.target in (operator.setitem, operator.iadd, operator.imul)
        or ("out" in node.kwargs)
    )


def _drop_unused_calls(graph: fx.Graph) -> frozenset[str]:
    """Remove the calls whose results reach neither the output nor an in-place write (a head
    that a wrapper computes and does not return): the exporters drop them, so a plan that
    quantized them would plan Q/DQ that no exported graph holds. Returns the module paths of the
    removed calls (for the Conv/Linear coverage)."""
    live: set[fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "output" or _mutates(n)]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    unused: set[str] = set()
    for node in reversed(list(graph.nodes)):
        if node in live or node.op in ("placeholder", "get_attr") or node.users:
            continue
        path = (
            str(node.target)
            if node.op == "call_module"
            else next(reversed(node.meta.get("nn_module_stack") or {"": None}), "")
        )
        if path:
            unused.add(path)
        graph.erase_node(node)
    return frozenset(unused)


def _drop_dead_getitems(graph: fx.Graph) -> None:
    """Tuple items nobody read (the unused half of a ``split``) carry no dataflow."""
    for node in reversed(list(graph.nodes)):
        dead = node.op == "call_function" and node.target is operator.getitem and not node.users
        if dead and isinstance(node.args[0], fx.Node) and node.args[0].op != "placeholder":
            graph.erase_node(node)


_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(torch.__file__)


def _user_site() -> str | None:
    """``file:line`` of the first frame outside qdq's capture code and torch: the model code
    that turned a tensor into a Python value."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_OWN_DIR)
        or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame = frame.f_back
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"
