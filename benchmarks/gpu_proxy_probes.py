"""Counting probes for ``benchmarks/gpu_proxies.py`` and ``tests/test_gpu_proxies.py`` (issue 48):
what a model run costs a launch-bound GPU, counted on this CPU, exactly.

* :class:`Probe` counts the aten ops a run dispatches (a ``TorchDispatchMode``; on a GPU almost
  every one that is not a view is a kernel launch) and the **host synchronisations** it would make
  on a GPU: ``aten._local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``, ``int(t)``), ops
  whose output shape depends on the data (tagged ``dynamic_output_shape``: ``nonzero``,
  ``masked_select``, ``bincount``, indexing with a mask ...), and the reads of a tensor into host
  memory that do not dispatch on a CPU tensor (``.cpu()``, ``.to("cpu")``, ``.numpy()``,
  ``.tolist()``: seen by a ``TorchFunctionMode``, ``host_reads=True``; one chain such as
  ``t.cpu().tolist()`` counts once). Each op and sync is attributed to the function that made it:
  one of qdq's (``quant/primitives.py:_FakeQuantSTE.forward``), or the model's own code, so the
  table says which functions add the cost.
* With ``TRITON_INTERPRET=1`` qdq takes its GPU path on this CPU (:mod:`qdq.kernels`: fused
  Triton kernels, run by Triton's interpreter); a kernel launch then counts as one op and one
  kernel, not the ops the interpreter dispatches to emulate it.
* :func:`compile_sequence` runs a model under ``torch.compile`` through a sequence of calls (batch
  sizes, ``.train()``/``.eval()`` switches, training steps) and counts the graphs compiled, the
  recompilations (with dynamo's reasons) and the graph breaks.

The probes import torch only (and qdq's location, to attribute frames); the models and the
figures live in ``gpu_proxies.py``.
"""

from __future__ import annotations

import contextlib
import copy
import linecache
import logging
import os
import re
import sys
import traceback
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: qdq's sources: frames inside are attributed (``quant/primitives.py:_FakeQuantSTE.forward``)
QDQ_SRC = str(Path(__file__).resolve().parents[1] / "src" / "qdq") + "/"
_TORCH = str(Path(torch.__file__).resolve().parent) + "/"
_HERE = str(Path(__file__).resolve())
_REPO = str(Path(__file__).resolve().parents[1]) + "/"
#: ops that launch no kernel on a GPU besides views: allocations and the scalar read (a sync)
_NO_KERNEL = frozenset({"aten.empty", "aten.empty_strided", "aten.empty_like", "aten.lift_fresh",
                        "aten._local_scalar_dense", "aten.resize_", "aten.set_"})  # fmt: skip
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
#: Tensor methods that read a tensor into host memory without dispatching on a CPU tensor
_HOST_READS = frozenset({"cpu", "numpy", "tolist"})


@dataclass
class Sync:
    """One host synchronisation: what (``aten._local_scalar_dense``, ``Tensor.cpu`` ...), where
    (``file:line function: code`` of qdq's frame that made it, or the model's) and the qdq frames
    leading to it, outermost first."""

    kind: str
    site: str
    stack: tuple[str, ...]


@dataclass
class Probe:
    """What one run dispatched: ``ops`` by name, ``kernels`` (ops that are neither views nor
    allocations), ``syncs``, and with ``attribute`` the ops per qdq function (``op_sites``)."""

    attribute: bool = False
    host_reads: bool = False
    ops: Counter[str] = field(default_factory=Counter)
    kernels: int = 0
    op_sites: Counter[str] = field(default_factory=Counter)
    #: with ``attribute``: ``"<site> <op>"`` → count (which ops each qdq function dispatches)
    site_ops: Counter[str] = field(default_factory=Counter)
    syncs: list[Sync] = field(default_factory=list)
    #: Triton kernels run by its CPU interpreter (``TRITON_INTERPRET=1``: qdq's GPU path on this
    #: CPU), each counted as one op and one kernel (``triton.<qdq function>``), not the ops the
    #: interpreter dispatches to emulate it
    launches: int = 0
    _in_launch: bool = field(default=False, repr=False)

    @property
    def total(self) -> int:
        """Every aten op dispatched."""
        return sum(self.ops.values())

    def sync_sites(self) -> Counter[str]:
        """Syncs per site (``file:line function``)."""
        return Counter(s.site for s in self.syncs)

    def sync_kinds(self) -> Counter[str]:
        """Syncs per kind."""
        return Counter(s.kind for s in self.syncs)

    @contextlib.contextmanager
    def recording(self) -> Iterator[Probe]:
        """Count what runs inside the block (may be entered again: the counts add up)."""
        reads = _HostReads(self) if self.host_reads else contextlib.nullcontext()
        with reads, _Dispatch(self):
            yield self


