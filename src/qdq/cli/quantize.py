"""``qdq quantize``: a thin command around :func:`qdq.pipeline.quantize`; also ``qdq zoo list``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = [
    "add_data_options",
    "add_quantize_parser",
    "add_zoo_parser",
    "data_options",
    "one_line",
    "run_quantize",
    "run_zoo",
]


def add_quantize_parser(sub: Any) -> None:
    """The ``quantize`` sub-command's arguments."""
    p = sub.add_parser(
        "quantize",
        help="quantize a model on its data: INT8 Q/DQ ONNX verified in ONNX Runtime, lint, report",
        description="capture + plan → calibrate → PTQ recipe search (held-out calibration "
        "samples; or --recipe) → export → ONNX Runtime verification → lint. "
        "Writes OUT/model.qdq.onnx, OUT/manifest.json (its manifest), OUT/report.json and "
        "OUT/report.html (open it in a browser; it loads nothing), all or nothing. The INT8 "
        "metric is measured on the exported ONNX in ONNX Runtime.",
        epilog="Model SPEC: a zoo name (qdq zoo list), pkg.module:factory or "
        "path/to/file.py:factory (this IMPORTS/EXECUTES that Python code), a .pt2 "
        "(torch.export.save; checked first and refused if loading it would run code -- a "
        "pickle, AOTInductor code, shape code that is not size arithmetic -- unless "
        "--trust-model), or an FP32 .onnx (needs onnx2torch; its external data must lie inside "
        "its folder and match each tensor's size); TorchScript cannot be "
        "quantized (export it with torch.export). Data SPEC: a built-in dataset (fashion-mnist, "
        "skimage-photos, crepe-tones, lfw-faces-24, lfw-faces-48, rendered-text), an image "
        "folder (one sub-folder per class gives labels), a .npy, or a .npz with x/images "
        "or arrays named after forward's parameters (several or keyword inputs) (+ y/labels); "
        "files are checked before they are decoded: no pickled/object arrays, images up to "
        "8192x8192 pixels, no symbolic link out of the folder, decoded size within half the "
        "available memory (QDQ_MAX_INPUT_BYTES sets it). User data is split by a seeded permutation: "
        "calibration min(--calib-samples, N/2) samples, evaluation the others.",
    )
    add_quantize_arguments(p)


def add_qat_parser(sub: Any) -> None:
    """The ``qat`` sub-command: ``quantize`` with quantization-aware fine-tuning on."""
    p = sub.add_parser(
        "qat",
        help="quantize, then fine-tune with fake quantization (QAT) before export",
        description="qdq quantize with --qat-epochs (default 2): calibrate, PTQ options, "
        "fallback, then fine-tune the INT8 model by distillation against its FP32 copy on the "
        "calibration samples (no labels needed), export and measure in ONNX Runtime. The "
        "report gives the PTQ metric (torch fake-quant) before fine-tuning next to the result.",
    )
    add_quantize_arguments(p, qat_epochs=2)


