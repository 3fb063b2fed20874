"""The fast path's coupling sentinel: short windows of pairs held independent, and the newest half of them."""

from __future__ import annotations

import numpy as np
import pytest

from streamcorr.engine import sentinel as sentinel_module
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.settings import levels_alpha, levels_lengths

RATE = 100.0
T0 = 1_765_000_000.0
HOP = 25


def test_levels_lengths_and_their_rates_share_the_sentinels_budget() -> None:
    """The levels are tested on the newest half (64 rows or more) and the whole short window; the half's rate is
    smaller (its windows overlap less from hop to hop, so it has more independent looks), and both together stay
    within the sentinel's rate."""
    assert levels_lengths(256) == (128, 256)
    assert levels_lengths(128) == (64, 128)
    assert levels_lengths(64) == (64,)
    assert levels_lengths(32) == (32,)  # a window under 64 rows: its short window is the whole
    for hop in (25, 50, 100):
        rates = [levels_alpha(1e-3, m, (128, 256), hop, 256) for m in (128, 256)]
        assert rates[0] <= rates[1] and sum(rates) <= 1e-3 + 1e-12


def _couplings(seed: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[tuple[str, str], float]]:
    """Four white pairs on one clock, each coupling (linear, square, tanh, abs, noise 0.5) at its own time."""
    rng = np.random.default_rng(seed)
    n = int(60 * RATE)
    data: dict[str, np.ndarray] = {}
    truth = {}
    for k, rel in enumerate((lambda x: x, np.square, lambda x: np.tanh(2 * x), np.abs)):
        x, y = rng.standard_normal(n), rng.standard_normal(n)
        at = float(rng.uniform(15, 50))
        fx = rel(x)
        i = int(at * RATE)
        y[i:] = (fx[i:] - fx.mean()) / fx.std() + 0.5 * rng.standard_normal(n - i)
        data[f"x{k}"], data[f"y{k}"] = x, y
        truth[(f"x{k}", f"y{k}")] = at
    return T0 + np.arange(n) / RATE, data, truth


def _delays(seed: int) -> list[float]:
    t, data, truth = _couplings(seed)
    eng = Engine(EngineConfig(channels=list(data), rate_hz=RATE, window_len=512, hop_samples=HOP,
                              skip_stale_hops=False, max_future_s=None, queue_size=100_000))  # fmt: skip
    events = []
    for s in range(0, len(t), HOP):
        eng.push_frame(t[s : s + HOP], {k: v[s : s + HOP] for k, v in data.items()})
        for end in eng.due_windows():
            events += eng.evaluate(end)[1]
    delays = []
    for pair, at in truth.items():
        found = [e.t_ns / 1e9 - T0 - at for e in events if e.pair == pair and e.kind == "became-dependent"]
        assert found and min(found) >= 0, f"{pair}: {found}"
        delays.append(min(found))
    chance = [e for e in events if e.pair not in truth and e.kind == "became-dependent" and not e.initial]
    assert not chance
    return delays


@pytest.mark.parametrize("seed", [811])
def test_a_strong_coupling_is_seen_on_the_newest_half_of_the_short_window(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the newest half (64 rows at a 128-row short window) tested too, strong couplings are reported sooner
    than on the whole short window alone, and no independent pair gets an event."""
    both = _delays(seed)
    monkeypatch.setattr(sentinel_module.settings, "levels_lengths", lambda m: (m,))
    whole = _delays(seed)
    assert np.median(both) < np.median(whole)
    assert max(both) <= 128 / RATE  # s: before the short window holds only rows after the change
