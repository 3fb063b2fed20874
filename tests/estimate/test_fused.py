"""The fused CUDA network (streamcorr.estimate.fused) computes InfoNet's function: run on the CPU through
Triton's interpreter, in a child process (the interpreter is chosen when the kernels are first imported)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import json, sys
import numpy as np
from streamcorr.estimate.copula import rank_transform
from streamcorr.estimate.estimator import Estimator
from streamcorr.estimate.fused import FusedInfoNet, fused_available
from streamcorr.estimate.tensor_path import TensorPath


def check(weights, seed):
    est = Estimator(weights, device="cpu", compile=False)
    rng = np.random.default_rng(seed)
    t, c = 700, 7
    x = np.zeros((c, t))
    for k in range(c):  # smooth AR(1) channels
        e = rng.standard_normal(t)
        for i in range(1, t):
            x[k, i] = 0.9 * x[k, i - 1] + e[i]
    x[1] = np.tanh(x[0]) + 0.2 * rng.standard_normal(t)  # monotone
    x[3] = np.round(x[2] ** 2)  # non-monotone, quantised (ties)
    u = rank_transform(x, est.ties)
    iu = np.array([0, 1, 2, 6, 5, 0, 4, 3, 6])  # mixed order, both orientations, a repeated pair
    iv = np.array([1, 0, 3, 2, 1, 1, 5, 6, 0])
    ref = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=4).estimate(u, iu, iv)
    out = {"available": fused_available(est.model, est.device), "dependent": [float(ref[0]), float(ref[2])]}
    # the defaults (4 pairs a block program); the inputs' kernel with torch's smoother, and the one-kernel tail,
    # at 2 pairs
    variants = {"split": {}, "torch": {"tail": "torch", "embed": "kernel", "rows": 32},
                "fused": {"tail": "fused", "rows": 32}}
    for name, kw in variants.items() if "v2" in weights else [("split", {})]:  # v1: the defaults only
        fused = FusedInfoNet(est.model, **kw)
        path = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=4, fused=fused)
        out[name] = float(np.abs(path.estimate(u, iu, iv) - ref).max())
    return out


print(json.dumps({w: check(w, seed) for w, seed in json.loads(sys.argv[1])}))
"""


def test_fused_kernels_equal_the_torch_network() -> None:
    """The fused network gives the torch path's MI on smooth, quantised channels, pairs in any order, for both
    shipped networks (the default network with each of its tails)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    cases = [[str(ROOT / "models" / f"{w}.safetensors"), seed] for w, seed in (("infonet-v2", 21), ("infonet-v1", 22))]
    proc = subprocess.run([sys.executable, "-c", CHECK, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2
    for got in results.values():
        assert got["available"]
        assert max(v for k, v in got.items() if k in ("split", "torch", "fused")) < 1e-4, got
        assert min(got["dependent"]) > 0.3  # the dependent pairs are dependent: the comparison is not of zeros
    assert {"torch", "fused"} <= results[cases[0][0]].keys()  # the other tails are checked on the default network
