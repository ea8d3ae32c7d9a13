"""Model files from others, checked before they are loaded: a ``.pt2`` archive, an ONNX model.

``torch.export.load`` runs code from a ``.pt2`` in four places (torch 2.14): it unpickles every
weight or constant marked ``use_pickle`` (and the torchbind/opaque objects among the constants),
it unpickles the sample inputs with a full unpickler when ``weights_only`` refuses them, it
``sympy.sympify``-s (``eval``-s) every symbolic shape expression of the graph, and
``ExportedProgram.module()`` ``exec``-s the program's ``guards_code``; an archive may also carry
AOTInductor shared libraries, which loading opens. A normal ``torch.export.save``-d program holds
its weights and constants as raw bytes (``use_pickle: false``), its sample inputs as tensors
(a pickle the ``weights_only`` loader reads), ``srepr`` expressions and comparisons of input
sizes as guards -- so :func:`check_pt2` refuses the rest before ``torch.export.load`` is called:

* an archive without ``archive_format`` (the pre-2.8 layout, made of pickles), AOTInductor code,
  legacy pickled weight files, any payload marked ``use_pickle``;
* sample inputs that ``torch.load(weights_only=True)`` cannot read (tensors and containers
  only: the check itself runs no code);
* a shape expression or guard that is not a plain arithmetic/comparison of sizes (checked on its
  Python syntax tree against a fixed list of names and functions);
* entries that declare more decoded bytes than :mod:`qdq._limits` allows.

``trust_model=True`` (``--trust-model``) skips these checks and loads the archive as
``torch.export.load`` does. :func:`load_onnx_checked` reads an ONNX model with its external
data checked first: every external tensor must hold exactly its declared size (onnx 1.23
itself refuses locations outside the model's folder, absolute paths and symbolic links, but
reads a whole external file when no length is given).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from qdq._limits import InputRefusedError, check_expansion, check_input_bytes

__all__ = ["check_pt2", "load_onnx_checked"]

#: most entries a .pt2 archive may hold
MAX_ENTRIES = 100_000
#: longest shape expression or guard read
_MAX_EXPR_CHARS = 10_000
_HINT = "pass --trust-model (trust_model=True) only if you trust whoever sent it"

#: sympy classes and torch's sympy functions a shape expression may call (srepr output)
_EXPR_CALLS = frozenset(
    {
        "Symbol",
        "Dummy",
        "Integer",
        "Float",
        "Rational",
        "Add",
        "Mul",
        "Pow",
        "Max",
        "Min",
        "Abs",
        "Mod",
        "floor",
        "ceiling",
        "Eq",
        "Ne",
        "Lt",
        "Le",
        "Gt",
        "Ge",
        "StrictLessThan",
        "StrictGreaterThan",
        "LessThan",
        "GreaterThan",
        "Equality",
        "Unequality",
        "And",
        "Or",
        "Not",
        "Piecewise",
        "ExprCondPair",
        "Tuple",
        "FloorDiv",
        "ModularIndexing",
        "Where",
        "PythonMod",
        "CleanDiv",
        "CeilToInt",
        "FloorToInt",
        "CeilDiv",
        "LShift",
        "RShift",
        "PowByNatural",
        "FloatPow",
        "FloatTrueDiv",
        "IntTrueDiv",
        "IsNonOverlappingAndDenseIndicator",
        "TruncToFloat",
        "TruncToInt",
        "RoundToInt",
        "RoundDecimal",
        "ToFloat",
        "Identity",
    }
)
#: functions whose second argument grows the result exponentially: it must stay small
_EXPONENTIAL = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RoundDecimal"})
_MAX_EXPONENT = 64
_EXPR_NAMES = frozenset({"oo", "zoo", "nan", "true", "false", "pi", "E", "inf"})
_SYMBOL_NAME = re.compile(r"[a-z]{1,4}[0-9]+")
_WORD = re.compile(r"[A-Za-z0-9_.+\-]*")
#: what a guard may use besides size arithmetic (the names torch's guard code is exec-ed with):
#: methods of an input (``L['x'].size()[0]``), ``torch.sym_*``, ``math`` functions, builtins
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_TORCH = frozenset(
    {"sym_max", "sym_min", "sym_float", "sym_int", "sym_not", "sym_ite", "sym_sqrt", "sym_sum"}
)
_MATH = frozenset({"isnan", "inf", "floor", "ceil", "trunc", "sqrt"})
_GUARD_NAMES = frozenset(
    {
        "L",
        "math",
        "torch",
        "int",
        "float",
        "bool",
        "abs",
        "round",
        "min",
        "max",
        "IsNonOverlappingAndDenseIndicator",
        "cast_symbool_to_symint_guardless",
    }
)
_OPERATORS = (
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
    ast.expr_context,
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.Tuple,
)


def check_pt2(fh: IO[bytes], where: str) -> None:
    """Refuse a ``.pt2`` archive whose loading would run code or exceed the input limits.

    Args:
        fh: the archive, open for reading (``torch.export.load`` then reads the same handle).
        where: the file's name, for messages.

    Raises:
        InputRefusedError: one line naming the file, the entry and what it holds.
    """
    try:
        zf = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, OSError) as err:
        raise InputRefusedError(
            f"{where} is not a torch.export archive (a zip file): {err}"
        ) from None
    try:
        with zf:
            _check_archive(zf, where)
    except InputRefusedError:
        raise
    except Exception as err:  # a corrupt entry (CRC, deflate, encoding): one line naming the file
        msg = " ".join(str(err).split())[:300] or type(err).__name__
        raise ValueError(f"cannot read {where} as a torch.export archive: {msg}") from None


def _check_archive(zf: zipfile.ZipFile, where: str) -> None:
    import torch

    infos = zf.infolist()
    if len(infos) > MAX_ENTRIES:
        raise InputRefusedError(
            f"{where} holds {len(infos)} entries; qdq reads at most {MAX_ENTRIES}"
        )
    for info in infos:
        check_expansion(info, info.file_size, where)
    check_input_bytes(sum(i.file_size for i in infos), where, f"{len(infos)} archive entries")
    roots = {name.split("/", 1)[0] if "/" in name else "" for name in zf.namelist()}
    if len(roots) != 1 or "" in roots:
        raise InputRefusedError(
            f"{where} is not one torch.export archive (entries outside one folder)"
        )
    entries = {name.split("/", 1)[1]: name for name in zf.namelist()}
    names = _names()
    if names["format"] not in entries:
        raise InputRefusedError(
            f"{where} has no {names['format']} entry: not an archive of torch.export.save "
            f"(torch >= 2.8); older layouts are pickles. Re-save it with torch.export.save, or "
            f"{_HINT}"
        )
    for entry in entries:
        if entry.startswith(names["aoti"]):
            raise InputRefusedError(
                f"{where} holds AOTInductor compiled code ({entry}), which loading would open; "
                f"{_HINT}"
            )
    # every entry under models/ is a program to torch (its name cut as below, whatever it ends with)
    prefix, suffix = names["model"].split("{}")
    for graph_entry in [e for e in entries if e.startswith(names["models"])]:
        model = graph_entry[len(prefix) : -len(suffix)]
        for kind in ("weights", "constants"):
            legacy = f"{names[kind]}{model}.pt"
            if legacy in entries:
                raise InputRefusedError(f"{where} holds pickled {kind} ({legacy}); {_HINT}")
            config = names[f"{kind}_config"].format(model)
            if config in entries:
                _check_payloads(_json(zf, entries[config], where, config), names[kind], where)
        sample = names["sample"].format(model)
        if sample in entries:
            _check_sample_inputs(torch, zf.read(entries[sample]), where, sample)
        _check_graph(_json(zf, entries[graph_entry], where, graph_entry), where, graph_entry)


def _names() -> dict[str, str]:
    """The archive's entry names (torch's constants when this torch has them)."""
    names = {
        "format": "archive_format",
        "aoti": "data/aotinductor/",
        "models": "models/",
        "model": "models/{}.json",
        "weights": "data/weights/",
        "constants": "data/constants/",
        "weights_config": "data/weights/{}_weights_config.json",
        "constants_config": "data/constants/{}_constants_config.json",
        "sample": "data/sample_inputs/{}.pt",
    }
    try:
        from torch.export.pt2_archive import constants as c
    except ImportError:  # pragma: no cover - older torch: the names above
        return names
    names.update(
        format=c.ARCHIVE_FORMAT_PATH,
        aoti=c.AOTINDUCTOR_DIR,
        models=c.MODELS_DIR,
        model=c.MODELS_FILENAME_FORMAT,
        weights=c.WEIGHTS_DIR,
        constants=c.CONSTANTS_DIR,
        weights_config=c.WEIGHTS_CONFIG_FILENAME_FORMAT,
        constants_config=c.CONSTANTS_CONFIG_FILENAME_FORMAT,
        sample=c.SAMPLE_INPUTS_FILENAME_FORMAT,
    )
    return names


def _json(zf: zipfile.ZipFile, name: str, where: str, entry: str) -> Any:
    try:
        return json.loads(zf.read(name))
    except (ValueError, RecursionError) as err:
        msg = " ".join(str(err).split())[:200] or type(err).__name__
        raise InputRefusedError(f"{where}: {entry} is not valid JSON ({msg})") from None


def _check_payloads(config: Any, directory: str, where: str) -> None:
    payloads = config.get("config") if isinstance(config, dict) else None
    if not isinstance(payloads, dict):
        raise InputRefusedError(f"{where}: its payload config in {directory} is malformed")
    for fqn, meta in payloads.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            path = meta.get("path_name") if isinstance(meta, dict) else None
            raise InputRefusedError(
                f"{where}: entry {directory}{path} ({fqn}) is a pickle, which loading would "
                f"unpickle (run); {_HINT}"
            )


def _check_sample_inputs(torch: Any, data: bytes, where: str, entry: str) -> None:
    if not data:
        return
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # weights_only refuses anything but tensors and containers
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        # torch's message: a paragraph on the weights_only default, then the refused global
        why = [ln for ln in lines if not ln.startswith(("Weights only load", "Check the doc"))]
        first = (why or lines or [type(err).__name__])[0][:200]
        raise InputRefusedError(
            f"{where}: its sample inputs ({entry}) are a pickle that only a full unpickler "
            f"reads, which would run it ({first}); {_HINT}"
        ) from None


def _check_graph(program: Any, where: str, entry: str) -> None:
    """Every shape expression and guard of a serialized program, as plain arithmetic."""
    if not isinstance(program, dict):
        raise InputRefusedError(f"{where}: {entry} is not a serialized ExportedProgram")
    guards = program.get("guards_code") or []
    if not isinstance(guards, list):
        raise InputRefusedError(f"{where}: {entry}: guards_code is not a list")
    for guard in guards:
        _check_code(guard, where, f"{entry}: guard", guard=True)
    for text in _expr_strings(program):
        _check_code(text, where, f"{entry}: shape expression", guard=False)


def _expr_strings(value: Any) -> Iterator[Any]:
    """Every value under an ``expr_str`` key (iteratively: the JSON may nest deeply)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                if key == "expr_str":
                    yield sub
                else:
                    stack.append(sub)
        elif isinstance(item, list):
            stack.extend(item)