def count(fn: Callable[[], Any], *, attribute: bool = False, host_reads: bool = False) -> Probe:
    """Run ``fn()`` once under a :class:`Probe` and return it."""
    probe = Probe(attribute=attribute, host_reads=host_reads)
    with probe.recording():
        fn()
    return probe


def _qdq_frames(frame: Any) -> list[Any]:
    """qdq's frames on the stack from ``frame`` outwards, innermost first."""
    out = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(QDQ_SRC):
            out.append(frame)
        frame = frame.f_back
    return out


def _label(frame: Any, line: bool) -> str:
    code = frame.f_code
    where = (
        code.co_filename[len(QDQ_SRC) :]
        if code.co_filename.startswith(QDQ_SRC)
        else code.co_filename
    )
    name = getattr(code, "co_qualname", code.co_name)
    return f"{where}:{frame.f_lineno} {name}" if line else f"{where}:{name}"


#: qdq's functions that pass the model's own calls on (the call-site runtime's torch function
#: mode): an op they dispatch belongs to the frame that made the call, the model's or qdq's
_PASS_ON = frozenset({"graph/calls.py:_Mode.__torch_function__",
                      "graph/runtime.py:SiteRuntime.on_call",
                      "graph/runtime.py:_without_inplace"})  # fmt: skip


def _where(line: bool) -> tuple[str, tuple[str, ...]]:
    """``(site, qdq frames)`` of the op being dispatched: the first frame outwards that is not
    torch's, Triton's, these probes' or a pass-on frame of qdq's runtime. A qdq frame names the
    site (``file:function``, with ``line`` its line number and text); another frame is
    ``model`` (``model (through the runtime)`` when qdq's runtime passed the call on)."""
    frame = sys._getframe(1)
    stack = tuple(_label(f, True) for f in reversed(_qdq_frames(frame)))
    through = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(QDQ_SRC) and _label(frame, False) in _PASS_ON:
            through = True
        elif not (name.startswith(_TORCH) or name == _HERE or "/triton/" in name
                  or name.endswith("/contextlib.py")):  # fmt: skip
            break
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(QDQ_SRC):
        site = "model (through the runtime)" if through else "model"
        if line and frame is not None:
            site += (
                f": {Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
            )
        return site, stack
    site = _label(frame, line)
    if line:
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        site = f"{site}: {text[:80]}"
    return site, stack


def _in_triton() -> bool:
    """Whether Triton's interpreter is on the stack (it emulates a kernel with torch ops)."""
    frame = sys._getframe(2)
    while frame is not None:
        if "/triton/" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _is_sync(func: Any, args: tuple[Any, ...]) -> bool:
    tags = func.tags
    if torch.Tag.data_dependent_output in tags:
        return True
    if torch.Tag.dynamic_output_shape not in tags:
        return False
    if func.overloadpacket is torch.ops.aten.index:  # only a mask index has a data-dependent shape
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    return True


