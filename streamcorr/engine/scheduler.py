"""Which pairs get a network estimate at each hop (synchronous, pure).

Pairs are selected once (all pairs, an explicit list, or groups x groups). Two ways to spend a hop:

- Without screening (``next_pairs``): at most ``max_pairs_per_hop`` pairs, the stalest first, so that when
  compute cannot keep up every pair is still refreshed in turn and each cell's age is known.
- With screening (``plan``): every pair has been assessed by the cheap screen statistic, and the network
  runs on, in this order of priority, (1) *hot* pairs: the last network estimate was >= ``min_effect`` or
  the change detector holds the pair dependent, (2) pairs that passed the screen, strongest first, and
  (3) a rotating share of the rest, stalest first: ceil(P * hop / max_age) pairs per hop plus any pair whose
  network estimate would otherwise be older than ``max_age`` at the next hop. Hot pairs are always
  evaluated (where most pairs are dependent, screening cannot save work, and the network does what it would
  do without it), up to a hard ``cap`` if one is given. Passing pairs fill what the hot pairs leave of the
  budget, but never less than ``PASSING_SHARE`` of it, so that new dependence is not starved by a large hot
  set; pairs the network saw at the previous hop go after the rest (their window has barely moved). Short
  windows make the screen pass many independent pairs (it keeps 99% of pairs at ``min_effect``): the budget
  then bounds the hop, and ``deferred`` counts the passing pairs that waited. So every pair gets a full
  estimate at least every ``max_age`` as long as the rotation fits what the hot and passing pairs leave of
  the budget; when it does not, the stalest pairs wait and ``overdue`` counts them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from ..config import HOP_BUDGET, MAX_AGE_S, SCREENING
from ..errors import ConfigError

# MAX_AGE_S: the screen assesses every pair each hop, so the age bound is a backstop for dependence it cannot see:
# at 256 channels and a 1-s hop, 120 s costs 272 network pairs per hop (60 s would cost 544, more than the 330
# dependent pairs of a 1% graph)
__all__ = ["HOP_BUDGET", "MAX_AGE_S", "SCREENING", "PairSelection", "Scheduler"]

PASSING_SHARE = 0.5  # of the budget, kept for pairs that pass the screen however many pairs are hot


@dataclass(frozen=True)
class PairSelection:
    """Explicit `pairs`, or `groups` crossed with `groups_with` (with itself when empty); neither: every
    unordered pair."""

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
    """Per-pair network refresh times and last estimates; picks each hop's pairs (stalest-first or screened).

    >>> sched = Scheduler(np.array([[0, 1], [0, 2], [1, 2]]), max_pairs_per_hop=2)
    >>> sched.next_pairs().tolist()  # never refreshed first, stable by index
    [0, 1]
    >>> sched.mark_refreshed(np.array([0, 1]), 10**9, np.array([0.5, 0.0]))
    >>> sched.plan(passed=np.array([False, False, False]), stat=np.zeros(3), now_ns=2 * 10**9,
    ...            hop_ns=10**9, max_age_ns=60 * 10**9).tolist()  # hot pair 0, then the stalest (2)
    [0, 2]
    """

    pairs: np.ndarray  # (P, 2) channel indices
    max_pairs_per_hop: int
    min_effect: float = 0.1  # nats: a last network estimate at or above this keeps the pair hot
    last_refresh_ns: np.ndarray = field(init=False)  # (P,) stream time of the last network estimate; -1: never
    last_mi: np.ndarray = field(init=False)  # (P,) the last network estimate, nats; NaN: never
    held_dependent: np.ndarray = field(init=False)  # (P,) the change detector holds the pair dependent
    first_planned_ns: np.ndarray = field(init=False)  # (P,) when plan() first saw the pair: a new pair's age base
    overdue: int = 0  # pairs that were due for rotation but did not fit the budget, summed over hops
    deferred: int = 0  # pairs that passed the screen but did not fit the budget, summed over hops
    last_overdue: int = 0  # the same, of the last plan() alone
    last_deferred: int = 0

    def __post_init__(self) -> None:
        if self.max_pairs_per_hop < 1:
            raise ConfigError(f"max_pairs_per_hop must be >= 1; got {self.max_pairs_per_hop}")
        n = len(self.pairs)
        self.last_refresh_ns = np.full(n, -1, dtype=np.int64)
        self.last_mi = np.full(n, np.nan)
        self.held_dependent = np.zeros(n, dtype=bool)
        self.first_planned_ns = np.full(n, -1, dtype=np.int64)

    def adopt(self, prev: Scheduler, new_idx: np.ndarray, old_idx: np.ndarray) -> None:
        """Carry pairs' state over from the scheduler of the previous channel set: pair ``old_idx[k]`` of
        ``prev`` is pair ``new_idx[k]`` here (channels came or went)."""
        self.last_refresh_ns[new_idx] = prev.last_refresh_ns[old_idx]
        self.last_mi[new_idx] = prev.last_mi[old_idx]
        self.held_dependent[new_idx] = prev.held_dependent[old_idx]

    def next_pairs(self) -> np.ndarray:
        """Indices into `pairs` to evaluate this hop: never-refreshed first, then oldest; stable by index."""
        order = np.argsort(self.last_refresh_ns, kind="stable")
        return order[: self.max_pairs_per_hop]

    def hot(self) -> np.ndarray:
        """(P,) pairs whose last network estimate is >= min_effect or that the detector holds dependent."""
        with np.errstate(invalid="ignore"):
            return (self.last_mi >= self.min_effect) | self.held_dependent

    def plan(
        self,
        passed: np.ndarray,
        stat: np.ndarray,
        now_ns: int,
        hop_ns: int,
        max_age_ns: int,
        budget: int | None = None,
        eligible: np.ndarray | None = None,
        cap: int | None = None,
    ) -> np.ndarray:
        """Indices into `pairs` for the network this hop, in priority order (see the module docstring).

        passed (P,): the pair passed the screen; stat (P,): its screen statistic (orders passing pairs);
        eligible (P,): pairs that may be picked at all (default: every pair); budget: network pairs the hop
        allows, which the passing pairs and then the rotation fill after the hot pairs (default
        ``max_pairs_per_hop``); cap: at most this many in all.
        """
        n = len(self.pairs)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if hop_ns <= 0 or max_age_ns <= 0:
            raise ConfigError(f"hop and max_age must be > 0 ns; got {hop_ns} and {max_age_ns}")
        budget = self.max_pairs_per_hop if budget is None else max(1, budget)
        ok = np.ones(n, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
        hot = self.hot() & ok
        new = np.asarray(passed, dtype=bool) & ok & ~hot
        first = np.flatnonzero(hot)
        second = np.flatnonzero(new)
        seen = self.last_refresh_ns[second] >= now_ns - hop_ns  # the network saw (nearly) this window last hop
        second = second[np.lexsort((-np.asarray(stat)[second], seen))]  # unseen first, strongest first within
        room = max(0, budget - len(first))
        take = min(len(second), max(room, math.ceil(PASSING_SHARE * budget)))
        self.last_deferred = len(second) - take
        self.deferred += self.last_deferred
        second = second[:take]
        rest = np.flatnonzero(ok & ~hot & ~new)
        # rotation: stalest first (never-refreshed first of all), a steady share plus whatever is due; a pair
        # never refreshed is due max_age after plan() first saw it (at start-up not all fit one hop)
        self.first_planned_ns[self.first_planned_ns < 0] = now_ns
        last = self.last_refresh_ns[rest]
        order = np.argsort(last, kind="stable")
        rest, last = rest[order], last[order]
        since = np.where(last < 0, self.first_planned_ns[rest], last)
        due = int(np.count_nonzero(now_ns + hop_ns - since > max_age_ns))
        share = max(due, math.ceil(n * hop_ns / max_age_ns))
        room = max(0, budget - len(first) - len(second))
        third = rest[: min(share, room)]
        self.last_overdue = max(0, due - room)
        self.overdue += self.last_overdue
        picked = np.concatenate([first, second, third])
        if cap is not None and len(picked) > cap:
            picked = picked[:cap]
        return picked.astype(np.int64)

    def mark_refreshed(
        self, pair_idx: np.ndarray, t_ns: int, mi: np.ndarray | None = None, dependent: np.ndarray | None = None
    ) -> None:
        """Record network estimates (mi, nats) of pairs at stream time t_ns, and the detector's view of them."""
        self.last_refresh_ns[pair_idx] = t_ns
        if mi is not None:
            self.last_mi[pair_idx] = mi
        if dependent is not None:
            self.held_dependent[pair_idx] = dependent

    def ages_s(self, now_ns: int) -> np.ndarray:
        """Seconds since each pair's last network estimate; inf where never."""
        ages = (now_ns - self.last_refresh_ns) / 1e9
        return np.where(self.last_refresh_ns < 0, np.inf, ages)
