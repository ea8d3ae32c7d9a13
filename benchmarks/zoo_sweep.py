"""Model-zoo sweep (issue 34): capture, export, ORT parity and lint over whole model libraries.

Rows, named ``source:model`` (random weights, eval mode, batch 1, the smallest input that runs):

* ``timm``: per family (the timm module that defines the model, ``timm.list_modules()``) the variant
  with the fewest parameters, counted on the meta device; the picks are cached per timm version in
  ``~/.cache/qdq`` (the first ``--list`` takes minutes). Input 64, 96, 128, 160 or the pretrained
  config's size, the first that runs (``img_size=`` is passed to the models that take it);
* ``torchvision``: every classification, segmentation and detection builder (``weights=None``,
  ``weights_backbone=None``); detectors whole (transform, NMS) at 128x128, ``min_size``/``max_size``
  128, score threshold 0, exported without end-to-end verification (``Arch.ranked_outputs``);
* ``smp``: every segmentation-models-pytorch architecture with a ``resnet18`` encoder (DPT takes
  only timm ViT encoders: ``tu-test_vit``), 64x64 or 128x128;
* ``ultralytics``: the detect, segment, pose, obb and classify heads of the newest family's nano
  yaml in ultralytics' own ONNX-export form (as ``tests/models/real.py``), 64x64 or 128x128;
* ``diffusers``: a text-conditioned ``UNet2DConditionModel``, a ``UNet2DModel`` and
  ``AutoencoderKL``'s decoder, tiny configs (two levels of 32 and 64 channels) on 32x32 latents,
  built as the real-model suite's ``*_tiny`` diffusers rows (the UNets take the timestep, and
  the text UNet its encoder hidden states, as inputs).

A row is ``real_models.bench`` (fx / torch.export probes, ``qdq.prepare`` and its capture path,
plan counts, ``qdq.calibrate``, ``qdq.export_onnx`` per exporter, ORT parity, ``qdq.lint``) in a
child process with a time limit, plus a second ``qdq.lint`` of each export for what real_models
does not keep: the linter's predicted INT8 FLOP share (``int8_flops_percent``: of the FLOPs of
Conv/ConvTranspose/Gemm and MatMul with a constant weight, sized by ONNX shape inference, the share
whose activation and weight both arrive through DequantizeLinear), and how many weighted
MatMul/Gemm nodes and MatMuls of two activations (attention) the linter predicts INT8. Kind: a row
with a MatMul of two activations is *transformer* (hybrids included), else *conv* when it has more
Conv than weighted MatMul/Gemm nodes, else *mlp*. Parity is ok at cosine >= 0.999; NMS-ranked
detections are not compared. Placement warnings: WARN findings P03a, P03d, P04, S02b, S03.

A failing row (build error, timeout, crash) is a row, not the end of the run. It prints figures
and asserts nothing. The whole sweep takes hours: run it in parts and merge (a later file's row
replaces an earlier one; ``--json`` is rewritten after every row, so a killed part keeps its rows)::

    PYTHONPATH=src .venv/bin/python benchmarks/zoo_sweep.py --list
    PYTHONPATH=src .venv/bin/python benchmarks/zoo_sweep.py --shard 0/4 --json /tmp/zoo0.json
    ...                                                      --shard 3/4 --json /tmp/zoo3.json
    PYTHONPATH=src .venv/bin/python benchmarks/zoo_sweep.py --merge /tmp/zoo?.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import qdq
import real_models  # puts tests/ on sys.path
from models.real import Arch, _ultralytics_export_form
from zoo_sweep_table import (  # noqa: F401  (the table's names, also for the tests)
    PARITY_MIN_COSINE,
    PLACEMENT_RULES,
    _all_int8,
    _counts,
    _lint,
    _pair,
    outcome,
    render_comparison,
    render_summary,
    render_table,
)

#: the rows ``real_models.bench`` looks up (its ``BENCH_ARCHS``): a sweep row is entered there
ARCHS = real_models.ARCHS

SOURCES = ("timm", "torchvision", "smp", "ultralytics", "diffusers")
#: the diffusers rows and the real-model suite's rows that build them
DIFFUSERS_ROWS = {
    "diffusers:UNet2DConditionModel": "unet2d_cond_tiny",
    "diffusers:UNet2DModel": "unet2d_tiny",
    "diffusers:AutoencoderKL.decoder": "vae_decoder_tiny",
}
_DOWNLOAD = re.compile(r"offline|download|hf_hub|huggingface|urlopen|connectionerror", re.I)
_YOLO_TASKS = {"detect": "", "segment": "-seg", "pose": "-pose", "obb": "-obb", "classify": "-cls"}
_YOLO_CLASSES = {"detect": "DetectionModel", "segment": "SegmentationModel", "pose": "PoseModel"}
_YOLO_CLASSES.update(obb="OBBModel", classify="ClassificationModel")  # ultralytics.nn.tasks
Inputs = tuple[torch.Tensor, ...]
Row = dict[str, Any]


# ----------------------------------------------------------------------------------- enumeration
def list_rows(sources: list[str]) -> list[str]:
    """The row names of ``sources``, in order (a source that does not import: ``source:*``)."""
    listers = {"timm": timm_rows, "torchvision": torchvision_rows, "smp": smp_rows}
    listers.update(ultralytics=ultralytics_rows, diffusers=diffusers_rows)
    rows: list[str] = []
    for source in sources:
        try:
            rows += listers[source]()
        except ImportError:  # the row records "skipped: <the import error>"
            rows.append(f"{source}:*")
    return rows


def timm_rows() -> list[str]:
    """``timm:NAME`` of the smallest variant (parameters) of every timm family."""
    import timm

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qdq"
    path = cache / f"zoo_sweep_timm-{timm.__version__}.json"
    if path.is_file():
        picks = json.loads(path.read_text())
    else:
        picks = {m: _smallest_timm(timm.list_models(module=m)) for m in timm.list_modules()}
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(picks, indent=1))
    return [f"timm:{picks[m]}" for m in sorted(picks)]


def _smallest_timm(names: list[str]) -> str:
    """The name with the fewest parameters on the meta device (the first if none builds there)."""
    import timm

    counts: dict[str, int] = {}
    for name in names:
        with contextlib.suppress(Exception), warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = timm.create_model(name, pretrained=False)
            counts[name] = sum(p.numel() for p in model.parameters())
    print(f"[zoo_sweep] timm {names[0]}...: {len(counts)}/{len(names)} built", file=sys.stderr)
    return min(counts, key=lambda n: (counts[n], n)) if counts else sorted(names)[0]


def torchvision_rows() -> list[str]:
    """Every torchvision classification, segmentation and detection builder."""
    from torchvision import models
    from torchvision.models import detection, segmentation

    names = [models.list_models(module=m) for m in (models, segmentation, detection)]
    return [f"torchvision:{n}" for group in names for n in group]


def smp_rows() -> list[str]:
    """Every segmentation-models-pytorch architecture (class name)."""
    import segmentation_models_pytorch as smp

    return [f"smp:{cls.__name__}" for cls in smp.MODEL_ARCHITECTURES_MAPPING.values()]


def ultralytics_rows() -> list[str]:
    """The nano yaml of each task head of the newest numbered ultralytics family (``yolo26n``)."""
    import ultralytics

    root = Path(ultralytics.__file__).parent / "cfg" / "models"
    v = max(int(d.name) for d in root.iterdir() if d.name.isdigit())
    tasks = [s for s in _YOLO_TASKS.values() if (root / str(v) / f"yolo{v}{s}.yaml").is_file()]
    return [f"ultralytics:yolo{v}n{suffix}" for suffix in tasks]


def diffusers_rows() -> list[str]:
    """The diffusers rows (:data:`DIFFUSERS_ROWS`); ``ImportError`` without diffusers."""
    import diffusers  # noqa: F401  (the rows need it: a missing package is one skipped row)

    return list(DIFFUSERS_ROWS)


# -------------------------------------------------------------------------------------- builders
def arch_for(name: str) -> Arch:
    """The :class:`Arch` (family = source) that builds row ``name`` at its smallest input."""
    source, _, model = name.partition(":")
    if source == "timm":
        return Arch(name, source, ("timm",), _timm_builder(model))
    if source == "torchvision":
        return _torchvision_arch(name, model)
    if source == "smp":
        encoder = "tu-test_vit" if model == "DPT" else "resnet18"  # DPT: timm ViT encoders only
        builder = _smallest_input(functools.partial(_smp_model, model, encoder), (64, 128))
        return Arch(name, source, ("segmentation_models_pytorch",), builder, note=encoder)
    if source == "ultralytics":
        builder = _smallest_input(functools.partial(_yolo_model, model), (64, 128))
        return Arch(name, source, ("ultralytics",), builder, note="ultralytics ONNX-export form")
    if name in DIFFUSERS_ROWS:  # several inputs (timestep, text states): the suite's builders
        return dataclasses.replace(ARCHS[DIFFUSERS_ROWS[name]], name=name, family=source)
    raise ValueError(f"row {name!r}: the source must be one of {', '.join(SOURCES)}")


def _smallest_input(
    make: Callable[[int], nn.Module], sizes: tuple[int, ...], channels: int = 3
) -> Callable[[], tuple[nn.Module, Inputs]]:
    """A builder: ``make(size)`` and its input at the first of ``sizes`` that runs a forward."""

    def build() -> tuple[nn.Module, Inputs]:
        errors: dict[str, list[str]] = {}  # error -> the sizes that raised it
        for size in sizes:
            x = torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(1))
            try:
                model = make(size).eval()
                with torch.no_grad():
                    model(x)
                return model, (x,)
            except Exception as err:  # try the next size; all sizes' errors if none runs
                errors.setdefault(real_models.short(err, 120), []).append(str(size))
        raise RuntimeError("; ".join(f"at {'/'.join(v)}: {e}" for e, v in errors.items()))

    return build


def _timm_builder(name: str) -> Callable[[], tuple[nn.Module, Inputs]]:
    import timm

    cfg = timm.get_pretrained_cfg(name)
    channels, default = (cfg.input_size[0], cfg.input_size[1]) if cfg else (3, 224)
    fixed = functools.cache(lambda: timm.create_model(name, pretrained=False))

    def make(size: int) -> nn.Module:
        try:
            return timm.create_model(name, pretrained=False, img_size=size)
        except TypeError as err:  # no img_size: build once, then try each size on it
            if "img_size" not in str(err):
                raise
            return fixed()

    sizes = (*(s for s in (64, 96, 128, 160) if s < default), default)
    return _smallest_input(make, sizes, channels)


def _torchvision_arch(name: str, model: str) -> Arch:
    from torchvision import models
    from torchvision.models import detection, segmentation

    get = functools.partial(models.get_model, model, weights=None)
    if model in models.list_models(module=detection):
        kw: dict[str, Any] = {"weights_backbone": None}
        if not model.startswith("ssd"):  # SSD resizes to its own fixed size
            kw.update(min_size=128, max_size=128)
        kw["box_score_thresh" if "rcnn" in model else "score_thresh"] = 0.0
        note = "whole model (transform, NMS); min/max_size 128, score threshold 0"
        detector = functools.cache(lambda: get(**kw))
        builder = _smallest_input(lambda s: detector(), (128,))
        return Arch(name, "torchvision", ("torchvision",), builder, note=note, ranked_outputs=True)
    if model in models.list_models(module=segmentation):
        segmenter = functools.cache(lambda: get(weights_backbone=None))
        builder = _smallest_input(lambda s: segmenter(), (64, 96, 128))
        return Arch(name, "torchvision", ("torchvision",), builder)
    if model not in models.list_models(module=models):
        raise ValueError(f"row {name!r}: not a torchvision classification/segmentation/detection")
    plain = functools.cache(lambda: get())

    def make(size: int) -> nn.Module:
        if model.startswith("vit_"):
            return get(image_size=size)
        return get(input_size=(size, size)) if model.startswith("maxvit") else plain()

    builder = _smallest_input(make, (64, 96, 112, 128, 224, 299))
    return Arch(name, "torchvision", ("torchvision",), builder)


def _smp_model(arch: str, encoder: str, size: int) -> nn.Module:
    import segmentation_models_pytorch as smp

    return getattr(smp, arch)(encoder_name=encoder, encoder_weights=None, classes=1)


def _yolo_model(stem: str, size: int) -> nn.Module:
    """The nano model of ``stem`` (``yolo26n-seg``) in the ultralytics exporter's form."""
    from ultralytics.nn import tasks
    from ultralytics.nn.modules import Classify

    task = tasks.guess_model_task(tasks.yaml_model_load(f"{stem}.yaml"))
    model: Any = getattr(tasks, _YOLO_CLASSES[task])(f"{stem}.yaml", verbose=False)
    _ultralytics_export_form(model, size)
    heads: list[Any] = [m for m in model.modules() if isinstance(m, Classify)]
    for head in heads:  # the exporter's step for classifiers (softmax output only)
        head.export, head.format = True, "onnx"
    return model