class _Dispatch(TorchDispatchMode):
    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        p = self.probe
        if _INTERPRET and _in_triton():
            if not p._in_launch:  # the first op of a launch; the next op outside ends it
                p._in_launch = True
                p.launches += 1
                p.kernels += 1
                site = _where(False)[0]
                p.ops[f"triton.{site}"] += 1
                if p.attribute:
                    p.op_sites[site] += 1
            return func(*args, **(kwargs or {}))
        p._in_launch = False
        name = str(func.overloadpacket)
        p.ops[name] += 1
        if not func.is_view and name not in _NO_KERNEL:
            p.kernels += 1
        if p.attribute:
            site = _where(False)[0]
            p.op_sites[site] += 1
            p.site_ops[f"{site} {name}"] += 1
        if _is_sync(func, args) and not _HostReads.inside:
            site, stack = _where(True)
            p.syncs.append(Sync(name, site, stack))
        return func(*args, **(kwargs or {}))


class _HostReads(TorchFunctionMode):
    """``.cpu()``, ``.to("cpu")``, ``.numpy()``, ``.tolist()``: a device-to-host copy on a GPU,
    no dispatch on a CPU tensor.

    A chain such as ``t.cpu().numpy()`` is one copy on a GPU: a read of the tensor the previous
    read returned, from the same line, is part of it. (On a CPU ``t.cpu()`` returns ``t`` itself,
    so a read of it on another line cannot be told from a read of a GPU tensor: it counts.)
    """

    inside = 0  # a host read in progress: the scalar reads it dispatches are part of it

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe
        #: the tensor the last counted read returned (weakly) and the line that made it
        self.last: tuple[weakref.ref[torch.Tensor], Any, int] | None = None

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        read = name in _HOST_READS or (name == "to" and _to_cpu(args, kwargs))
        t = args[0] if args else None
        if not read or not isinstance(t, torch.Tensor):
            return func(*args, **kwargs)
        caller = sys._getframe(1)
        line = (caller.f_code, caller.f_lineno)
        last = self.last
        if last is not None and last[0]() is t and last[1:] == line:
            return func(*args, **kwargs)  # the rest of a chain
        site, stack = _where(True)
        self.probe.syncs.append(Sync(f"Tensor.{name}", site, stack))
        _HostReads.inside += 1
        try:
            out = func(*args, **kwargs)
        finally:
            _HostReads.inside -= 1
        self.last = (weakref.ref(out), *line) if isinstance(out, torch.Tensor) else None
        return out