def _check_code(text: Any, where: str, what: str, *, guard: bool) -> None:
    def refuse(reason: str) -> InputRefusedError:
        shown = repr(text)[:120]
        return InputRefusedError(
            f"{where}: {what} {shown} is not plain size arithmetic ({reason}); loading would "
            f"evaluate it as Python; {_HINT}"
        )

    if not isinstance(text, str):
        raise refuse("not a string")
    if len(text) > _MAX_EXPR_CHARS:
        raise refuse(f"over {_MAX_EXPR_CHARS} characters")
    if guard and any(c in text for c in '#;\\"\n\r'):
        raise refuse("a comment, statement separator, escape, double quote or line break")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise refuse("not an expression") from None
    try:
        problem = _problem(tree, guard)
    except RecursionError:
        problem = "nested too deeply"
    if problem:
        raise refuse(problem)


def _problem(tree: ast.AST, guard: bool) -> str | None:
    """Why ``tree`` is not a plain expression of sizes, or ``None``."""
    for node in ast.walk(tree):
        if not guard and isinstance(node, ast.BitXor):  # sympify reads ^ as ** (srepr never
            return "^"  # writes it): 10^10^10 would be 10**(10**10), which never finishes
        exponent = isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift))
        if exponent and _large(node.right):  # type: ignore[attr-defined]
            return f"an exponent over {_MAX_EXPONENT}"
        if isinstance(node, (*_OPERATORS, ast.keyword)):
            continue
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str) and not _WORD.fullmatch(value):
                return f"the string {value[:40]!r}"
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                return f"the constant {type(value).__name__}"
            continue
        if isinstance(node, ast.Name):
            if _allowed_name(node.id, guard):
                continue
            return f"the name {node.id!r}"
        if isinstance(node, ast.Call):
            reason = _call_problem(node, guard)
            if reason:
                return reason
            continue
        if guard and isinstance(node, ast.Subscript):
            continue  # L['x'], .size()[0]: its value and slice are checked as nodes
        if guard and isinstance(node, ast.Attribute):
            root = node.value.id if isinstance(node.value, ast.Name) else None
            allowed = {"math": _MATH, "torch": _TORCH}.get(root or "", _GUARD_METHODS)
            if node.attr in allowed:
                continue
            return f"the attribute {root or ''}.{node.attr}"
        return f"the syntax {type(node).__name__}"
    return None