def add_quantize_arguments(p: Any, *, qat_epochs: int = 0) -> None:
    """The arguments of ``quantize`` (and ``qat``, whose ``--qat-epochs`` defaults to 2)."""
    p.add_argument("--model", required=True, metavar="SPEC", help="the float model (see below)")
    p.add_argument("--data", metavar="SPEC", help="the data (default: a zoo model's own)")
    p.add_argument(
        "--trust-model",
        action="store_true",
        help="load a .pt2 as torch.export.load does, unchecked: it may RUN CODE the file holds "
        "(pickles); only for a file whose sender you trust",
    )
    p.add_argument("--out", default="qdq-out", metavar="DIR", help="output directory (qdq-out)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT")
    p.add_argument(
        "--format",
        default="int8",
        choices=("int8", "fp8", "nvfp4", "mxfp8", "int4w", "mixed"),
        help="int8 (default); fp8: FP8 E4M3 where TensorRT has an FP8 kernel for the layer (Ada, "
        "Hopper, Blackwell), INT8 where it has none (a ConvNet with depthwise convolutions keeps "
        "its convolutions INT8); nvfp4 / mxfp8: GEMMs in NVFP4 (blocks of 16) or MXFP8 (blocks "
        "of 32) on Blackwell, convolutions and attention as fp8; int4w: GEMMs with INT4 "
        "block-wise weights and float activations, the rest float; mixed: convolutions INT8, "
        "GEMMs and attention FP8, a layer moved to the other format where it measurably loses "
        "and the move costs no reformat, or every layer INT8 where that measures less noise "
        "than the moves allow (rules F01-F15)",
    )
    p.add_argument(
        "--objective",
        default="accuracy",
        choices=("accuracy", "speed"),
        help="accuracy (default): the placement rules alone; speed: also keep in FP16 the layers "
        "whose INT8 is predicted slower than FP16 on the target's GPU (their Q/DQ and reformats "
        "counted; rule T01), before --max-drop's search; needs a --target naming a GPU "
        "(trt10-a100, trt10-hopper)",
    )
    p.add_argument(
        "--calib",
        default=None,
        choices=("mse", "entropy", "percentile", "max"),
        help="calibration method (default mse; with --format fp8, max for FP8 layers as in "
        "TensorRT's FP8 recipes; one histogram pass)",
    )
    p.add_argument("--percentile", type=float, help="for --calib percentile (default 99.99)")
    p.add_argument(
        "--compare-methods",
        action="store_true",
        help="also measure every calibration method (torch fake-quant)",
    )
    p.add_argument(
        "--max-drop",
        type=float,
        metavar="X",
        help="keep in float the fewest layers that bring the metric within X of FP32 (metric "
        "units: 0.01 = one point of accuracy); ranked by a cheap proxy, confirmed with the "
        "metric on the evaluation data, each fallback's TensorRT cost predicted by the linter",
    )
    p.add_argument(
        "--metric",
        metavar="SPEC",
        help="your own headline metric: path/to/file.py:fn or pkg.module:fn (this IMPORTS/EXECUTES "
        "that code); fn(outputs, labels) gets every output tensor (pytree order, all evaluation "
        "samples along dim 0) and the labels or None, and returns a float or a dict of floats "
        "(the first is the headline); --max-drop then scores with it",
    )
    p.add_argument(
        "--output-kind",
        metavar="KIND",
        help="the kind of the first output instead of the guess, whose figure is then the "
        "headline: class_vector, class_map, detections, embedding, image (PSNR) or tensor",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="seconds for the whole job, from capture to the written report: the clock then "
        "stops the recipe search, the refit, --compare-methods and the per-layer errors where "
        "they no longer fit (report.json's budget says what, and the --recipe that reproduces a "
        "result the clock cut). Default: the predicted job, printed, which stops nothing before 10x "
        "it: the search's plan is counted from the model, the same under any load",
    )
    p.add_argument(
        "--search-budget",
        type=float,
        metavar="SECONDS",
        help="at most this much of the time budget for the recipe search, which by default (no "
        "--recipe and none of the four PTQ switches below) holds out a quarter of the "
        "calibration samples (a seeded draw), scores the candidate PTQ recipes on it, cheapest "
        "first, races the close ones over the other quarters, and keeps the best",
    )
    p.add_argument(
        "--equalize",
        action="store_true",
        help="cross-layer equalization before calibration: move per-channel activation ranges "
        "into the next layer's weights where only ReLU/PReLU/pooling lie between (the float "
        "model computes the same)",
    )
    p.add_argument(
        "--calib-per-quantizer",
        action="store_true",
        help="choose each activation quantizer's method (max/entropy/mse/percentile) from its "
        "histogram by its layer's output error",
    )
    p.add_argument(
        "--rounding",
        choices=("nearest", "kernel-sum", "adaround"),
        help="weight rounding, instead of the search's choice: nearest, kernel-sum (data-free: "
        "every conv kernel keeps "
        "its sum) or adaround (learned on the calibration data); only the INT8 codes change",
    )
    p.add_argument(
        "--bias-correction", action="store_true", help="correct each weighted layer's bias"
    )
    p.add_argument(
        "--recipe",
        metavar="NAME",
        help="the PTQ steps as one name instead of the four switches above, without searching: "
        "none, or parts of equalize, method, kernel-sum, adaround, bias joined by '+' (e.g. "
        "kernel-sum+bias; report.json ptq.recipe and the manifest record the one that ran)",
    )
    p.add_argument(
        "--qat-epochs",
        type=int,
        default=qat_epochs,
        metavar="N",
        help="fine-tune with fake quantization for N passes over the calibration samples, by "
        f"distillation against the FP32 model (default {qat_epochs}: "
        f"{'on' if qat_epochs else 'off'})",
    )
    p.add_argument("--qat-lr", type=float, default=1e-5, help="QAT learning rate (Adam; 1e-5)")
    p.add_argument(
        "--qat-learn-amax",
        choices=("lsq", "pact"),
        help="train the clipping ranges too (default: frozen, as pytorch-quantization does)",
    )
    p.add_argument(
        "--qat-bn",
        default="freeze",
        choices=("freeze", "fold", "train"),
        help="BatchNorm during QAT: freeze its statistics (default), fold it into the conv "
        "first, or train it",
    )
    p.add_argument(
        "--exporter",
        default="auto",
        choices=("auto", "dynamo", "torchscript"),
        help="ONNX exporter (auto: dynamo, else TorchScript)",
    )
    p.add_argument(
        "--opset", type=int, default=None, help="ONNX opset, 13..21 (17; 19 with --format fp8)"
    )
    p.add_argument(
        "--target",
        default=None,
        help="TensorRT version (and GPU) the linter predicts: trt8.6, trt10 (default; "
        "trt10.12-blackwell with --format nvfp4/mxfp8), trt11, trt10-hopper, trt10.12-ada, "
        "trt10-a100, trt11-b200 ...; --format fp8/mixed needs an FP8 GPU (Ada+) and trt10+, "
        "nvfp4 Blackwell and trt10.8+, mxfp8 Blackwell and trt10.12+; a GPU in the target also "
        "predicts the engine time against FP16",
    )
    p.add_argument(
        "--engine-report",
        metavar="LAYERS.json",
        help="trtexec --exportLayerInfo JSON of an engine built from this model's export: "
        "report.html draws it beside the prediction, disagreements marked",
    )
    p.add_argument(
        "--engine-profile", metavar="PROFILE.json", help="its trtexec --exportProfile JSON"
    )
    p.add_argument(
        "--device",
        metavar="DEV",
        help="where the model runs for calibration, PTQ, QAT and the torch evaluations: cpu, "
        "cuda or cuda:N (default: cuda when available, else cpu); export and ONNX Runtime run on "
        "the CPU. Under torchrun each rank runs on cuda:LOCAL_RANK (nccl) or the CPU (gloo)",
    )
    add_data_options(p)
    p.add_argument("--json", action="store_true", help="print report.json instead of a summary")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_data_options(p: Any) -> None:
    """The data flags shared by quantize, debug and sensitivity."""
    p.add_argument(
        "--calib-samples",
        type=int,
        metavar="N",
        help="calibration samples (default: the dataset's, else 256)",
    )
    p.add_argument(
        "--eval-samples",
        type=int,
        metavar="N",
        help="evaluation samples (default: the dataset's, else all the others)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch (32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration/evaluation split")
    p.add_argument("--image-size", metavar="H,W", help="image folders: resize to H,W (or N)")
    p.add_argument("--mean", metavar="M[,M,M]", help="image folders: per-channel mean (0)")
    p.add_argument("--std", metavar="S[,S,S]", help="image folders: per-channel std (1)")
    p.add_argument("--channels", type=int, choices=(1, 3), help="image folders: 1 gray, 3 RGB")
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="text files (.txt/.tsv, a line per sample, optionally label<TAB>text): a local "
        "tokenizer folder (save_pretrained's; nothing is downloaded)",
    )
    p.add_argument(
        "--max-length", type=int, metavar="N", help="text files: tokens per sample (128)"
    )


