"""The network's ahead-of-time package (streamcorr.estimate.aot): built once per machine in a background process while
the eager network serves, then loaded at every start; results equal the eager network's; failures and the
off switch leave the eager network serving. One real build (about 30 s of CPU) serves the module."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streamcorr.estimate.aot import AotForward
from streamcorr.estimate.estimator import Estimator

if shutil.which("c++") is None and shutil.which("g++") is None:
    pytest.skip(
        "no C++ compiler (c++, g++): the AOT package cannot be built here; the eager path serves",
        allow_module_level=True,
    )

TOL = 1e-5  # nats: the compiled kernels reassociate float sums; the eager network is the reference


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache directory with the AOT path switched on (the suite runs eager otherwise)."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("aot-cache")
    mp.setenv("STREAMCORR_CACHE_DIR", str(path))
    mp.setenv("STREAMCORR_AOT", "1")
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def built(cache: Path) -> Estimator:
    """An estimator whose first start built the package (it served eagerly meanwhile)."""
    est = Estimator()
    assert isinstance(est._forward, AotForward) and est._forward.state == "building"
    rng = np.random.default_rng(171)
    x = rng.standard_normal((8, 256))
    during = est.estimate_batch(x, x + rng.standard_normal((8, 256)))  # served while the build runs
    assert np.isfinite(during).all()
    assert est._forward.wait(600), f"the package did not build: {est._forward.state}"
    return est


def test_the_package_gives_the_eager_results(built):
    """Batches through the package equal the eager network within 1e-5 nats, on dependent, independent,
    heavy-tailed and quantised windows of several lengths; a single pair takes the eager path."""
    eager = Estimator(compile=False)
    rng = np.random.default_rng(172)
    for t in (64, 512, 2000):
        x = rng.standard_normal((40, t))
        y = np.concatenate([x[:10] + 0.3 * rng.standard_normal((10, t)), rng.standard_normal((10, t)),
                            rng.standard_t(1.5, (10, t)), np.round(3 * np.sin(x[30:]))])  # fmt: skip
        assert np.abs(built.estimate_batch(x, y) - eager.estimate_batch(x, y)).max() <= TOL
    assert built.estimate(x[0], y[0]) == eager.estimate(x[0], y[0])


def test_a_later_start_loads_the_package_at_once(built, cache):
    """The next estimator on this machine finds the package at construction: no build, no wait."""
    t0 = time.perf_counter()
    est = Estimator()
    assert est._forward.state == "ready" and time.perf_counter() - t0 < 5.0
    assert est.fingerprint == Estimator(compile=False).fingerprint  # cached calibrations stay valid
    assert list((cache / "aot").glob("*.pt2")) and not list((cache / "aot").glob("*.lock"))


def test_a_failed_build_leaves_the_eager_network_and_says_why(built, cache, caplog):
    """A build that failed (its record beside the package) is reported once and not retried; eager serves."""
    est = Estimator(weights="infonet-v1")  # other weights: another package
    fwd = est._forward
    assert isinstance(fwd, AotForward)
    if fwd._child is not None:  # stop the real build: this test is about a recorded failure
        fwd._child.kill()
        fwd._child.wait()
    fwd.path.with_suffix(".lock").unlink(missing_ok=True)
    fwd.path.unlink(missing_ok=True)
    fwd.path.with_suffix(".failed").write_text("CalledProcessError: no C++ compiler\n")
    with caplog.at_level(logging.WARNING, logger="streamcorr.estimate.aot"):
        again = Estimator(weights="infonet-v1")
    assert again._forward.state == "failed" and "no C++ compiler" in caplog.text
    rng = np.random.default_rng(173)
    x = rng.standard_normal((4, 256))
    assert np.abs(again.estimate_batch(x, x) - Estimator("infonet-v1", compile=False).estimate_batch(x, x)).max() == 0


def test_the_off_switch_and_explicit_settings(monkeypatch):
    """STREAMCORR_AOT=0 makes the default eager; compile=False is eager and compile="aot" asks for the package."""
    monkeypatch.setenv("STREAMCORR_AOT", "0")
    assert Estimator().compiled is False and not isinstance(Estimator()._forward, AotForward)
    assert not isinstance(Estimator(compile=False)._forward, AotForward)
    assert Estimator(amp=True, compile="aot")._forward.__class__ is not AotForward  # bf16: eager autocast


def test_the_compile_command_reports_the_ready_package(built, capsys):
    """`streamcorr compile` finds this machine's package (built above) and says where it is, exit code 0."""
    from streamcorr.cli.commands import main

    assert main(["compile"]) == 0
    out = capsys.readouterr().out
    assert "ready:" in out and built.aot is not None and str(built.aot.path) in out


def test_a_package_from_another_model_source_is_not_loaded(monkeypatch):
    """The package key covers the network's source: after an upgrade changes model.py, the old package is not used."""
    from streamcorr.estimate import aot

    before = aot.package_path("ab" * 32)
    monkeypatch.setattr(aot, "_model_source", lambda: "another model.py")
    assert aot.package_path("ab" * 32) != before
    assert aot.package_path("ab" * 32).name.startswith("infonet-abababababab-")


def test_a_package_that_appears_while_serving_is_loaded_in_the_background(built, cache, monkeypatch):
    """An estimator that started before the package existed serves eagerly, then loads the package in a thread
    when it appears (no estimate waits on the load) and serves through it, within 1e-5 nats of eager."""
    pkg = next((cache / "aot").glob("*.pt2"))
    hidden = pkg.with_suffix(".hidden")
    pkg.rename(hidden)
    try:
        monkeypatch.setattr(AotForward, "_start_build", lambda self: setattr(self, "state", "building"))
        est = Estimator()
        fwd = est._forward
        assert isinstance(fwd, AotForward) and fwd.state == "building" and fwd._runner is None
        rng = np.random.default_rng(173)
        x = rng.standard_normal((16, 512))
        y = x + rng.standard_normal((16, 512))
        hidden.rename(pkg)
        fwd._next_poll = 0.0
        first = est.estimate_batch(x, y)  # this batch starts the load and does not wait for it
        assert fwd._loader is not None
        fwd._loader.join(60)
        assert fwd.state == "ready" and fwd._runner is not None
        eager = Estimator(compile=False).estimate_batch(x, y)
        assert np.abs(first - eager).max() <= TOL and np.abs(est.estimate_batch(x, y) - eager).max() <= TOL
    finally:
        if hidden.exists():
            hidden.rename(pkg)
