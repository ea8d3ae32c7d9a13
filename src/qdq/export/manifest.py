"""The quantization manifest: every quantizer's module path, rule, group, calibration, amax, scale
and ONNX node names, as versioned JSON beside the ONNX file; ``load_calibration`` restores amax.

A weight quantizer with state learned by :mod:`qdq.ptq` (AdaRound codes, a bias correction) also
has a ``"learned"`` entry: per part the settings, the SHA-256 of the codes / delta, and a short
figure (see :func:`qdq.quant.learned.manifest_entry`). The codes themselves are in the ONNX (the
weight initializer is ``scale · code``) and in the prepared model's ``state_dict``, not in the
manifest, so ``load_calibration`` does not restore them: it checks that the model holds the same
learned state as the manifest records, and refuses otherwise.

A block-format quantizer's entry (NVFP4, MXFP8, INT4) also records its block size, role, amax
layout and scales (:mod:`qdq.export.manifest_blocks`), and ``load_calibration`` restores it.

A manifest belongs to exactly one ONNX file: it is named after the full file name
(``m.onnx`` → ``m.onnx.manifest.json``, so ``m.onnx`` and ``m.bin`` never share one), it records that
file's name and the SHA-256 of its bytes (``"onnx": {"file": ..., "sha256": ...}``), and
:func:`qdq.export_onnx` writes both files as one unit (both or neither). A model past 2 GB keeps its
weights in an external-data file beside the ONNX (:mod:`qdq.export.external`); the ``.onnx`` hash
then covers the graph, the Q/DQ scales and the data file's name and offsets, and
``"onnx": {"external_data": {"file": ..., "sha256": ...}}`` records the data file's own hash
(checked by ``load_calibration`` too).

A manifest may come from anyone, so it is read as untrusted input (:mod:`qdq.export.manifest_io`):
its size and JSON depth are checked before it is parsed; the files it names (``onnx.file``,
``onnx.external_data.file``) are resolved relative to its folder and refused when they lead out
of it (absolute, ``..``, a symbolic link leading out); files are hashed in chunks after a size
check; every malformed value is a one-line ``ValueError`` naming the manifest and the key. No
manifest field names code to run or a model to build: the model comes from the caller.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._version import __version__
from qdq.api import plan_of, quantizers_of
from qdq.config import FORMATS, Override, QuantConfig
from qdq.export.manifest_blocks import block_entry, entry_block_amax, is_block
from qdq.export.manifest_io import MAX_ONNX_BYTES, SCHEMA, confined, hash_file, read_manifest, short
from qdq.graph.plan import QuantPlan
from qdq.quant import Quantizer, scale_from_amax
from qdq.quant.learned import manifest_entry

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_SUFFIX",
    "SCHEMA",
    "OnnxMismatchError",
    "build_manifest",
    "check_onnx",
    "config_of",
    "find_manifest",
    "load_calibration",
    "manifest_path_for",
]

#: Appended to the full ONNX file name: ``m.onnx`` → ``m.onnx.manifest.json``.
MANIFEST_SUFFIX = ".manifest.json"
#: The directory-level manifest ``qdq quantize`` writes beside ``model.qdq.onnx``.
MANIFEST_NAME = "manifest.json"
#: The largest amax a manifest may record: float32's largest finite value (amax is float32).
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)

_log = logging.getLogger("qdq.export")


def manifest_path_for(onnx_path: str | Path) -> Path:
    """The manifest path of an ONNX file: its full name plus ``.manifest.json``.

    Example:
        >>> manifest_path_for("out/m.onnx").name
        'm.onnx.manifest.json'
    """
    p = Path(onnx_path)
    return p.with_name(p.name + MANIFEST_SUFFIX)


def find_manifest(onnx_path: str | Path) -> Path:
    """The manifest of an ONNX file: ``X.onnx.manifest.json``, else a ``manifest.json`` beside it
    that names ``X.onnx`` in its ``"onnx": {"file": ...}`` entry (the layout ``qdq quantize``
    writes: ``OUT/model.qdq.onnx`` + ``OUT/manifest.json``).

    Raises:
        FileNotFoundError: neither exists (or ``manifest.json`` describes another file); the
            message names both candidates.
        ValueError: the manifest is a symbolic link leading out of the ONNX file's folder, or
            ``manifest.json`` is not JSON (see :func:`~qdq.export.manifest_io.read_manifest`).

    Example:
        >>> find_manifest("out/model.qdq.onnx")  # doctest: +SKIP
        PosixPath('out/manifest.json')
    """
    p = Path(onnx_path)
    own = manifest_path_for(p)
    if own.is_file():
        return _beside(p, own)
    shared = p.with_name(MANIFEST_NAME)
    if shared.is_file():
        doc = read_manifest(_beside(p, shared))
        info = doc.get("onnx") if isinstance(doc, dict) else None
        if isinstance(info, dict) and info.get("file") == p.name:
            return shared
    raise FileNotFoundError(
        f"no manifest for {onnx_path}: neither {own} nor {shared} naming {p.name}"
    )


def _beside(onnx_path: Path, manifest: Path) -> Path:
    """``manifest``, refused when it is a symbolic link leading out of the ONNX file's folder."""
    try:
        inside = manifest.resolve().is_relative_to(onnx_path.parent.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        inside = False
    if not inside:
        raise ValueError(
            f"{manifest} is a symbolic link leading out of {onnx_path.parent}: a manifest is "
            "read only from the ONNX file's own folder"
        )
    return manifest


def sha256_of(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _values(t: torch.Tensor) -> float | list[float]:
    flat = t.detach().to(torch.float32).cpu()
    return float(flat) if flat.dim() == 0 else [float(v) for v in flat.flatten()]


def build_manifest(
    plan: QuantPlan,
    quantizers: dict[str, Quantizer],
    model: Any,
    *,
    exporter: str,
    opset: int,
    onnx_file: str | None = None,
    onnx_sha256: str | None = None,
    onnx_external: tuple[str, str] | None = None,
    qat: dict[str, Any] | None = None,
    ptq: dict[str, Any] | None = None,
    block_form: str | None = None,
) -> str:
    """The manifest JSON text for an export.

    ``block_form`` (a graph with block-format quantizers): MXFP8's form in the ONNX, recorded as
    ``"block_form"`` (``"onnx"``/``"trt"``, :func:`~qdq.export.manifest_blocks.block_form_of`).

    ``qat`` (:meth:`qdq.qat.QatState.to_dict`) records quantization-aware training: the
    ``"qat"`` entry (epochs, steps, recipe, learned amax or not, BatchNorm handling); a
    quantizer whose amax was trained has ``"amax_grad"`` (``"lsq"``/``"pact"``).

    ``ptq`` (:func:`qdq.ptq.search.recipe_of`) records the PTQ recipe the model followed and
    how it was chosen (the ``"ptq"`` entry: ``recipe``, ``steps``, ``chosen_by``), for replaying
    it on new calibration data (``qdq quantize --recipe NAME``).

    ``onnx_file`` (the ONNX file's name) and ``onnx_sha256`` (the hash of its bytes) tie the
    manifest to that one file; :func:`load_calibration` checks them. ``onnx_external`` (name,
    SHA-256) is the ONNX file's external-data file (models past 2 GB): the ONNX file's hash
    covers the graph, the scales and the data file's name and offsets, the second hash the
    weights in the data file.
    """
    nodes: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.domain == "trt":
            nodes.setdefault(n.name.split("/")[0], []).append(n.name)
    by_path = {g.quantizer: g for g in plan.groups if g.quantizer}
    entries = []
    for path, q in quantizers.items():
        group = by_path.get(path)
        leader = plan.point(group.leader) if group is not None else None
        scales = (
            block_entry(q)
            if is_block(q)
            else {"scale": _values(scale_from_amax(q.amax, fmt=q.spec.format))}
        )
        entries.append(
            {
                "path": path,
                "name": q.name,
                "kind": leader.kind if leader else "input",
                "rule": leader.rule if leader else "USER",
                "group": group.id if group else None,
                "members": list(group.members) if group else [],
                "calibrator": q.calib.calibrator,
                "method": q.amax_method or q.calib.method,
                **({"percentile": q.amax_percentile} if q.amax_percentile is not None else {}),
                "format": q.spec.format,
                "num_bits": q.spec.num_bits,
                "axis": q.spec.axis,
                "channels": int(q.amax.numel()) if q.spec.axis is not None else 1,
                "amax": _values(q.amax),
                **scales,
                "onnx_nodes": nodes.get(path, []),
                **({"amax_grad": q.amax_grad} if q.amax_grad is not None else {}),
                **_learned(q),
            }
        )
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "qdq_version": __version__,
        "model": plan.model,
        "exporter": exporter,
        # the file's own: block formats raise it (qdq.export.blocks_onnx)
        "opset": max(
            [opset] + [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
        ),
        **({"block_form": block_form} if block_form is not None else {}),
    }
    if onnx_file is not None:
        doc["onnx"] = {"file": onnx_file, "sha256": onnx_sha256}
        if onnx_external is not None:
            doc["onnx"]["external_data"] = {"file": onnx_external[0], "sha256": onnx_external[1]}
    if ptq is not None:
        doc["ptq"] = ptq
    if qat is not None:
        doc["qat"] = qat
    doc["quantizers"] = entries
    return json.dumps(doc, indent=2) + "\n"


class OnnxMismatchError(ValueError):
    """The ONNX file is not the one its manifest was written with: its SHA-256 (or its external
    data's) differs from the manifest's, or the manifest records no hash to check it by."""


def load_calibration(
    prepared: nn.Module,
    manifest: str | Path,
    onnx_path: str | Path | None = None,
    *,
    verify_onnx: bool = True,
) -> nn.Module:
    """Restore every quantizer's amax from a manifest (no data needed); return ``prepared``.

    Everything is checked before any amax changes, so on error the model is untouched:

    * the manifest itself, as untrusted input (size, JSON depth, and every file it names inside
      its folder: see the module docstring);
    * the ONNX file: ``onnx_path`` when given, else the file the manifest names, when it lies
      beside the manifest — its SHA-256 must equal the manifest's (the pair was written together);
      ``verify_onnx=False`` skips this (for a caller that checked it with :func:`check_onnx`);
    * every quantizer of the model has exactly one entry (and the manifest no extra ones), with
      the same name, axis and channel count, and a finite, non-negative amax (a number per tensor,
      a list per channel);
    * the state learned by :mod:`qdq.ptq` (AdaRound codes, bias corrections) that the manifest
      records is exactly the one the model holds (same SHA-256): the manifest cannot restore it,
      so load the prepared model's ``state_dict`` first.

    Args:
        prepared: a model from :func:`qdq.prepare` with the same plan as the exported one.
        manifest: the ``*.manifest.json`` path written by :func:`qdq.export_onnx`.
        onnx_path: the ONNX file the manifest must describe (default: found beside it, if any).
        verify_onnx: check the ONNX file's hash (default); ``False`` leaves the files alone.

    Raises:
        FileNotFoundError: no manifest (or no ``onnx_path``) at that path.
        ValueError: not JSON, too large or too deep, wrong schema, a malformed entry, a file named
            outside the manifest's folder, a hash mismatch (:class:`OnnxMismatchError`), a
            manifest that does not match the model, or learned state that differs between the
            two; the message names the file and the quantizer or key.

    Example:
        >>> import qdq, torch, tempfile, os
        >>> net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3))
        >>> m = qdq.prepare(net, (torch.randn(1, 3, 8, 8),))
        >>> _ = qdq.calibrate(m, [torch.randn(2, 3, 8, 8)], show_progress=False)
        >>> out = qdq.export_onnx(m, (torch.randn(1, 3, 8, 8),), os.path.join(tempfile.mkdtemp(), "m.onnx"))
        >>> out.manifest_path.name
        'm.onnx.manifest.json'
        >>> fresh = qdq.load_calibration(qdq.prepare(net, (torch.randn(1, 3, 8, 8),)), out.manifest_path)
    """
    plan_of(prepared)
    p = Path(manifest)
    doc = _read_doc(p)
    if verify_onnx:
        _check_onnx_hash(p, doc, onnx_path)
    entries = _entries(p, doc)
    quantizers = quantizers_of(prepared)
    missing = sorted(set(quantizers) - set(entries))
    if missing:
        raise ValueError(
            f"{p} has no entry for quantizers {missing[:5]}: it belongs to another model"
        )
    extra = sorted(set(entries) - set(quantizers))
    if extra:
        raise ValueError(
            f"{p} has entries for quantizers the model does not have "
            f"[{', '.join(short(e, 40) for e in extra[:5])}]: it belongs to another model"
        )
    amax = {
        path: entry_block_amax(p, path, entries[path], q) if is_block(q)
        else _entry_amax(p, path, entries[path], q)
        for path, q in quantizers.items()
    }  # fmt: skip
    records = {path: _entry_method(p, path, entries[path]) for path in quantizers}
    _check_learned(p, entries, quantizers)
    for path, q in quantizers.items():
        value = amax[path]
        if value is not None:  # None: an MXFP8 entry recording no amax (its scales are dynamic)
            q.set_amax(value)
        method, pct = records[path]
        if method is not None:  # the record travels with the amax it describes
            q.amax_method, q.amax_percentile = method, pct
    return prepared


def check_onnx(manifest: str | Path, onnx_path: str | Path | None = None) -> None:
    """Check that ``onnx_path`` (default: the file the manifest names, when it lies beside it)
    is the ONNX file ``manifest`` was written with, as :func:`load_calibration` does.

    Raises:
        FileNotFoundError: no manifest, no ``onnx_path``, or a missing external-data file.
        OnnxMismatchError: a hash differs, or the manifest records none.
        ValueError: a malformed or hostile manifest (see :func:`load_calibration`).

    Example:
        >>> check_onnx("out/model.qdq.onnx.manifest.json", "out/model.qdq.onnx")  # doctest: +SKIP
    """
    p = Path(manifest)
    _check_onnx_hash(p, _read_doc(p), onnx_path)


def _read_doc(p: Path) -> dict[str, Any]:
    """The manifest at ``p``, read as untrusted input; its schema and ``onnx`` entry checked."""
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}")
    doc = read_manifest(p)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = short(doc.get("schema")) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{p}: expected schema {SCHEMA!r}, got {got}")
    _onnx_entry(p, doc)
    return doc


def _onnx_entry(p: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's ``onnx`` entry, its form and file names checked (nothing opened)."""
    info = doc.get("onnx")
    if info is None:
        return None
    if not (isinstance(info, dict) and isinstance(info.get("file"), str) and _is_sha(info)):
        raise ValueError(
            f"{p}: malformed 'onnx' entry {short(info)}; expected {{'file', 'sha256'}} "
            "(a file name and 64 hex digits)"
        )
    confined(p.parent, info["file"], manifest=p, key="onnx.file")
    ext = info.get("external_data")
    if ext is not None:
        if not (isinstance(ext, dict) and isinstance(ext.get("file"), str) and _is_sha(ext)):
            raise ValueError(
                f"{p}: malformed 'onnx.external_data' entry {short(ext)}; expected "
                "{'file', 'sha256'} (a file name and 64 hex digits)"
            )
        confined(p.parent, ext["file"], manifest=p, key="onnx.external_data.file")
    return info


def _is_sha(info: dict[str, Any]) -> bool:
    sha = info.get("sha256")
    return isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)


def _learned(q: Quantizer) -> dict[str, Any]:
    entry = manifest_entry(dict(q._buffers))
    return {} if entry is None else {"learned": entry}


def _check_learned(
    p: Path, entries: dict[str, dict[str, Any]], quantizers: dict[str, Quantizer]
) -> None:
    """The model holds exactly the learned state (rounding, bias correction) the manifest records:
    a manifest restores amax only, so anything else would silently give another model."""
    problems = []
    for path, q in quantizers.items():
        saved = entries[path].get("learned") or {}
        held = manifest_entry(dict(q._buffers)) or {}
        if not isinstance(saved, dict):
            raise ValueError(f"{p}: quantizer {path!r} has a malformed 'learned' entry")
        for part in ("rounding", "bias_correction"):
            want, have = saved.get(part), held.get(part)
            want_sha = want.get("sha256") if isinstance(want, dict) else None
            have_sha = have.get("sha256") if have is not None else None
            if want_sha == have_sha:
                continue
            if have is None:
                problems.append(f"{path}: the manifest records {part}, the model has none")
            elif want is None:
                problems.append(f"{path}: the model has {part}, the manifest records none")
            else:
                problems.append(f"{path}: the model's {part} differs from the manifest's")
    if problems:
        raise ValueError(
            f"{p} and the model disagree on state learned by qdq.ptq ({'; '.join(problems[:4])}"
            f"{'; ...' if len(problems) > 4 else ''}). A manifest restores amax only: load the "
            "prepared model's state_dict saved after qdq.ptq (its weight quantizers carry the "
            "AdaRound codes and bias corrections) before the manifest, or clear the model's "
            "learned state (Quantizer.clear_learned) to load a manifest without it"
        )


def _check_onnx_hash(p: Path, doc: dict[str, Any], onnx_path: str | Path | None) -> None:
    """The ONNX file beside (or given with) the manifest has the hash the manifest records."""
    info = _onnx_entry(p, doc)
    if onnx_path is not None:
        target = Path(onnx_path)
        if not target.is_file():
            raise FileNotFoundError(f"no ONNX file at {target}")
        if info is None:
            raise OnnxMismatchError(
                f"{p} records no ONNX hash (written by qdq before 0.x?), so it cannot be checked "
                f"against {target}; re-export to get a matching pair"
            )
    else:
        target = p.parent / info["file"] if info is not None else p  # confined by _onnx_entry
        if info is None or not _exists(target):
            _log.debug("%s: no ONNX file beside it; amax loaded without a hash check", p)
            return
    digest = hash_file(target, limit=MAX_ONNX_BYTES, manifest=p, key="onnx.file")
    if digest != info["sha256"]:
        raise OnnxMismatchError(
            f"{p} does not describe {target}: the file's SHA-256 is {digest[:12]}…, the manifest "
            f"records {info['sha256'][:12]}… (the pair was not written together, or one was "
            "replaced); re-export, or pass the matching manifest"
        )
    _check_external_hash(p, info.get("external_data"), target)


def _exists(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system
        return False


def _check_external_hash(p: Path, info: Any, onnx_path: Path) -> None:
    """The external-data file the manifest records (models past 2 GB) has its recorded hash;
    the data file lies beside the ONNX file (and is refused when its name leads elsewhere)."""
    if info is None:
        return
    data = confined(onnx_path.parent, info["file"], manifest=p, key="onnx.external_data.file")
    if not _exists(data):
        raise FileNotFoundError(
            f"{onnx_path} keeps its weights in {data}, which is missing: copy the .onnx file "
            "and its external-data file together"
        )
    digest = hash_file(data, limit=None, manifest=p, key="onnx.external_data.file")
    if digest != info["sha256"]:
        raise OnnxMismatchError(
            f"{p} does not describe {data}: the data file's SHA-256 is {digest[:12]}…, the "
            f"manifest records {info['sha256'][:12]}… (replaced since the export); re-export"
        )


def _entries(p: Path, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = doc.get("quantizers")
    if not isinstance(raw, list):
        raise ValueError(
            f"{p}: 'quantizers' must be a list of entries, got "
            f"{'nothing' if raw is None else type(raw).__name__}"
        )
    entries: dict[str, dict[str, Any]] = {}
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise ValueError(f"{p}: quantizers[{i}] must be an object, got {short(e)}")
        path = e.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"{p}: quantizers[{i}] has no 'path' (got {short(path)})")
        if path in entries:
            raise ValueError(f"{p}: quantizer {short(path)} appears twice")
        entries[path] = e
    return entries


def _entry_amax(p: Path, path: str, entry: dict[str, Any], q: Quantizer) -> torch.Tensor:
    """The entry's amax as a tensor shaped for ``q``; ValueError naming file and quantizer."""
    where = f"{p}: quantizer {path!r}"
    name = entry.get("name", q.name)
    if name != q.name:
        raise ValueError(f"{where} is named {short(name)} in the manifest, {q.name!r} in the model")
    if "axis" not in entry:
        raise ValueError(f"{where} has no 'axis'")
    axis = entry["axis"]
    if axis != q.spec.axis or isinstance(axis, bool):
        raise ValueError(
            f"{where} has axis={short(axis)} in the manifest but axis={q.spec.axis!r} in the model"
        )
    if "amax" not in entry:
        raise ValueError(f"{where} has no 'amax'")
    raw = entry["amax"]
    if isinstance(raw, list):
        values = raw
    elif q.spec.axis is None:
        values = [raw]
    else:
        raise ValueError(
            f"{where} is per-channel (axis {q.spec.axis}) but its amax is {short(raw)}, "
            "not a list of numbers"
        )
    if not values or not all(_is_number(v) for v in values):
        raise ValueError(f"{where}: amax must be a finite non-negative number or a list of them, "
                         f"got {short(raw)}")  # fmt: skip
    # NaN fails both comparisons; an int of any size compares exactly, without float overflow
    bad = [i for i, v in enumerate(values) if not 0 <= v <= _FLOAT32_MAX]
    if bad:
        raise ValueError(
            f"{where}: amax has negative or non-finite values (or values past float32's range) "
            f"at index {bad[:8]}"
        )
    channels = entry.get("channels")
    if channels is not None and channels != len(values):
        raise ValueError(
            f"{where}: 'channels' is {short(channels)} but amax has {len(values)} values"
        )
    amax = torch.tensor([float(v) for v in values], dtype=torch.float32)
    return q.check_amax_shape(amax, source=str(p))


def _entry_method(p: Path, path: str, entry: dict[str, Any]) -> tuple[str | None, float | None]:
    """The amax method and percentile an entry records (``None``: none recorded)."""
    method, pct = entry.get("method"), entry.get("percentile")
    if method is None:
        return None, None
    if not isinstance(method, str) or not method.isprintable() or len(method) > 64:
        raise ValueError(f"{p}: quantizer {path!r}: 'method' must be a method name, "
                         f"got {short(method)}")  # fmt: skip
    if pct is None:
        return method, None
    if not _is_number(pct) or not 0 <= pct <= 100:
        raise ValueError(
            f"{p}: quantizer {path!r}: 'percentile' must be a number in [0, 100], got {short(pct)}"
        )
    return method, float(pct)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def config_of(manifest: str | Path) -> QuantConfig | None:
    """The :class:`QuantConfig` that plans the model of ``manifest`` again with each layer in its
    recorded format (``None``: every quantizer INT8, the default config does): an FP8 plan
    whose every weighted layer is pinned to the format the manifest records
    (``Override(format=...)``), its FP8 GEMM weights per channel when the manifest records
    them so, so that :func:`load_calibration` finds the same quantizers, axes included, for an
    ``int8``, ``fp8`` or ``mixed`` export alike.

    Only the entries' ``format``, ``kind``, ``name`` and ``axis`` are read; a layer is pinned by
    its exact name (never a pattern), so nothing in a manifest selects code to run.

    Raises:
        FileNotFoundError / ValueError: no manifest, or not a qdq manifest (as
            :func:`load_calibration`); a malformed ``format``, ``kind``, ``name`` or ``axis`` is a
            ``ValueError`` naming the manifest, the entry and the key.
    """
    path = Path(manifest)
    doc = _read_doc(path)
    raw = doc.get("quantizers")
    if not isinstance(raw, list):
        raise ValueError(f"{path} is not a qdq manifest (no quantizers list)")
    entries = [_plan_fields(path, i, e) for i, e in enumerate(raw)]
    if all(fmt == "int8" for fmt, _, _, _ in entries):
        return None
    pins = tuple(
        Override(name=name.rsplit(":", 1)[0], format=fmt)
        for fmt, kind, name, _ in entries
        if kind == "weight" and ":" in name
    )
    per_channel = any(  # F06: per-channel FP8 GEMM weights (a target that builds them)
        kind == "weight" and fmt == "fp8" and axis is not None for fmt, kind, _, axis in entries
    )
    return QuantConfig(format="fp8", overrides=pins, fp8_gemm_per_channel=per_channel)


def _plan_fields(p: Path, i: int, e: object) -> tuple[str, str | None, str, int | None]:
    """An entry's ``format``, ``kind``, ``name`` and ``axis``, checked (config_of's inputs)."""
    if not isinstance(e, dict):
        raise ValueError(f"{p}: quantizers[{i}] must be an object, got {short(e)}")
    fmt, kind, name, axis = (e.get("format", "int8"), e.get("kind"), e.get("name", ""),
                             e.get("axis"))  # fmt: skip
    if fmt not in FORMATS:
        raise ValueError(
            f"{p}: quantizers[{i}].format must be one of {', '.join(FORMATS)}, got {short(fmt)}"
        )
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"{p}: quantizers[{i}].kind must be a string, got {short(kind)}")
    if not isinstance(name, str):
        raise ValueError(f"{p}: quantizers[{i}].name must be a string, got {short(name)}")
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool)):
        raise ValueError(f"{p}: quantizers[{i}].axis must be an integer or null, got {short(axis)}")
    return fmt, kind, name, axis
