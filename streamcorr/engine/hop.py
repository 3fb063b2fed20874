"""One hop's working record: the arrays the engine's stages (align, rank, select, estimate, judge, publish) fill in
turn, with their shapes, and the stage timer. Engine.evaluate creates one per hop and drops it after publishing."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .counters import EngineCounters
from .intake import Channel

__all__ = ["Hop", "PairNames"]


def _empty() -> np.ndarray:
    return np.zeros(0)


def _no_index() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


def _no_mask() -> np.ndarray:
    return np.zeros(0, dtype=bool)


@dataclass(eq=False)
class Hop:
    """One hop's working arrays, filled in stage by stage (C channels, N samples, P selected pairs)."""

    end_tick: int
    t0: float  # perf_counter at the start of the current stage
    chans: list[Channel] = field(default_factory=list)
    raw: np.ndarray = field(default_factory=_empty)  # (C, N) the aligned window, NaN where a channel has no sample
    window: np.ndarray = field(default_factory=_empty)  # (C, N) what is ranked: raw, or its innovations (prewhiten)
    valid: np.ndarray = field(default_factory=_no_mask)  # (C, N)
    fresh: np.ndarray = field(default_factory=_no_mask)  # (C, N) a new sample, not one held from an earlier tick
    repeats: np.ndarray = field(default_factory=_no_mask)  # (C,) the channel repeats a sample somewhere in the window
    ranks: list[np.ndarray | None] = field(default_factory=list)  # (N,) per fully valid channel
    pick: np.ndarray = field(default_factory=_no_index)  # (P,) indices into the engine's pairs
    flagged: np.ndarray | None = None  # (n_pairs,) bool: passed the dependence screen (None: no screen this hop)
    was_screened: np.ndarray | None = None  # (P,) the pair showed the screen's figure last hop
    screen_level: np.ndarray | None = None  # (P,) that figure
    i: np.ndarray = field(default_factory=_no_index)  # (P,) channel indices
    j: np.ndarray = field(default_factory=_no_index)
    u: np.ndarray = field(default_factory=_empty)  # (C, N) shared ranks of the channels the network saw
    coverage: np.ndarray = field(default_factory=_empty)  # (P,)
    ok: np.ndarray = field(default_factory=_no_mask)  # (P,) enough coverage to be estimated
    mi: np.ndarray = field(default_factory=_empty)  # (P,) nats; NaN where not estimated
    n_eff: np.ndarray = field(default_factory=_empty)  # (P,) effective sample size
    done: np.ndarray = field(default_factory=_no_mask)  # (P,) estimated this hop
    groups: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # own-row pairs: (ranks, indices)
    # pairs of channels on different rates, also on every row either channel renews (streamcorr.engine.mixed_rows)
    mixed: np.ndarray = field(default_factory=_no_mask)  # (P,)
    mixed_mi: np.ndarray = field(default_factory=_empty)  # (P,) nats on those rows; NaN elsewhere
    mixed_n_eff: np.ndarray = field(default_factory=_empty)  # (P,)
    mixed_groups: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    done_pairs: list[tuple[str, str]] = field(default_factory=list)
    began: float = 0.0  # perf_counter at the start of the hop

    def __post_init__(self) -> None:
        self.began = self.t0

    def lap(self, counters: EngineCounters, stage: str) -> None:
        self.t0 = counters.add_time(stage, self.t0)


class PairNames:
    """Names of pair k of pairs (P, 2), made when asked (most pairs of a large matrix are never looked at)."""

    def __init__(self, names: list[str], pairs: np.ndarray) -> None:
        self.names, self.pairs = names, pairs

    def __getitem__(self, k: int | np.integer) -> tuple[str, str]:
        return self.names[self.pairs[k, 0]], self.names[self.pairs[k, 1]]
