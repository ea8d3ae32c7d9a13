"""Lint findings as plain data: rule id, severity, nodes, message, predicted effect, fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ERROR", "INFO", "SEVERITIES", "WARN", "Finding", "exit_code"]

INFO, WARN, ERROR = "INFO", "WARN", "ERROR"
SEVERITIES = (INFO, WARN, ERROR)


@dataclass(frozen=True)
class Finding:
    """One rule violation (or note) about a Q/DQ ONNX graph.

    Attributes:
        rule: rule id from the TensorRT rule specification (``"V01"``, ``"P03a"`` ...).
        severity: ``"INFO"``, ``"WARN"`` or ``"ERROR"``.
        nodes: the ONNX node names involved.
        message: what is wrong, naming the nodes.
        effect: what TensorRT is predicted to do.
        fix: how to fix it.
        source: where the rule comes from.
    """

    rule: str
    severity: str
    nodes: tuple[str, ...]
    message: str
    effect: str = ""
    fix: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


def exit_code(findings: list[Finding] | tuple[Finding, ...]) -> int:
    """0 when clean (INFO only), 1 with warnings, 2 with errors."""
    severities = {f.severity for f in findings}
    if ERROR in severities:
        return 2
    return 1 if WARN in severities else 0
