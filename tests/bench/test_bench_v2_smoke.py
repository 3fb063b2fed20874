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


def test_out_of_family_ground_truth_matches_known_cases():
    """The out-of-family ground truth reproduces analytic MI: y = x + sigma e is Gaussian, 0.5 log(1 + 1/sigma^2),
    within 4 standard errors; a Student-t with many degrees of freedom approaches the Gaussian's MI."""
    import numpy as np

    from bench.out_of_family import noisy_map, student_t
    from training.tasks import gaussian_mi

    _, mi, se = noisy_map(lambda x: x, 0.5)
    assert abs(mi - 0.5 * np.log(1 + 1 / 0.25)) < 4 * se
    _, mi_t, se_t = student_t(200.0, 0.6)
    assert abs(mi_t - gaussian_mi(0.6)) < 0.01 + 4 * se_t
    _, mi_cauchy, _ = student_t(1.0, 0.0)
    assert mi_cauchy > 0.1  # uncorrelated yet dependent: heavy tails move together
