import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "object_discovery.py"


def _load() -> ModuleType:
    """examples/ is not a package: load the script as a module."""
    spec = importlib.util.spec_from_file_location("object_discovery", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def test_object_discovery_recovers_the_rigid_bodies(capsys):
    """The example groups the tracked points into exactly the simulated rigid bodies and says so."""
    od = _load()
    seed = int(np.random.default_rng(0).integers(0, 1000))
    result = od.main(seed=seed)
    assert result.exact and result.ari == 1.0
    n = len(result.truth)
    same = result.truth[:, None] == result.truth[None, :]
    off = ~np.eye(n, dtype=bool)
    assert result.mi[same & off].min() > 0.2 > 0.02 > result.mi[~same].max()  # a wide gap, not a lucky cut
    assert "recovered exactly" in capsys.readouterr().out


def test_adjusted_rand_index_matches_hand_computed_values():
    """ARI is 1 for a relabelled partition and matches a value worked out by hand otherwise."""
    od = _load()
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 4, 30)
    perm = rng.permutation(4)
    assert od.adjusted_rand_index(truth, perm[truth]) == 1.0
    assert od.same_partition(truth, perm[truth])
    # a = [0,0,0,1,1,1], b = [0,0,1,1,2,2]: index 2, rows 6, cols 3, total 15 -> (2 - 1.2) / (4.5 - 1.2)
    a, b = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 2, 2])
    assert abs(od.adjusted_rand_index(a, b) - 0.8 / 3.3) < 1e-12
    assert not od.same_partition(a, b)
