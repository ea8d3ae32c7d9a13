"""Union-find over quantization points: which quantizers must share one scale."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

__all__ = ["UnionFind"]


class UnionFind:
    """Disjoint sets with path compression; the root of a set is its first-added member.

    Example:
        >>> uf = UnionFind(["a", "b", "c"])
        >>> uf.union("b", "c")
        >>> uf.find("c"), uf.groups()
        ('b', [['a'], ['b', 'c']])
    """

    def __init__(self, items: Iterable[Hashable] = ()) -> None:
        self._parent: dict[Hashable, Hashable] = {}
        self._order: dict[Hashable, int] = {}
        for item in items:
            self.add(item)

    def add(self, item: Hashable) -> None:
        """Add ``item`` as a singleton set (no-op if present)."""
        if item not in self._parent:
            self._parent[item] = item
            self._order[item] = len(self._order)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._parent

    def find(self, item: Hashable) -> Hashable:
        """Return the representative of ``item``'s set."""
        root = item
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[item] != root:
            self._parent[item], item = root, self._parent[item]
        return root

    def union(self, a: Hashable, b: Hashable) -> None:
        """Merge the sets of ``a`` and ``b``; the earlier-added root stays the root."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self._order[rb] < self._order[ra]:
            ra, rb = rb, ra
        self._parent[rb] = ra

    def groups(self) -> list[list[Hashable]]:
        """All sets, each in insertion order, ordered by their first member."""
        by_root: dict[Hashable, list[Hashable]] = {}
        for item in self._parent:
            by_root.setdefault(self.find(item), []).append(item)
        return sorted(by_root.values(), key=lambda g: self._order[g[0]])
