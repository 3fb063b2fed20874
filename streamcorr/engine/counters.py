"""The engine's counters: hops, pair estimates and refusals, read by /metrics (streamcorr.daemon.series) and the
status message; a plain dataclass, written by the engine's stages and read without locks (each field is a whole
number or float assigned at once)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["EngineCounters"]


@dataclass
class EngineCounters:
    hops: int = 0
    hops_skipped: int = 0  # hops superseded because compute was still busy
    hops_in_gaps: int = 0  # hops passed over because the whole stream had a gap (or a device clock jumped ahead)
    pairs_evaluated: int = 0
    pairs_low_coverage: int = 0
    pairs_screened: int = 0  # cells given the screen's figure instead of a network estimate
    screen_passed: int = 0  # pairs that passed the screen
    max_age_overdue: int = 0  # pairs due for their max_age network estimate that did not fit the hop's budget
    screen_deferred: int = 0  # pairs that passed the screen but did not fit the hop's budget (they wait)
    unknown_channel: int = 0  # samples for channels not in the config (auto_add_channels=False)
    bad_name: int = 0  # samples for a name that breaks the channel-name rule
    channel_limit: int = 0  # samples for new names refused because max_channels exist
    channels_retired: int = 0  # auto-added channels that left the matrix after retire_after_s of silence
    channels_reanchored: int = 0  # channels whose clock stepped, re-anchored onto the stream clock
    future: int = 0  # samples for a new name, all stamped beyond max_future_s (known channels count their own)
    bad_sample: int = 0  # non-numeric or mismatched input to push
    snapshots_dropped: int = 0
    events_dropped: int = 0
    last_hop_s: float = 0.0  # wall time of the newest hop's evaluation
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds spent per stage of evaluate()

    def add_time(self, stage: str, t0: float) -> float:
        now = time.perf_counter()
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + now - t0
        return now