def data_options(args: argparse.Namespace) -> Any:
    """A :class:`qdq.pipeline.DataOptions` from the data flags."""
    from qdq.pipeline import DataOptions
    from qdq.pipeline.forms import image_size, per_channel

    return DataOptions(
        calib_samples=args.calib_samples,
        eval_samples=args.eval_samples,
        image_size=None if args.image_size is None else image_size(args.image_size, "--image-size"),
        mean=None if args.mean is None else per_channel(args.mean, "--mean"),
        std=None if args.std is None else per_channel(args.std, "--std"),
        channels=args.channels,
        seed=args.seed,
        tokenizer=args.tokenizer,
        max_length=args.max_length,
    )


def add_zoo_parser(sub: Any) -> None:
    """The ``zoo`` sub-command."""
    p = sub.add_parser("zoo", help="the built-in pretrained models", description="qdq zoo list")
    p.add_argument("action", choices=("list",), help="list: name, task, metric, availability")


def one_line(err: BaseException) -> str:
    """An exception as one line (the type is kept for errors that are not ours)."""
    text = " ".join(str(err).split()) or type(err).__name__
    ours = (ValueError, FileNotFoundError, FileExistsError, ImportError, NotADirectoryError)
    return text if isinstance(err, ours) else f"{type(err).__name__}: {text}"


