"""Token trees for speculation: the shape of a proposal and how the target verifies it in one pass.

Rows of a verification pass: row 0 is the pending token (the root), row 1+i is draft node i. A row
sits at position start + depth and attends to the prefix, its ancestors and itself (its *path*),
so after the accepted path is moved into place its KV entries are those plain decoding would
have written. A chain of K drafts is the tree whose node i has parent i-1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenTree:
    """The tree of one proposal: parents[i] is node i's parent (-1 = the root), parents first."""

    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        for i, p in enumerate(self.parents):
            assert -1 <= p < i, f"tree node {i} has parent {p}; parents must come before their children"

    @classmethod
    def chain(cls, n: int) -> TokenTree:
        return cls(tuple(range(-1, n - 1)))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def depths(self) -> list[int]:
        """Depth of every row (root 0, its children 1, ...), [num_nodes + 1]."""
        depth = [0]
        for p in self.parents:
            depth.append(depth[p + 1] + 1)
        return depth

    def row_paths(self) -> list[list[int]]:
        """For every row, the rows from the root down to it (inclusive): what it attends to."""
        paths = [[0]]
        for i, p in enumerate(self.parents):
            paths.append(paths[p + 1] + [i + 1])
        return paths

    def children(self) -> list[list[int]]:
        """For every row, the node indices of its children in proposal order, [num_nodes + 1]."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for i, p in enumerate(self.parents):
            kids[p + 1].append(i)
        return kids

    @property
    def max_depth(self) -> int:
        return max(self.depths())

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))
