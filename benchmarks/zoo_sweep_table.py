"""The zoo sweep's table and summary (``benchmarks/zoo_sweep.py``): one line per row and the counts
against issue 34's aims, from the rows' JSON."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import real_models

PLACEMENT_RULES = ("P03a", "P03d", "P04", "S02b", "S03")
PARITY_MIN_COSINE = 0.999  # as tests/test_zoo_parity.py
GRAPH_PATH = "recorded"  # plan.capture of the graph path ("replacement" is the fallback)

Row = dict[str, Any]


def _exports(row: Row) -> dict[str, Row]:
    return {e: row.get("export", {}).get(e, {}) for e in real_models.EXPORTERS}


def parity_state(cell: Row) -> str:
    """``ok``, ``bad``, ``n/c`` (detections after NMS), ``FAIL`` (parity raised) or ``-``."""
    par = cell.get("parity", {})
    if not par:
        return "-"
    if not par.get("ok"):
        return "FAIL"
    if "size_differs" in par or par.get("ranked"):
        return "n/c"
    return "ok" if par.get("min_cosine", 0) >= PARITY_MIN_COSINE else "bad"


def warns(row: Row, rules: tuple[str, ...] | None = None) -> Counter[str]:
    """Per WARN rule (of ``rules``; default all), its most findings over the two exports."""
    out: Counter[str] = Counter()
    for cell in _exports(row).values():
        for rule, count in cell.get("lint", {}).get("warn_rules", {}).items():
            if rules is None or rule in rules:
                out[rule] = max(out[rule], count)
    return out


def failure(row: Row) -> str | None:
    """Why a row did not run through (its status, or the first failed step's error), or None."""
    if row.get("status") != "ok":
        return str(row.get("status"))
    for step in ("build", "prepare", "calibrate"):
        if not row.get(step, {}).get("ok"):
            return f"{step}: {row.get(step, {}).get('error', 'not reached')}"
    for exporter, cell in _exports(row).items():
        for part in ("export", "parity", "lint"):
            c = cell if part == "export" else cell.get(part)
            if c is not None and not c.get("ok"):
                return f"{part}[{exporter}]: {c.get('error', 'not reached')}"
    return None


def outcome(row: Row) -> str:
    """``ok``, ``skipped``, ``timeout``, ``crashed`` or ``failed: STEP``."""
    why = failure(row)
    if why is None:
        return "ok"
    head = re.split(r"[ :(\[]", why, maxsplit=1)[0]
    return head if head in ("skipped", "timeout", "crashed") else f"failed: {head}"


def _pair(row: Row, get: Callable[[Row], Any]) -> str:
    """``get`` of the dynamo and the torchscript export cells as ``a/b`` (``-`` where absent)."""
    values = (get(c) if c else None for c in _exports(row).values())
    return "/".join("-" if v is None else str(v) for v in values)


def _lint(key: str, whole: str | None = None) -> Callable[[Row], Any]:
    """A getter of lint value ``key`` of an export cell (``key:whole`` with ``whole``)."""

    def get(cell: Row) -> Any:
        lint = cell.get("lint", {})
        if whole is None or key not in lint or whole not in lint:
            return lint.get(key) if whole is None else None
        return f"{lint[key]}:{lint[whole]}"

    return get


def _unfused(row: Row) -> int:
    return max(c.get("lint", {}).get("unfused_qdq") or 0 for c in _exports(row).values())


def render_table(rows: list[Row]) -> str:
    """One line per row; ``a/b`` cells are dynamo/torchscript."""
    width = max([len(r["name"]) for r in rows] + [4])
    head = (
        f"{'row':<{width}} {'kind':<11} {'capture':<11} {'prep s':>6} {'export':<9} "
        f"{'parity':<9} {'lint':<11} {'place':>5} {'unfused':<7} {'islands':<7} "
        f"{'INT8 FLOP%':<10} {'GEMM int8':<11} {'fold:P14':<9} {'attn int8':<9} {'total s':>7}"
        "  outcome"
    )
    out = [head, "-" * len(head)]
    for r in rows:
        prep = r.get("prepare", {})
        out.append(
            f"{r['name']:<{width}} {r.get('kind', '-'):<11} {prep.get('capture', '-'):<11} "
            f"{real_models._num(prep.get('seconds'), '.1f'):>6} "
            f"{_pair(r, real_models._cell):<9} {_pair(r, parity_state):<9} "
            f"{_pair(r, _lint('verdict')):<11} {sum(warns(r, PLACEMENT_RULES).values()):>5} "
            f"{_pair(r, _lint('unfused_qdq')):<7} {_pair(r, _lint('float_islands')):<7} "
            f"{_pair(r, _lint('int8_flops_percent')):<10} "
            f"{_pair(r, _lint('gemms_int8', 'gemms')):<11} "
            f"{_pair(r, _lint('gemms_folded', 'gemms_small')):<9} "
            f"{_pair(r, _lint('attention_int8', 'attention_matmuls')):<9} "
            f"{real_models._num(r.get('total_seconds'), '.1f'):>7}  {outcome(r)}"
        )
    return "\n".join(out) + (
        "\n\na/b: dynamo/torchscript. place: WARN findings P03a/P03d/P04/S02b/S03 (the most of the"
        "\ntwo exports). GEMM / attn int8: weighted MatMul/Gemm / MatMuls of two activations"
        "\npredicted INT8 : all; a MatMul/Gemm whose input is computed from constants and shapes"
        "\nonly is folded at build time and no GEMM. fold:P14: those folded : the float GEMMs with"
        "\nK or N < 16 (kept float by rule P14: no INT8 tensor-core kernel)."
        f"\nparity ok: cosine >= {PARITY_MIN_COSINE}; n/c: NMS-ranked outputs."
    )


def render_summary(rows: list[Row]) -> str:
    """Counts per outcome against the issue's aims, and the worst 10 rows with why."""
    ran = [r for r in rows if outcome(r) != "skipped"]
    out = [f"## summary: {len(rows)} rows, {len(ran)} run, {len(rows) - len(ran)} skipped", ""]
    out.append("outcome: " + _counts(outcome(r) for r in rows))
    out.append("capture path: " + _counts(r.get("prepare", {}).get("capture", "none") for r in ran))
    for e in real_models.EXPORTERS:
        cells = [c for r in ran if (c := r.get("export", {}).get(e, {})).get("ok")]
        verdicts = _counts(c["lint"].get("verdict", "crashed") for c in cells)
        parity = _counts(parity_state(c) for c in cells)
        out.append(f"[{e}] export ok {len(cells)}/{len(ran)}; parity {parity}; lint {verdicts}")
    graph = [r for r in ran if r.get("prepare", {}).get("capture") == GRAPH_PATH]
    both = sum(all(c.get("ok") for c in _exports(r).values()) for r in graph)
    out.append(f"graph path and both exports ok: {_share(both, len(ran))} (aim >= 98 %)")
    raised = _names(ran, lambda c: c.get("ok") and not c["lint"].get("ok"))
    l00 = _names(ran, lambda c: "L00" in c.get("lint", {}).get("error_rules", []))
    out.append(f"linter crashes (aim: none): lint raised in {raised}; L00 findings in {l00}")
    warned = [r for r in ran if warns(r, PLACEMENT_RULES)]
    per_rule = _counts(rule for r in warned for rule in warns(r, PLACEMENT_RULES))
    out.append(f"rows with a placement warning: {len(warned)} (rows per rule: {per_rule})")
    conv = [r for r in ran if r.get("kind") == "conv"]
    clean = sum(r not in warned for r in conv)
    out.append(f"convolutional rows free of them: {_share(clean, len(conv))} (aim >= 95 %)")
    tf = [r for r in ran if r.get("kind") == "transformer"]
    for what, key, whole in (
        ("weighted GEMM", "gemms_int8", "gemms"),
        ("attention MatMul", "attention_int8", "attention_matmuls"),
    ):
        short = [r["name"] for r in tf if not _all_int8(r, key, whole)]
        out.append(
            f"transformer rows with every {what} INT8: {len(tf) - len(short)}/{len(tf)} "
            f"(aim: all); not: {', '.join(short) or '-'}"
        )
        if key == "gemms_int8":  # the rows short only of GEMMs too small for INT8 kernels
            small = [n for n in short if _all_int8(_row(rows, n), key, whole, "gemms_small")]
            out.append(f"  of those, float only where K or N < 16 (P14): {', '.join(small) or '-'}")
    out += ["", "## worst 10 rows (failures, then placement warnings, then unfused Q/DQ)", ""]
    for r in sorted(ran, key=_badness, reverse=True)[:10]:
        rules = ", ".join(f"{k}x{v}" for k, v in sorted(warns(r).items())) or "-"
        out.append(
            f"{r['name']}: {failure(r) or 'WARN rules ' + rules}; unfused Q/DQ {_unfused(r)}"
        )
    return "\n".join(out)


def _names(rows: list[Row], pred: Callable[[Row], Any]) -> str:
    """The rows with an export cell for which ``pred`` holds, or ``-``."""
    return ", ".join(r["name"] for r in rows if any(pred(c) for c in _exports(r).values())) or "-"


def _all_int8(row: Row, key: str, whole: str, excused: str | None = None) -> bool:
    """Every ``whole`` of each linted export is ``key`` (INT8), but for ``excused`` ones."""
    cells = [c["lint"] for c in _exports(row).values() if whole in c.get("lint", {})]
    return bool(cells) and all(
        c.get(key, 0) + (c.get(excused, 0) if excused else 0) == c[whole] for c in cells
    )


def _row(rows: list[Row], name: str) -> Row:
    return next(r for r in rows if r["name"] == name)


def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} = {100 * part / (whole or 1):.1f} %"