# ------------------------------------------------------------------------------------- one row
def run_row(name: str, folder: Path) -> Row:
    """Every cell of one row in this process: ``real_models.bench``, then :func:`lint_extra`.

    ``real_models.export_cells`` reads ``ARCHS[name].end_to_end``: the row's :class:`Arch` is
    entered in ``ARCHS`` while it runs (this process only).
    """
    row: Row = {"name": name, "family": name.partition(":")[0]}
    try:
        arch = arch_for(name)
    except ImportError as err:  # the source's package is missing
        return {**row, "status": f"skipped: {real_models.short(err)}"}
    except Exception as err:  # not a model of the source
        return {**row, "status": f"build failed: {real_models.short(err)}"}
    ARCHS[name] = arch
    try:
        row = real_models.bench(name, folder)
    finally:
        del ARCHS[name]
    build_error = row.get("build", {}).get("error") or ""
    if row["status"].startswith("not installed"):
        row["status"] = f"skipped: {row['status']}"
    elif _DOWNLOAD.search(build_error):
        row["status"] = f"skipped: needs a download ({build_error})"
    _add_lint_extra(row, arch.ranked_outputs, folder)
    return row


def _add_lint_extra(row: Row, ranked: bool, folder: Path) -> None:
    """:func:`lint_extra` into each export's lint cell, the row's kind; removes the exports."""
    for exporter, cell in row.get("export", {}).items():
        if ranked and cell.get("parity"):
            cell["parity"]["ranked"] = True  # NMS-ranked detections: not compared end to end
        path = folder / f"{row['name']}.{exporter}.onnx"
        if cell.get("lint", {}).get("ok"):
            extra: Row = {}
            cell["lint"].update(real_models.timed(extra, functools.partial(lint_extra, path)) or {})
            cell["lint_extra"] = extra
        path.unlink(missing_ok=True)
    kinds = [
        c["lint"]["kind"] for c in row.get("export", {}).values() if "kind" in c.get("lint", {})
    ]
    row["kind"] = kinds[0] if kinds else "-"


