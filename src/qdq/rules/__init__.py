"""TensorRT placement rules as data, and scale-sharing groups."""

from __future__ import annotations

from qdq.rules.sharing import UnionFind
from qdq.rules.tensorrt import FAMILIES, RULES, Rule, explain, rule

__all__ = ["FAMILIES", "RULES", "Rule", "UnionFind", "explain", "rule"]