def _badness(row: Row) -> tuple[bool, int, int]:
    return (failure(row) is not None, sum(warns(row, PLACEMENT_RULES).values()), _unfused(row))


def _counts(values: Any) -> str:
    return ", ".join(f"{k} {v}" for k, v in Counter(values).most_common()) or "-"


def render_comparison(before: list[Row], after: list[Row]) -> str:
    """Rows in both runs, side by side: outcome, lint verdicts, placement warnings, unfused Q/DQ
    and INT8 FLOP share (``a/b``: dynamo/torchscript), each row ``better``, ``worse``, ``same``
    or ``mixed``, then the counts and the convolutional rows free of placement warnings."""
    old = {r["name"]: r for r in before}
    both = [(old[r["name"]], r) for r in after if r["name"] in old]
    if not both:
        return "no row in both runs"
    width = max(len(a["name"]) for _, a in both)
    head = (
        f"{'row':<{width}} {'outcome':<18} {'lint':<21} {'place':<9} {'unfused':<15} "
        f"{'INT8 FLOP%':<17} change"
    )
    out, verdicts = [head, "-" * len(head)], Counter()
    free = [0, 0]
    conv = 0
    for b, a in both:
        figures = [
            (sum(warns(r, PLACEMENT_RULES).values()), _unfused(r), _flops(r)) for r in (b, a)
        ]
        (pb, ub, fb), (pa, ua, fa) = figures
        better = (pa < pb, ua < ub, fa > fb)
        worse = (pa > pb, ua > ub, fa < fb)
        change = (
            "mixed" if any(better) and any(worse)
            else "better" if any(better)
            else "worse" if any(worse) or outcome(a) != outcome(b)
            else "same"
        )  # fmt: skip
        verdicts[change] += 1
        if a.get("kind") == "conv" and outcome(a) == "ok":
            conv += 1
            free[0] += pb == 0
            free[1] += pa == 0
        out.append(
            f"{a['name']:<{width}} {outcome(b) + ' > ' + outcome(a):<18} "
            f"{_pair(b, _lint('verdict')) + ' > ' + _pair(a, _lint('verdict')):<21} "
            f"{f'{pb} > {pa}':<9} "
            f"{_pair(b, _lint('unfused_qdq')) + ' > ' + _pair(a, _lint('unfused_qdq')):<15} "
            f"{_pair(b, _lint('int8_flops_percent')) + ' > ' + _pair(a, _lint('int8_flops_percent')):<17} "
            f"{change}"
        )
    out += [
        "",
        f"{len(both)} rows in both runs: {_counts(verdicts.elements())}",
        f"convolutional rows free of {'/'.join(PLACEMENT_RULES)}: {free[0]}/{conv} before, "
        f"{free[1]}/{conv} after",
        "place: WARN findings of those rules (the most of the two exports); unfused Q/DQ and "
        "INT8 FLOP% compared at their worst export.",
    ]
    return "\n".join(out)


def _flops(row: Row) -> int:
    values = [c.get("lint", {}).get("int8_flops_percent") for c in _exports(row).values()]
    return min((v for v in values if v is not None), default=0)