def run_quantize(args: argparse.Namespace, prog: str = "qdq quantize") -> int:
    """Run the pipeline from parsed arguments, print, and return the exit code."""
    from qdq.pipeline.device import resolve_device
    from qdq.pipeline.outdir import sigterm_interrupts
    from qdq.qat.distributed import process_group, rank

    try:
        device = resolve_device(args.device)
        with sigterm_interrupts(), process_group(device) as device:
            # under torchrun only rank 0 prints (every rank runs the job; rank 0 writes)
            return _run_quantize(args, prog, device, quiet=rank() != 0)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
        return _interrupted(prog, err)
    except Exception as err:  # a device or process group that cannot be used: one line
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2


def _run_quantize(args: argparse.Namespace, prog: str, device: Any, quiet: bool) -> int:
    from qdq.pipeline import QatOptions, quantize
    from qdq.pipeline.report import STAGE_LABELS

    def stage(name: str, seconds: float, detail: str) -> None:
        if not args.json and not quiet:
            print(f"  {STAGE_LABELS.get(name, name):<20}{seconds:7.2f} s  {detail}", flush=True)

    try:
        check_paths(args)  # before anything is loaded
        options = data_options(args)
        if not args.json and not quiet:
            data = args.data or "its own data"
            print(f"{prog}: {args.model} on {data} ({device}) → {args.out}", flush=True)
        result = quantize(
            args.model,
            args.data,
            out=args.out,
            calib=args.calib,
            format=args.format,
            percentile=args.percentile,
            exporter=args.exporter,
            opset=args.opset,
            target=args.target,
            data_options=options,
            batch_size=args.batch_size,
            compare_methods=args.compare_methods,
            max_drop=args.max_drop,
            ptq=_ptq_options(args),
            qat=QatOptions(
                epochs=args.qat_epochs,
                lr=args.qat_lr,
                learn_amax=args.qat_learn_amax,
                bn=args.qat_bn,
            ),
            overwrite=args.overwrite,
            show_progress=not args.no_progress and not quiet,
            on_stage=stage,
            engine_report=args.engine_report,
            engine_profile=args.engine_profile,
            metric=args.metric,
            device=device,
            output_kind=args.output_kind,
            time_budget=args.time_budget,
            trust_model=args.trust_model,
            objective=args.objective,
        )
    except KeyboardInterrupt as err:
        return _interrupted(prog, err)
    except Exception as err:  # user code and files: one line, never a traceback
        print(f"{prog}: error: {one_line(err)}", file=sys.stderr)
        return 2
    if quiet:
        return 0
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        from qdq.cli.summary import print_summary

        print_summary(result.report, str(result.out_dir))
    return 0


