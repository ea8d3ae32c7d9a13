"""The quantization manifest: every quantizer's module path, rule, group, calibration, amax, scale
and ONNX node names, as versioned JSON beside the ONNX file; ``load_calibration`` restores amax.

A weight quantizer with state learned by :mod:`qdq.ptq` (AdaRound codes, a bias correction) also
has a ``"learned"`` entry: per part the settings, the SHA-256 of the codes / delta, and a short
figure (see :func:`qdq.quant.learned.manifest_entry`). The codes themselves are in the ONNX (the
weight initializer is ``scale · code``) and in the prepared model's ``state_dict``, not in the
manifest, so ``load_calibration`` does not restore them: it checks that the model holds the same
learned state as the manifest records, and refuses otherwise.

A manifest belongs to exactly one ONNX file: it is named after the full file name
(``m.onnx`` → ``m.onnx.manifest.json``, so ``m.onnx`` and ``m.bin`` never share one), it records that
file's name and the SHA-256 of its bytes (``"onnx": {"file": ..., "sha256": ...}``), and
:func:`qdq.export_onnx` writes both files as one unit (both or neither). A model past 2 GB keeps its
weights in an external-data file beside the ONNX (:mod:`qdq.export.external`); the ``.onnx`` hash
then covers the graph, the Q/DQ scales and the data file's name and offsets, and
``"onnx": {"external_data": {"file": ..., "sha256": ...}}`` records the data file's own hash
(checked by ``load_calibration`` too).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qdq._version import __version__
from qdq.api import plan_of, quantizers_of
from qdq.config import Override, QuantConfig
from qdq.graph.plan import QuantPlan
from qdq.quant import Quantizer, scale_from_amax
from qdq.quant.learned import manifest_entry

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_SUFFIX",
    "SCHEMA",
    "build_manifest",
    "config_of",
    "find_manifest",
    "load_calibration",
    "manifest_path_for",
]

SCHEMA = "qdq.manifest/1"
#: Appended to the full ONNX file name: ``m.onnx`` → ``m.onnx.manifest.json``.
MANIFEST_SUFFIX = ".manifest.json"
#: The directory-level manifest ``qdq quantize`` writes beside ``model.qdq.onnx``.
MANIFEST_NAME = "manifest.json"

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

    Example:
        >>> find_manifest("out/model.qdq.onnx")  # doctest: +SKIP
        PosixPath('out/manifest.json')
    """
    p = Path(onnx_path)
    own = manifest_path_for(p)
    if own.is_file():
        return own
    shared = p.with_name(MANIFEST_NAME)
    if shared.is_file():
        try:
            doc = json.loads(shared.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{shared} is not valid JSON: {err}") from None
        info = doc.get("onnx") if isinstance(doc, dict) else None
        if isinstance(info, dict) and info.get("file") == p.name:
            return shared
    raise FileNotFoundError(
        f"no manifest for {onnx_path}: neither {own} nor {shared} naming {p.name}"
    )


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
) -> str:
    """The manifest JSON text for an export.

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
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            nodes.setdefault(n.name.split("/")[0], []).append(n.name)
    by_path = {g.quantizer: g for g in plan.groups if g.quantizer}
    entries = []
    for path, q in quantizers.items():
        group = by_path.get(path)
        leader = plan.point(group.leader) if group is not None else None
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
                "scale": _values(scale_from_amax(q.amax, fmt=q.spec.format)),
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
        "opset": opset,
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


def load_calibration(
    prepared: nn.Module, manifest: str | Path, onnx_path: str | Path | None = None
) -> nn.Module:
    """Restore every quantizer's amax from a manifest (no data needed); return ``prepared``.

    Everything is checked before any amax changes, so on error the model is untouched:

    * the ONNX file: ``onnx_path`` when given, else the file the manifest names, when it lies
      beside the manifest — its SHA-256 must equal the manifest's (the pair was written together);
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

    Raises:
        FileNotFoundError: no manifest (or no ``onnx_path``) at that path.
        ValueError: not JSON, wrong schema, a malformed entry, a hash mismatch, a manifest that
            does not match the model, or learned state that differs between the two; the
            message names the file and the quantizer.

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
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{p} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{p}: expected schema {SCHEMA!r}, got {got!r}")
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
            f"{p} has entries for quantizers the model does not have {extra[:5]}: it belongs to "
            "another model"
        )
    amax = {path: _entry_amax(p, path, entries[path], q) for path, q in quantizers.items()}
    _check_learned(p, entries, quantizers)
    for path, q in quantizers.items():
        q.set_amax(amax[path])
        method = entries[path].get("method")
        if isinstance(method, str):  # the record travels with the amax it describes
            q.amax_method = method
            pct = entries[path].get("percentile")
            q.amax_percentile = float(pct) if isinstance(pct, (int, float)) else None
    return prepared


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
    info = doc.get("onnx")
    if info is not None and not (
        isinstance(info, dict)
        and isinstance(info.get("file"), str)
        and isinstance(info.get("sha256"), str)
    ):
        raise ValueError(f"{p}: malformed 'onnx' entry {info!r}; expected {{'file', 'sha256'}}")
    if onnx_path is not None:
        target = Path(onnx_path)
        if not target.is_file():
            raise FileNotFoundError(f"no ONNX file at {target}")
        if info is None:
            raise ValueError(
                f"{p} records no ONNX hash (written by qdq before 0.x?), so it cannot be checked "
                f"against {target}; re-export to get a matching pair"
            )
    elif info is not None and (p.parent / info["file"]).is_file():
        target = p.parent / info["file"]
    else:
        _log.debug("%s: no ONNX file beside it; amax loaded without a hash check", p)
        return
    digest = sha256_of(target.read_bytes())
    if digest != info["sha256"]:
        raise ValueError(
            f"{p} does not describe {target}: the file's SHA-256 is {digest[:12]}…, the manifest "
            f"records {info['sha256'][:12]}… (the pair was not written together, or one was "
            "replaced); re-export, or pass the matching manifest"
        )
    _check_external_hash(p, info.get("external_data"), target)