def _allowed_name(name: str, guard: bool) -> bool:
    if name in _EXPR_NAMES or name in _EXPR_CALLS or _SYMBOL_NAME.fullmatch(name):
        return True
    return guard and name in _GUARD_NAMES


def _call_problem(node: ast.Call, guard: bool) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        if func.id not in _EXPR_CALLS and not (guard and func.id in _GUARD_NAMES):
            return f"a call of {func.id!r}"
        name = func.id
    elif guard and isinstance(func, ast.Attribute):
        name = func.attr  # the attribute itself is checked as a node
    else:
        return "a call"
    if any(k.arg is None for k in node.keywords):
        return "a ** argument"
    if any(isinstance(a, ast.Starred) for a in node.args):
        return "a * argument"
    if name in _EXPONENTIAL and len(node.args) > 1 and _large(node.args[1]):
        return f"a {name} exponent over {_MAX_EXPONENT}"
    return None


def _large(node: ast.AST) -> bool:
    """Whether an exponent holds an integer past :data:`_MAX_EXPONENT`."""
    for sub in ast.walk(node):
        value = sub.value if isinstance(sub, ast.Constant) else None
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(value, (int, float)) and abs(value) > _MAX_EXPONENT:
            return True
    return False


def load_onnx_checked(path: Path) -> Any:
    """``onnx.load(path)`` with every external tensor checked before its data is read
    (:func:`qdq.lint.external.load_external_data`: confined to the model's folder, each record
    the size its shape and type need), and their total within :func:`qdq._limits.check_input_bytes`.

    Raises:
        InputRefusedError: an external tensor outside the model's folder, of another size than
            its declared shape and type, or data past the input limit, naming the tensor and file.
        ValueError: an unreadable model, naming the file.
    """
    import onnx

    from qdq.lint.external import external_tensors, load_external_data, tensor_nbytes

    where = str(path)
    try:
        model = onnx.load(where, load_external_data=False)
    except Exception as err:
        raise ValueError(
            f"cannot read the ONNX model {where}: {' '.join(str(err).split())}"
        ) from None
    total = 0
    for tensor in external_tensors(model):
        with contextlib.suppress(ValueError):  # a size that cannot be known: refused below
            total += tensor_nbytes(tensor)
    check_input_bytes(total, where, "its external data")
    try:
        load_external_data(model, path)
    except ValueError as err:
        raise InputRefusedError(f"{where}: {err}") from None
    return model
