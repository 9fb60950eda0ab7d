"""The junction tree of a set of cliques, in plain Python: what ``aim``'s estimator calibrates,
its sampler walks and its model-size limit measures.

Private-PGM's construction (``mbi.junction_tree``, McKenna et al. 2019): a greedy elimination
order (each step eliminates the attribute whose neighbourhood has the fewest cells), the
elimination cliques of that order (the maximal cliques of the triangulated graph), joined by a
maximum-weight spanning tree on the sizes of their intersections (Kruskal), which has the
running-intersection property. No jax and no networkx: a fresh process builds it in
microseconds, and everything it computes is public (attribute names and domain sizes).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

Clique = tuple[str, ...]


@dataclass(frozen=True)
class JunctionTree:
    """Maximal cliques (attributes in domain order), tree edges, and the elimination order."""

    nodes: tuple[Clique, ...]
    edges: tuple[tuple[int, int], ...]
    elimination: tuple[str, ...]

    def cells(self, sizes: dict[str, int]) -> int:
        return sum(prod(sizes[a] for a in node) for node in self.nodes)


def greedy_order(sizes: dict[str, int], cliques: list[frozenset[str]]) -> list[str]:
    """mbi's greedy elimination order: repeatedly the attribute whose cliques' union has the
    fewest cells (ties: the first in domain order)."""
    remaining = list(sizes)
    current = set(cliques)
    order = []
    while remaining:
        best = min(remaining, key=lambda a, now=frozenset(current): _joined_cells(a, now, sizes))
        order.append(best)
        remaining.remove(best)
        touching = [cl for cl in current if best in cl]
        current -= set(touching)
        current.add(frozenset(set().union(*touching) - {best}) if touching else frozenset())
        current.discard(frozenset())
    return order


def _joined_cells(attribute: str, cliques: frozenset[frozenset[str]], sizes: dict[str, int]) -> int:
    return prod(sizes[a] for a in set().union(*[cl for cl in cliques if attribute in cl]))


@lru_cache(maxsize=1024)  # model-size checks ask for the same trees many times a round
def make_junction_tree(names: tuple[str, ...], shape: tuple[int, ...],
                       cliques: tuple[Clique, ...]) -> JunctionTree:
    """The junction tree of ``cliques`` over the domain ``names`` x ``shape`` (every attribute
    is in some node: an attribute in no clique is a node of its own)."""
    sizes = dict(zip(names, shape, strict=True))
    neighbours: dict[str, set[str]] = {a: set() for a in names}
    for clique in cliques:
        for a in clique:
            neighbours[a] |= set(clique) - {a}
    order = greedy_order(sizes, [frozenset(cl) for cl in cliques if cl])
    # eliminate in that order on the (growing) graph: each step's clique is the attribute and
    # its neighbours left; the maximal ones are the triangulated graph's maximal cliques
    graph = {a: set(n) for a, n in neighbours.items()}
    found: list[frozenset[str]] = []
    for attribute in order:
        near = graph.pop(attribute)
        for a in near:
            graph[a] |= near - {a}
            graph[a].discard(attribute)
        found.append(frozenset(near | {attribute}))
    maximal = [c for c in set(found) if not any(c < other for other in found)]
    nodes = sorted(tuple(a for a in names if a in c) for c in maximal)
    edges = _max_spanning_tree(nodes)
    return JunctionTree(tuple(nodes), tuple(edges), tuple(order))


def _max_spanning_tree(nodes: list[Clique]) -> list[tuple[int, int]]:
    """Kruskal on the intersection sizes (only intersecting pairs are joined; disconnected parts
    stay separate trees, as mbi's spanning forest)."""
    pairs = sorted(((len(set(a) & set(b)), i, j) for i, a in enumerate(nodes)
                    for j, b in enumerate(nodes) if i < j and set(a) & set(b)),
                   key=lambda t: (-t[0], t[1], t[2]))
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    edges = []
    for _, i, j in pairs:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[ri] = rj
            edges.append((i, j))
    return edges


def model_size_mb(names: tuple[str, ...], shape: tuple[int, ...],
                  cliques: list[Clique]) -> float:
    """AIM's model size: the junction tree's cells in float64, in MB (2**20 bytes)."""
    tree = make_junction_tree(names, shape, tuple(tuple(c) for c in cliques))
    return tree.cells(dict(zip(names, shape, strict=True))) * 8 / 2**20
