"""Which pairs to evaluate at each hop, and how to batch them (synchronous, pure).

Pairs are selected once (all pairs, an explicit list, or groups x groups). At
every hop the scheduler hands out at most ``max_pairs_per_hop`` pairs, the
stalest first, so that when compute cannot keep up every pair is still refreshed
in turn and the age of each cell is known instead of growing without bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from .errors import ConfigError

__all__ = ["PairSelection", "Scheduler"]


@dataclass(frozen=True)
class PairSelection:
    """all=True for every unordered pair; else explicit `pairs`, or `groups` crossed with `groups_with`."""

    all: bool = True
    pairs: tuple[tuple[str, str], ...] = ()
    groups: tuple[str, ...] = ()
    groups_with: tuple[str, ...] = ()

    def resolve(self, channels: Sequence[str]) -> np.ndarray:
        """Index pairs (P, 2) with i < j into `channels`, sorted, without duplicates."""
        index = {c: k for k, c in enumerate(channels)}

        def idx(name: str) -> int:
            if name not in index:
                raise ConfigError(f"pair names unknown channel {name!r}; known channels: {', '.join(channels)}")
            return index[name]

        if self.pairs:
            raw = [(idx(a), idx(b)) for a, b in self.pairs]
        elif self.groups:
            raw = [(idx(a), idx(b)) for a in self.groups for b in (self.groups_with or self.groups)]
        else:
            raw = list(combinations(range(len(channels)), 2))
        out = sorted({(min(a, b), max(a, b)) for a, b in raw if a != b})
        return np.array(out, dtype=np.int64).reshape(-1, 2)


@dataclass
class Scheduler:
    """Hands out pairs stalest-first, at most max_pairs_per_hop per hop, and tracks each pair's last refresh."""

    pairs: np.ndarray  # (P, 2) channel indices
    max_pairs_per_hop: int
    last_refresh_ns: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.max_pairs_per_hop < 1:
            raise ConfigError(f"max_pairs_per_hop must be >= 1; got {self.max_pairs_per_hop}")
        self.last_refresh_ns = np.full(len(self.pairs), -1, dtype=np.int64)  # -1: never

    def next_pairs(self) -> np.ndarray:
        """Indices into `pairs` to evaluate this hop: never-refreshed first, then oldest; stable by index."""
        order = np.argsort(self.last_refresh_ns, kind="stable")
        return order[: self.max_pairs_per_hop]

    def mark_refreshed(self, pair_idx: np.ndarray, t_ns: int) -> None:
        self.last_refresh_ns[pair_idx] = t_ns

    def ages_s(self, now_ns: int) -> np.ndarray:
        """Seconds since each pair was refreshed; inf where never."""
        ages = (now_ns - self.last_refresh_ns) / 1e9
        return np.where(self.last_refresh_ns < 0, np.inf, ages)
