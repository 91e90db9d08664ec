"""Tie clusters: which candidates' speeds lie within each other's noise (runner/resolve.py ranks by them).

Two numbers are tied when their middle halves (median ± noise) overlap (`cache.records.tied`). A cluster is the
fastest remaining candidate and everything still remaining that is tied with it; then the next cluster from what is
left. An index may hold 10^5 entries, so this is O(n log n) and the members of a cluster share one `Tie`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class Tie:
    """The candidates within each other's noise, shared by all of them (each holding a list of all the others would
    be quadratic in memory)."""

    members: list


def clusters(items: Sequence[T], median: Callable[[T], float], noise: Callable[[T], float]) -> list[list[T]]:
    """`items` in clusters, fastest first; each cluster by median (equal medians in `items`' order).

    c is tied with the leader L (the smaller median) when median(c) - noise(c) <= median(L) + noise(L), so a cluster is
    the remaining items whose lower edge is at most the leader's upper edge. Sorted once by median (for leaders) and
    once by lower edge (for members), each item is looked at a bounded number of times, where comparing every
    remaining item with each leader was quadratic. `noise` must be >= 0 (a leader is then in its own cluster)."""
    medians = [median(item) for item in items]
    noises = [noise(item) for item in items]
    by_median = sorted(range(len(items)), key=lambda i: medians[i])
    lower = [m - n for m, n in zip(medians, noises, strict=True)]
    by_lower = sorted(range(len(items)), key=lambda i: lower[i])
    taken = [False] * len(items)
    found: list[list[T]] = []
    next_leader = next_member = 0
    while next_member < len(by_lower):
        while taken[by_median[next_leader]]:
            next_leader += 1
        leader = by_median[next_leader]
        upper = medians[leader] + noises[leader]
        group = []
        # Everything before next_member is taken; what follows it in lower-edge order up to `upper` is the cluster,
        # and the leader is among it (its lower edge is at most its upper one).
        while next_member < len(by_lower) and lower[by_lower[next_member]] <= upper:
            group.append(by_lower[next_member])
            taken[by_lower[next_member]] = True
            next_member += 1
        group.sort(key=lambda i: (medians[i], i))
        found.append([items[i] for i in group])
    return found