def _to_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``.to("cpu")`` written as such: on this CPU every device is the CPU, so ``.to(t.device)``
    (which follows the data, and stays on a GPU there) is not counted, nor a ``torch.device``."""
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str) and target.split(":")[0] == "cpu"


def host_profile(fn: Callable[[], Any], calls: int, top: int = 10) -> list[list[Any]]:
    """Where the host time of ``fn()`` goes: ``cProfile`` over ``calls`` runs (after one), the
    ``top`` functions by self time as ``[ms per run, calls per run, "file:line function"]``
    (builtins such as ``torch.where`` included: their time is the kernel's on this CPU). The
    profiler's own cost inflates cheap Python functions: read it as a ranking, not as times."""
    import cProfile
    import pstats

    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(((tt, nc, f, ln, name) for (f, ln, name), (_, nc, tt, _, _) in stats.items()),
                  reverse=True)[:top]  # fmt: skip
    return [[round(tt / calls * 1000, 3), nc // calls, f"{_where_file(f)}:{ln} {name}"]
            for tt, nc, f, ln, name in rows]  # fmt: skip


def _where_file(path: str) -> str:
    for root, short in ((QDQ_SRC, "qdq/"), (_TORCH, "torch/")):
        if path.startswith(root):
            return short + path[len(root) :]
    return Path(path).name if "/" in path else path


# ------------------------------------------------------------------------------ torch.compile
@dataclass(frozen=True)
class Step:
    """One call of a compile sequence: the model's mode, the batch size, and whether it is a
    training step (forward, loss, backward, SGD) or a forward without gradients."""

    train: bool
    batch: int
    step: bool = False


#: forwards at three batch sizes, a ``.train()`` forward and back to ``.eval()``
EVAL_SEQUENCE = (Step(False, 1), Step(False, 1), Step(False, 2), Step(False, 3), Step(True, 2),
                 Step(False, 2))  # fmt: skip
#: training steps at two batch sizes, an ``.eval()`` forward without gradients, a training step
TRAIN_SEQUENCE = (Step(True, 2, True), Step(True, 2, True), Step(True, 3, True), Step(False, 2),
                  Step(True, 3, True))  # fmt: skip


@dataclass
class Compiled:
    """What ``torch.compile`` did over a sequence of calls."""

    fullgraph: bool
    graphs: int = 0  #: graphs handed to the backend (per frame compiled; a graph break adds one)
    recompiles: list[str] = field(default_factory=list)  #: dynamo's reason, per recompilation
    graph_breaks: Counter[str] = field(default_factory=Counter)  #: reason → count
    limit_hit: int = 0  #: "recompile limit reached" warnings (the frame then runs eagerly)
    error: str | None = None  #: the exception that stopped the sequence (``fullgraph`` breaks)


class _Log(logging.Handler):
    def __init__(self, out: Compiled) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Recompiling function"):
            head, _, reasons = msg.partition("triggered by the following guard failure(s):")
            where = head.replace("Recompiling function", "").strip()
            first = next((ln.strip(" -") for ln in reasons.splitlines() if ln.strip(" -")), "")
            self.out.recompiles.append(f"{_short(where)}: {first[:160]}")
        elif "recompile_limit" in msg or "cache_size_limit" in msg:
            self.out.limit_hit += 1


def _short(where: str) -> str:
    """``forward in /long/path/src/qdq/graph/calls.py:257`` → ``forward in qdq/graph/calls.py:257``
    (and ``torch/...``, ``torchvision/...`` for installed packages, ``benchmarks/...``)."""
    for root, short in ((QDQ_SRC, "qdq/"), (_TORCH, "torch/"), (_REPO, "")):
        where = where.replace(root, short)
    return re.sub(r"\S*/site-packages/", "", where)


@contextlib.contextmanager
def _dynamo_logs(out: Compiled) -> Iterator[None]:
    """Dynamo's recompilation log into ``out`` (not onto stderr) within the block."""
    from torch._logging import set_logs

    set_logs(recompiles=True)
    logger = logging.getLogger("torch._dynamo")  # the recompiles artifact propagates to it
    saved = logger.handlers[:]
    logger.handlers = [_Log(out)]
    try:
        yield
    finally:
        logger.handlers = saved
        set_logs()


def compile_sequence(
    model: nn.Module,
    steps: Sequence[Step],
    sample: Callable[[int], torch.Tensor],
    *,
    backend: str = "eager",
    fullgraph: bool = False,
) -> Compiled:
    """Run ``torch.compile(model)`` (a deep copy) through ``steps`` (inputs from ``sample(batch)``)
    from a clean dynamo state and count what was compiled. ``backend`` is ``"eager"`` (dynamo
    only: recompilations and graph breaks are decided there) or ``"aot_eager"``."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    out = Compiled(fullgraph)
    model = copy.deepcopy(model)
    inner = torch._dynamo.lookup_backend(backend)

    def counting(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        out.graphs += 1
        return inner(gm, example)

    compiled = torch.compile(model, backend=counting, fullgraph=fullgraph)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-6) if params else None
    with _dynamo_logs(out):
        try:
            for s in steps:
                model.train(s.train)
                x = sample(s.batch)
                if s.step and opt is not None:
                    opt.zero_grad(set_to_none=True)
                    compiled(x).float().square().mean().backward()
                    opt.step()
                else:
                    with torch.no_grad():
                        compiled(x)
        except Exception as err:  # a fullgraph break or a compile failure: reported, not fatal
            out.error = f"{type(err).__name__}: {_first_line(err)}"
    out.graph_breaks = Counter(
        {_short(str(k))[:160]: int(v) for k, v in counters["graph_break"].items()}
    )
    torch._dynamo.reset()
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or "".join(traceback.format_exception_only(type(err), err)).strip()
    return text.splitlines()[0][:200] if text else ""