def _check_external_hash(p: Path, info: Any, onnx_path: Path) -> None:
    """The external-data file the manifest records (models past 2 GB) has its recorded hash."""
    from qdq.export.external import sha256_of_file

    if info is None:
        return
    if not (
        isinstance(info, dict) and all(isinstance(info.get(k), str) for k in ("file", "sha256"))
    ):
        raise ValueError(
            f"{p}: malformed 'onnx.external_data' entry {info!r}; expected {{'file', 'sha256'}}"
        )
    data = onnx_path.parent / info["file"]
    if not data.is_file():
        raise FileNotFoundError(
            f"{onnx_path} keeps its weights in {data}, which is missing: copy the .onnx file "
            "and its external-data file together"
        )
    digest = sha256_of_file(data)
    if digest != info["sha256"]:
        raise ValueError(
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
            raise ValueError(f"{p}: quantizers[{i}] must be an object, got {e!r}")
        path = e.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"{p}: quantizers[{i}] has no 'path' (got {path!r})")
        if path in entries:
            raise ValueError(f"{p}: quantizer {path!r} appears twice")
        entries[path] = e
    return entries


def _entry_amax(p: Path, path: str, entry: dict[str, Any], q: Quantizer) -> torch.Tensor:
    """The entry's amax as a tensor shaped for ``q``; ValueError naming file and quantizer."""
    where = f"{p}: quantizer {path!r}"
    name = entry.get("name", q.name)
    if name != q.name:
        raise ValueError(f"{where} is named {name!r} in the manifest, {q.name!r} in the model")
    if "axis" not in entry:
        raise ValueError(f"{where} has no 'axis'")
    axis = entry["axis"]
    if axis != q.spec.axis or isinstance(axis, bool):
        raise ValueError(
            f"{where} has axis={axis!r} in the manifest but axis={q.spec.axis!r} in the model"
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
            f"{where} is per-channel (axis {q.spec.axis}) but its amax is {_short(raw)}, "
            "not a list of numbers"
        )
    if not values or not all(_is_number(v) for v in values):
        raise ValueError(f"{where}: amax must be a finite non-negative number or a list of them, "
                         f"got {_short(raw)}")  # fmt: skip
    bad = [i for i, v in enumerate(values) if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(f"{where}: amax has negative or non-finite values at index {bad[:8]}")
    channels = entry.get("channels")
    if channels is not None and channels != len(values):
        raise ValueError(f"{where}: 'channels' is {channels!r} but amax has {len(values)} values")
    amax = torch.tensor(values, dtype=torch.float32)
    return q.check_amax_shape(amax, source=str(p))


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def config_of(manifest: str | Path) -> QuantConfig | None:
    """The :class:`QuantConfig` that plans the model of ``manifest`` again with each layer in its
    recorded format (``None``: every quantizer INT8, the default config does): an FP8 plan
    whose every weighted layer is pinned to the format the manifest records
    (``Override(format=...)``), its FP8 GEMM weights per channel when the manifest records
    them so, so that :func:`load_calibration` finds the same quantizers, axes included, for an
    ``int8``, ``fp8`` or ``mixed`` export alike.

    Raises:
        FileNotFoundError / ValueError: no manifest, or not a qdq manifest (as
            :func:`load_calibration`).
    """
    path = Path(manifest)
    if not path.is_file():
        raise FileNotFoundError(f"no manifest at {path}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not JSON: {err}") from None
    entries = doc.get("quantizers") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path} is not a qdq manifest (no quantizers list)")
    if all(e.get("format", "int8") == "int8" for e in entries if isinstance(e, dict)):
        return None
    pins = tuple(
        Override(name=str(e["name"]).rsplit(":", 1)[0], format=str(e.get("format", "int8")))
        for e in entries
        if isinstance(e, dict) and e.get("kind") == "weight" and ":" in str(e.get("name", ""))
    )
    per_channel = any(  # F06: per-channel FP8 GEMM weights (a target that builds them)
        isinstance(e, dict)
        and e.get("kind") == "weight"
        and e.get("format") == "fp8"
        and e.get("axis") is not None
        for e in entries
    )
    return QuantConfig(format="fp8", overrides=pins, fp8_gemm_per_channel=per_channel)