def lint_extra(path: Path) -> Row:
    """The linter's INT8 FLOP share, its INT8 GEMMs and attention products, and the row kind."""
    import onnx

    from qdq.lint.graph import LintGraph

    report = qdq.lint.lint(path)
    g = LintGraph(onnx.load(str(path)))
    int8 = set(report.int8_layers)
    weighted = [n for n in g.nodes if n.op_type in ("MatMul", "Gemm") and g.weighted(n)]
    gemms = [n for n in weighted if not g.folded_node(n)]  # folded at build time: no GEMM
    small = [n for n in gemms if g.name(n) not in int8 and min(g.gemm_kn(n) or (16,)) < 16]
    attention = [n for n in g.nodes if n.op_type == "MatMul" and not g.weighted(n)]
    convs = sum(n.op_type in ("Conv", "ConvTranspose") for n in g.nodes)
    return {
        "int8_flops_percent": report.summary["int8_flops_percent"],
        "gemms": len(gemms),
        "gemms_int8": sum(g.name(n) in int8 for n in gemms),
        "gemms_folded": len(weighted) - len(gemms),
        "gemms_small": len(small),
        "attention_matmuls": len(attention),
        "attention_int8": sum(g.name(n) in int8 for n in attention),
        "kind": "transformer" if attention else "conv" if convs > len(gemms) else "mlp",
    }


