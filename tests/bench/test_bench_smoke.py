import json
import os
import subprocess
import sys


def test_paper_gaussian_table_quick(tmp_path):
    """The quick Gaussian sanity table runs end to end (smoke test, not timing) and writes md, json and png."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.paper", "gaussian", "--quick"], check=True, env=env,
                   capture_output=True, timeout=300)  # fmt: skip
    data = json.loads((tmp_path / "paper_gaussian.json").read_text())
    assert set(data["curves"]) == {"InfoNet", "KSG-5", "MINE-500"}
    assert (tmp_path / "paper_gaussian.png").stat().st_size > 0
    assert "mean abs error" in (tmp_path / "paper_gaussian.md").read_text()


def test_lag_bench_quick(tmp_path):
    """bench.lag --quick runs end to end (smoke test, not timing): its tables name every method and section."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.lag", "--quick"], check=True, env=env, capture_output=True,
                   timeout=300)  # fmt: skip
    text = next(tmp_path.glob("lag*.md")).read_text()
    for words in ("Pearson cross-correlation", "KSG", "Independent pairs", "drifting lag", "Engine cost"):
        assert words in text, words
