"""The engine's settings: one flat object for library users, generated from the YAML schema.

Each field of :class:`EngineConfig` that a config file can set names its key in :data:`ENGINE_KEYS`; its
default and its bounds are that key's in :mod:`streamcorr.config` (one definition of each), so a library
user and a daemon user get the same defaults and the same errors. ``EngineConfig.from_config(cfg)`` is the
one mapping from a validated config to the engine.

>>> from_file = EngineConfig.from_config(parse_config({"version": 1}, need_sources=False))
>>> (EngineConfig().window_len, EngineConfig().hop_samples) == (from_file.window_len, from_file.hop_samples)
True
>>> EngineConfig(rate_hz=10).hop_samples, EngineConfig(rate_hz=10, hop_s=0.5).hop_samples
(10, 5)
>>> try:
...     EngineConfig(window_len=16)
... except ConfigError as exc:
...     print(exc)
window_len (window.samples in a config file): Input should be greater than or equal to 32 (got 16)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import HOP_S, Changes, Channels, Config, EstimatorConfig, Lags, Pairs, Screening, Window, parse_config
from ..errors import ConfigError
from ..names import name_problem
from .scheduler import PairSelection

__all__ = ["ENGINE_KEYS", "EngineConfig", "parse_config"]

# EngineConfig field -> (config section, key): the default and the bounds are the section's
ENGINE_KEYS: dict[str, tuple[type[BaseModel], str]] = {
    "channels": (Channels, "names"),
    "rate_hz": (Channels, "rate_hz"),
    "max_staleness_s": (Channels, "max_staleness_s"),
    "auto_add_channels": (Channels, "auto_add"),
    "max_channels": (Channels, "max_channels"),
    "auto_pairs_per_hop": (Channels, "auto_pairs_per_hop"),
    "max_future_s": (Channels, "max_future_s"),
    "max_name_bytes": (Channels, "max_name_bytes"),
    "retire_after_s": (Channels, "retire_after_s"),
    "reanchor_after_s": (Channels, "reanchor_after_s"),
    "window_len": (Window, "samples"),
    "min_coverage": (Window, "min_coverage"),
    "skip_stale_hops": (Window, "skip_stale_hops"),
    "repeated_rows": (Window, "repeated_rows"),
    "max_pairs_per_hop": (Pairs, "max_per_hop"),
    "screening": (Screening, "mode"),
    "max_age_s": (Screening, "max_age_s"),
    "hop_budget": (Screening, "hop_budget"),
    "false_alarm_rate": (Changes, "false_alarm_rate"),
    "false_alarms_per_hour": (Changes, "false_alarms_per_hour"),
    "significance": (Changes, "significance"),
    "surrogates": (Changes, "surrogates"),
    "min_effect": (Changes, "min_effect"),
    "persist": (Changes, "persist"),
    "delta": (Changes, "delta"),
    "rel_delta": (Changes, "rel_delta"),
    "fast": (Changes, "fast"),
    "fast_window": (Changes, "fast_window"),
    "max_lag_s": (Lags, "max_s"),
    "lag_refresh_s": (Lags, "refresh_s"),
    "lag_pairs_per_hop": (Lags, "max_pairs_per_hop"),
}
_SECTION = {Channels: "channels", Window: "window", Pairs: "pairs", Screening: "screening", Changes: "changes",
            Lags: "lags"}  # fmt: skip
_SECTION_KEYS: dict[type[BaseModel], dict[str, str]] = {}  # section -> {config key: EngineConfig field}
for _name, (_section, _key) in ENGINE_KEYS.items():
    _SECTION_KEYS.setdefault(_section, {})[_key] = _name


def _default(name: str) -> Any:
    section, key = ENGINE_KEYS[name]
    f = section.model_fields[key]
    return f.get_default(call_default_factory=True)


@dataclass
class EngineConfig:
    channels: list[str] = field(default_factory=list)  # known up front; others are added on first push
    rate_hz: float = _default("rate_hz")  # common clock
    window_len: int = _default("window_len")  # samples of the common clock
    hop_samples: int = 0  # window advance between evaluations, samples; 0: hop_s x rate_hz
    hop_s: float | None = None  # seconds between evaluations when hop_samples is 0 (None: config.HOP_S, 1 s)
    max_staleness_s: float = _default("max_staleness_s")  # sample-and-hold limit; also how long a window waits
    buffer_len: int | None = None  # ring buffer capacity per channel (None: window + max lag + 2 hops, x2, grown
    # for a channel faster than the clock; set, it is fixed)
    pairs: PairSelection = field(default_factory=PairSelection)
    max_pairs_per_hop: int | None = _default("max_pairs_per_hop")  # None: every selected pair each hop
    min_coverage: float = _default("min_coverage")  # pairs valid over less of the window are not evaluated
    false_alarms_per_hour: float = _default("false_alarms_per_hour")  # chance became-dependent, whole matrix
    false_alarm_rate: float | None = _default("false_alarm_rate")  # per pair and evaluation (overrides the above)
    significance: str = _default("significance")  # "effective": null at each pair's effective sample size; "iid"
    surrogates: int = _default("surrogates")  # shifted surrogates per smooth pair for its own null; 0: off
    repeated_rows: str = _default("repeated_rows")  # "drop": rows both channels repeat leave the pair's window
    min_effect: float = _default("min_effect")  # nats: weaker dependence is not reported as "dependent"
    screening: str = _default("screening")  # "auto": screen when pairs exceed the hop's network budget; on; off
    max_age_s: float = _default("max_age_s")  # screening: a network estimate per pair at least this often
    hop_budget: float = _default("hop_budget")  # screening: share of the hop the network may use
    persist: int = _default("persist")
    delta: float | None = _default("delta")  # nats a dependent pair must move for rise/fall (None: from the null)
    rel_delta: float = _default("rel_delta")  # ... and this fraction of its level
    fast: bool = _default("fast")  # the fast change path (streamcorr.engine.fast)
    fast_window: int = _default("fast_window")  # samples: its sentinel's short window
    max_lag_s: float = _default("max_lag_s")  # seconds: lead/lag search range (streamcorr.engine.lags); 0: off
    lag_refresh_s: float = _default("lag_refresh_s")  # each pair's lag searched again at least this often
    lag_pairs_per_hop: int = _default("lag_pairs_per_hop")  # pairs whose lag is searched per hop, at most
    auto_add_channels: bool = _default("auto_add_channels")
    max_channels: int = _default("max_channels")  # channels in all, configured ones first; more names refused
    auto_pairs_per_hop: int = _default("auto_pairs_per_hop")  # pairs with an auto-added channel per hop, at most
    max_future_s: float | None = _default("max_future_s")  # samples further ahead of the receive clock refused
    max_name_bytes: int = _default("max_name_bytes")  # the channel-name rule's length bound (streamcorr.names)
    retire_after_s: float | None = _default("retire_after_s")  # auto-added channels silent this long leave
    reanchor_after_s: float | None = _default("reanchor_after_s")  # a channel off its clock this long re-anchored
    skip_stale_hops: bool = _default("skip_stale_hops")  # live: jump to the newest window when behind
    queue_size: int = 64  # per subscriber
    estimator: Mapping[str, Any] = field(default_factory=dict)  # Estimator keyword arguments

    def __post_init__(self) -> None:
        for section, keys in _SECTION_KEYS.items():  # each section's keys together (cross-key rules)
            try:
                section.model_validate({key: getattr(self, name) for key, name in keys.items()})
            except ValidationError as exc:
                err = exc.errors()[0]
                key = str(err["loc"][0]) if err["loc"] else ""
                if key in keys:  # one key's bound, named both ways
                    where = f"{keys[key]} ({_SECTION[section]}.{key} in a config file)"
                    raise ConfigError(f"{where}: {err['msg']} (got {getattr(self, keys[key])!r:.80})") from None
                msg = f"EngineConfig ({_SECTION[section]} section in a config file): {err['msg']}"
                raise ConfigError(msg) from None
        if self.hop_samples < 0 or (self.hop_s is not None and not self.hop_s > 0):
            raise ConfigError(f"hop_samples must be >= 1 and hop_s > 0; got {self.hop_samples}, {self.hop_s}")
        if self.hop_samples and self.hop_s is not None:
            raise ConfigError("give hop_samples or hop_s, not both (as window.hop_samples and window.hop_s)")
        if not self.hop_samples:  # the same default hop as a config file's
            self.hop_samples = max(1, round((self.hop_s or HOP_S) * self.rate_hz))
            self.hop_s = None
        if len(set(self.channels)) != len(self.channels):
            raise ConfigError("channels contains duplicate names")
        for name in self.channels:
            if (why := name_problem(name, self.max_name_bytes)) is not None:
                raise ConfigError(f"channel name {name!r:.80} is not usable ({why}); see streamcorr.names")

    @classmethod
    def from_config(cls, cfg: Config) -> EngineConfig:
        """The engine's settings from a validated config: every key of ENGINE_KEYS, the hop, the pairs and
        the estimator section."""
        values = {name: getattr(getattr(cfg, _SECTION[section]), key) for name, (section, key) in ENGINE_KEYS.items()}
        return cls(**values, hop_samples=cfg.hop_samples(), pairs=pair_selection(cfg.pairs),
                   estimator=estimator_kwargs(cfg.estimator))  # fmt: skip


# the fast path's sentinel (streamcorr.engine.fast) tests at most this share of the hop's network pairs, or this many
SENTINEL_SHARE = 0.1
SENTINEL_MIN_PAIRS = 128


def fast_path_cost(cfg: EngineConfig, n_pairs: int | None) -> str:
    """What the fast path adds to each hop, in words (``streamcorr check``), for n_pairs pairs (None: unknown)."""
    if not cfg.fast:
        return "fast path off: change events come from the window estimate only (about a window after a change)"
    refresh = cfg.hop_samples / cfg.window_len
    most = SENTINEL_MIN_PAIRS
    if n_pairs is not None:
        most = min(n_pairs, max(SENTINEL_MIN_PAIRS, round(SENTINEL_SHARE * n_pairs)))
    levels = " and ".join(map(str, levels_lengths(sentinel_len(cfg))))
    return (f"fast path on: per hop, network passes over the newest {levels} samples of up to {most:,} "
            f"pairs held independent (or {SENTINEL_SHARE:.0%} of the hop's network pairs; smooth ones also on their "
            f"innovations over {', '.join(map(str, innovation_lengths(sentinel_len(cfg), cfg.window_len)))} "
            "samples), a table lookup per new "
            f"sample of each pair held dependent, and new tables for {refresh:.1%} of those")  # fmt: skip


def sentinel_len(cfg: EngineConfig) -> int:
    """Samples of the fast path's short window: changes.fast_window, at most a quarter of the window (64 or more),
    so that it sees a change well before the window does."""
    return min(cfg.window_len, max(64, min(cfg.fast_window, cfg.window_len // 4)))


# what a smooth pair's innovation test compares (engine.short_windows): x's and y's innovations, then each with the
# other's folded by its local slope's signs in its level's quartiles
FOLDS = ("innovations", "x folded", "y folded")


def innovation_lengths(sentinel_len: int, window_len: int) -> tuple[int, ...]:
    """Rows a smooth pair's innovations are tested on by the sentinel: half, once and twice its short window, within
    half the window (and the short window itself)."""
    m = sentinel_len
    return tuple(k for k in (m // 2, m, 2 * m) if 32 <= k <= max(m, window_len // 2))


def levels_lengths(sentinel_len: int) -> tuple[int, ...]:
    """Rows the sentinel tests a pair's levels on: its whole short window and the newest half of it (64 rows or
    more): a weak relation needs the whole, a strong one shows on the half sooner."""
    return tuple(k for k in (sentinel_len // 2, sentinel_len) if k >= 64) or (sentinel_len,)


def _looks(m: int, hop_samples: int, sentinel_len: int) -> float:
    # independent looks an hour at m rows against those at the short window (a shorter window has more)
    return max(hop_samples, m / 2) / max(hop_samples, sentinel_len / 2)


def levels_alpha(alpha: float, m: int, lengths: tuple[int, ...], hop_samples: int, sentinel_len: int) -> float:
    """False-alarm rate of the sentinel's test of a pair's levels on m rows, from its ``alpha``: shared by the
    lengths (:func:`levels_lengths`), each scaled by its independent looks an hour."""
    return alpha / len(lengths) * _looks(m, hop_samples, sentinel_len)


def innovation_alpha(alpha: float, m: int, lengths: tuple[int, ...], hop_samples: int, sentinel_len: int) -> float:
    """False-alarm rate of each comparison of a smooth pair's innovations on m rows, from the sentinel's ``alpha``:
    half of it, shared by the lengths, each scaled by its independent looks an hour, and by the comparisons at each
    length (``FOLDS``)."""
    return alpha / 2 / len(lengths) / len(FOLDS) * _looks(m, hop_samples, sentinel_len)


def hop_budget_s(cfg: EngineConfig) -> float:
    """Seconds of each hop its optional work (fast-path references, lag searches) may fill, stages before included:
    screening.hop_budget of the hop live (skip_stale_hops); unbounded in a replay, so that it is deterministic."""
    return cfg.hop_samples / cfg.rate_hz * cfg.hop_budget if cfg.skip_stale_hops else math.inf


def lag_samples(cfg: EngineConfig) -> int:
    """The lead/lag search range in samples of the common clock (0: off)."""
    return math.ceil(cfg.max_lag_s * cfg.rate_hz - 1e-9) if cfg.max_lag_s > 0 else 0


def lag_cost(cfg: EngineConfig) -> str:
    """What the lead/lag search adds to each hop, in words (``streamcorr check``)."""
    k = lag_samples(cfg)
    if k == 0:
        return "off (lags.max_s: 0): no lag_s or mi_lag in snapshots"
    return (f"+-{cfg.max_lag_s:g} s ({k} samples; buffers hold window + {k}); per hop up to {cfg.lag_pairs_per_hop} "
            f"pairs whose search is {cfg.lag_refresh_s:g} s old, within what is left of the hop's budget: a scan of "
            f"every lag, the network on 3 lags of each, and 16 shifted surrogates of each smooth pair")  # fmt: skip


def pair_selection(p: Pairs) -> PairSelection:
    """The scheduler's pair selection for the ``pairs`` section (mode all, list or groups)."""
    if p.mode == "list":
        return PairSelection(pairs=tuple((a, b) for a, b in p.pairs))
    if p.mode == "groups":
        return PairSelection(groups=tuple(p.groups), groups_with=tuple(p.groups_with))
    return PairSelection()


def estimator_kwargs(e: EstimatorConfig) -> dict[str, Any]:
    """Estimator keyword arguments from the ``estimator`` section (unset optional keys keep the library's)."""
    return {k: v for k, v in e.model_dump().items() if v is not None or k in ("amp", "compile")}