def _in_child(name: str, threads: int, timeout: float, folder: Path) -> Row:
    """One row in a child process killed after ``timeout`` seconds: a crash or a hang is one row."""
    folder.mkdir(parents=True)
    out, err = folder / "row.json", folder / "stderr.txt"
    cmd = [sys.executable, __file__, "--child", name, "--threads", str(threads), "--json", str(out)]
    start = time.perf_counter()
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group
            proc.wait()
            code = None
    row: Row = {"name": name, "family": name.partition(":")[0]}
    if code == 0 and out.is_file():
        row = dict(json.loads(out.read_text())[0])
    elif code is None:
        row["status"] = f"timeout (killed after {timeout:g} s)"
    else:
        tail = [ln for ln in err.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        row["status"] = f"crashed (exit code {code}{': ' + tail[0][:160] if tail else ''})"
    row.setdefault("total_seconds", round(time.perf_counter() - start, 1))
    shutil.rmtree(folder, ignore_errors=True)
    return row


# ------------------------------------------------------------------------------------------ main
def _write(path: Path, rows: list[Row]) -> None:
    """The rows as JSON, through a temporary file and a rename (a killed run keeps a whole file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rows, indent=1, default=str))
    tmp.replace(path)


def _shard(text: str) -> slice:
    """``I/N`` as the slice of every N-th row from row I."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected I/N with 0 <= I < N")
    return slice(int(index), None, int(count))


