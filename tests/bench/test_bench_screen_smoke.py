"""Smoke tests for the screening benchmarks: they run end to end and write their tables (no timings asserted)."""

import json
import os
import subprocess
import sys


def _run(tmp_path, *args: str) -> None:
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path), "STREAMCORR_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-m", *args], check=True, env=env, capture_output=True, timeout=600)


def test_screen_calibration_quick(tmp_path):
    """The quick screen calibration table lists every candidate sketch and the shipped screen's pass rates."""
    _run(tmp_path, "bench.screen_calibration", "--quick")
    data = json.loads((tmp_path / "screen_calibration_quick.json").read_text())
    assert len(data["choice"]) == 6 and data["shipped"][0]["window_len"] == 256
    assert set(data["shipped"][0]["dependent_pass"]) == {"linear", "square", "abs", "sine"}


def test_engine_scaling_quick(tmp_path):
    """The quick scaling table has a screening-off and a screening-on row."""
    _run(tmp_path, "bench.engine_throughput", "scaling", "--quick")
    rows = json.loads((tmp_path / "engine_scaling_quick.json").read_text())["rows"]
    assert [r["screening"] for r in rows] == ["off", "on"]
    assert rows[1]["network_pairs_per_hop"] < rows[1]["pairs"]
