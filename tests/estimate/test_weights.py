"""Shipped weights by name (infonet-v1, infonet-v2), the default tie policy, and the config key that picks them."""

import numpy as np
import pytest

from streamcorr import Estimator
from streamcorr.config import parse_config
from streamcorr.engine.settings import EngineConfig
from streamcorr.errors import ConfigError, ModelLoadError
from streamcorr.estimate.weights import DEFAULT_TIES, DEFAULT_WEIGHTS_NAME, SHIPPED_WEIGHTS, weights_path

BASE = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:5555"}]}


def test_every_shipped_name_resolves_to_a_file():
    """Each shipped name is a file in the package (a link into models/ in a checkout); None is the default."""
    assert DEFAULT_WEIGHTS_NAME == "infonet-v2"
    for name in SHIPPED_WEIGHTS:
        assert weights_path(name).is_file(), name
    assert weights_path(None) == weights_path("infonet-v2")
    assert weights_path("some/dir/w.safetensors").name == "w.safetensors"  # anything else is a path


def test_v1_and_v2_load_by_name_with_their_tie_policies():
    """infonet-v1 (no policy in its metadata) runs with the default, jittered ties; infonet-v2 carries 'jitter';
    an explicit ties= overrides both. The default estimator is v2 with jitter."""
    v1, v2 = Estimator("infonet-v1"), Estimator("infonet-v2")
    assert "ties" not in v1.meta and v1.ties == DEFAULT_TIES == "jitter"
    assert v2.meta["ties"] == "jitter" and v2.meta["run"] == "infonet-v2-round15" and v2.ties == "jitter"
    assert v2.meta["config"]["smoothers"] == 2 and "smoothers" not in v1.meta["config"]
    assert v1.fingerprint != v2.fingerprint
    default = Estimator()
    assert default.fingerprint == v2.fingerprint and default.ties == "jitter"
    assert Estimator("infonet-v1", ties="mid").ties == "mid"
    rng = np.random.default_rng(11)
    x = rng.standard_normal(1000)
    y = x + rng.standard_normal(1000)  # true MI 0.347 nats: both models within 0.1 of it on one window
    for est in (v1, v2):
        assert abs(est.estimate(x, y) - 0.347) < 0.1


def test_unknown_weights_fail_at_construction():
    """A name that is not shipped and not a file fails with the shipped names in the message."""
    with pytest.raises(ModelLoadError, match="infonet-v1, infonet-v2"):
        Estimator("infonet-v9")


@pytest.mark.parametrize("weights", ["infonet-v1", "infonet-v2", "/opt/models/mine.safetensors"])
def test_config_accepts_shipped_names_and_paths(weights):
    """estimator.weights takes a shipped name or a .safetensors path, and the daemon hands it to the estimator."""
    cfg = parse_config(BASE | {"estimator": {"weights": weights}})
    assert cfg.estimator.weights == weights
    assert dict(EngineConfig.from_config(cfg).estimator)["weights"] == weights


def test_config_rejects_an_unknown_weights_name():
    """A misspelt model name is a config error naming the key and the shipped names."""
    with pytest.raises(ConfigError, match=r"estimator\.weights: .*infonet-v1, infonet-v2.*'infonet-2'"):
        parse_config(BASE | {"estimator": {"weights": "infonet-2"}})


@pytest.mark.slow
def test_a_built_wheel_holds_each_weights_file_itself(tmp_path):
    """The package's weights are links into models/ in a checkout; a wheel built from it holds the files
    themselves (setuptools follows the links), byte-identical to models/, and no training checkpoint."""
    import hashlib
    import shutil
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("streamcorr", "models"):
        shutil.copytree(root / name, src / name, symlinks=True, ignore=ignore)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(tmp_path / "whl"), "--no-deps", "-q"]
    subprocess.run([*cmd, "--no-build-isolation"], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "whl").glob("streamcorr-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for shipped in SHIPPED_WEIGHTS:
            info = z.getinfo(f"streamcorr/data/{shipped}.safetensors")
            assert (info.external_attr >> 16) & 0o170000 != 0o120000, "stored as a link"
            want = hashlib.sha256((root / "models" / f"{shipped}.safetensors").read_bytes()).hexdigest()
            assert hashlib.sha256(z.read(info)).hexdigest() == want, shipped
    assert any(n.startswith("streamcorr/data/null/nulltable-") for n in names)
    assert not [n for n in names if n.endswith(".pt")]