def _interrupted(prog: str, err: KeyboardInterrupt) -> int:
    """Ctrl-C (exit 130) or SIGTERM (143): the staging folder is already removed."""
    from qdq.pipeline.outdir import Terminated

    if isinstance(err, Terminated):
        print(f"{prog}: terminated (SIGTERM); nothing written", file=sys.stderr)
        return 143
    print(f"{prog}: interrupted; nothing written", file=sys.stderr)
    return 130


def check_paths(args: argparse.Namespace) -> None:
    """The paths of the arguments, before anything is loaded: every name valid UTF-8 (ONNX
    Runtime and report.json need it), ``--data`` there and readable (or a built-in dataset),
    ``--out`` writable and, without ``--overwrite``, empty.

    Raises:
        ValueError / FileNotFoundError / FileExistsError / PermissionError: naming the argument.
    """
    import os
    from pathlib import Path

    from qdq.pipeline.data import DATASETS
    from qdq.pipeline.outdir import check_name, check_out_dir

    for flag, value in sorted(vars(args).items()):
        if isinstance(value, str):
            check_name(value, f"--{flag.replace('_', '-')}")
    data = args.data
    if data is not None and data not in DATASETS:
        path = Path(data)
        if not path.exists() and ("/" in data or "\\" in data or path.suffix):
            raise FileNotFoundError(f"--data: no data file at {data}")
        if not path.exists():
            raise ValueError(
                f"--data: unknown dataset {data!r}; built-in datasets: "
                f"{', '.join(sorted(DATASETS))}; or give an image folder, a .npy or a .npz file"
            )
        if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            raise PermissionError(f"--data {data}: not readable (permission denied)")
    check_out_dir(Path(args.out), args.overwrite)


def run_zoo(action: str) -> int:
    """``qdq zoo list``."""
    from qdq.zoo.registry import MODELS, get_dataset

    if action != "list":
        raise ValueError(f"unknown zoo action {action!r}; use: qdq zoo list")
    for entry in MODELS.values():
        missing = entry.missing()
        status = "available" if not missing else "missing: " + "; ".join(missing)
        task_metric = get_dataset(entry.dataset).metric
        key = "" if task_metric is None else f" (metric_name {task_metric.name})"
        print(
            f"{entry.name}\n  {entry.description}\n  task: {entry.task}\n"
            f"  data: {entry.dataset}; metric: {entry.metric}{key}\n  {status}"
        )
    return 0


def _ptq_options(args: argparse.Namespace) -> Any:
    """The PTQ switches or ``--recipe`` (not both: one would silently override the other) as
    :class:`qdq.pipeline.PtqOptions`; with neither, the recipe search
    (:class:`qdq.pipeline.SearchOptions`, ``--search-budget``)."""
    from qdq.pipeline import PtqOptions, SearchOptions

    switches = [
        name
        for name, on in (
            ("--equalize", args.equalize),
            ("--calib-per-quantizer", args.calib_per_quantizer),
            ("--rounding", args.rounding is not None),
            ("--bias-correction", args.bias_correction),
        )
        if on
    ]
    if args.recipe is not None and switches:
        raise ValueError(
            f"--recipe {args.recipe} and {', '.join(switches)} both set PTQ steps; give one"
        )
    if args.search_budget is not None and (args.recipe is not None or switches):
        given = f"--recipe {args.recipe}" if args.recipe is not None else ", ".join(switches)
        raise ValueError(
            f"--search-budget bounds the recipe search, but {given} gives the recipe (no "
            "search); give one"
        )
    if args.recipe is not None:
        return PtqOptions.from_recipe(args.recipe)
    if switches:
        return PtqOptions(
            equalize=args.equalize,
            method_per_quantizer=args.calib_per_quantizer,
            rounding=args.rounding or "nearest",
            bias_correction=args.bias_correction,
        )
    return SearchOptions(budget=args.search_budget)