def _run(names: list[str], args: argparse.Namespace) -> list[Row]:
    """Every row in a child process, with a progress line each; ``--json`` after every row."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="qdq-zoo-") as tmp:
        for i, name in enumerate(names):
            tag = f"[zoo_sweep {i + 1}/{len(names)}] {name}"
            print(f"{tag} ...", file=sys.stderr, flush=True)
            rows.append(row := _in_child(name, args.threads, args.timeout, Path(tmp) / str(i)))
            if args.json:
                _write(args.json, rows)
            print(
                f"{tag}: {outcome(row)} in {row['total_seconds']} s (capture "
                f"{row.get('prepare', {}).get('capture', '-')}, export "
                f"{_pair(row, real_models._cell)}, lint {_pair(row, _lint('verdict'))})",
                file=sys.stderr,
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=",".join(SOURCES), help="comma-separated sources")
    ap.add_argument("--list", action="store_true", help="print the rows that would run, and stop")
    ap.add_argument("--shard", type=_shard, default="0/1", help="I/N: every N-th row from row I")
    ap.add_argument("--only", nargs="+", default=[], help="row names (source:model)")
    ap.add_argument("--limit", type=int, help="run at most this many rows")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per row (default 600)")
    ap.add_argument("--json", type=Path, help="rows as JSON, rewritten after every row")
    ap.add_argument("--merge", type=Path, nargs="+", help="one table from these JSON files")
    ap.add_argument(
        "--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
        help="the rows of two runs' JSON side by side (better/worse/same), and stop",
    )  # fmt: skip
    ap.add_argument("--threads", type=int, default=2, help="torch threads per row")
    ap.add_argument("--details", action="store_true", help="also print real_models' tables")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one row here (the parent's child)
    args = ap.parse_args(argv)
    args.source = [s for s in args.source.split(",") if s]
    if bad := sorted(set(args.source) - set(SOURCES)):
        ap.error(f"unknown source(s) {bad}; known: {', '.join(SOURCES)}")
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(render_comparison(before, after))
        return 0
    if args.child:
        torch.set_num_threads(args.threads)
        work = args.json.parent / "onnx"  # in the parent's row folder, removed after the row
        work.mkdir(exist_ok=True)
        row = run_row(args.child, work)
        _write(args.json, [{**row, "peak_rss_mb": real_models._peak_rss_mb()}])
        return 0
    if args.merge:  # a later file's row replaces an earlier one of the same name
        rows = list({r["name"]: r for p in args.merge for r in json.loads(p.read_text())}.values())
        if args.json:
            _write(args.json, rows)
    else:
        names = (list(args.only) or list_rows(args.source))[args.shard][: args.limit]
        if args.list:
            print("\n".join(names))
            print(f"{len(names)} rows: {_counts(n.partition(':')[0] for n in names)}")
            return 0
        rows = _run(names, args)
    threads = "" if args.merge else f", {args.threads} threads per row"  # a merge ran nothing
    print(f"qdq {qdq.__version__}, torch {torch.__version__}{threads}")
    if args.details:
        print(real_models.render(rows), "", sep="\n")
    print(render_table(rows), "", render_summary(rows), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
