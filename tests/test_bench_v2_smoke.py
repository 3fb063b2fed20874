import json
import os
import subprocess
import sys


def test_plugin_ceiling_quick(tmp_path):
    """The plug-in ceiling bench runs end to end and finds a finer table closer to the truth on every case."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.plugin_ceiling", "--quick"], check=True, env=env,
                   capture_output=True, timeout=300)  # fmt: skip
    rows = json.loads((tmp_path / "plugin_ceiling_quick.json").read_text())["rows"]
    assert len(rows) == 7
    for r in rows:  # json keys are strings; the shortfall shrinks as the table gets finer
        assert r["shortfall"]["32"] < r["shortfall"]["64"] < r["shortfall"]["128"] < 0.05, r
