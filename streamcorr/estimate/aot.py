"""The network compiled ahead of time for this CPU: the default fast path on a CPU.

``torch.compile`` runs the network about 1.5x faster on a CPU but costs about 10 s at every start. An
AOTInductor package (``torch.export`` + ``torch._inductor.aoti_compile_and_package``) is the same compiled code
built once per machine, weights and torch version and cached on disk (streamcorr.cache, ``aot/``): it loads in
milliseconds at every later start. Contract:

* the first start on a machine builds the package in a child process at low priority (about 30 s of CPU on
  2 cores; a C++ compiler is needed) while the eager network serves, so start-up never waits for it;
  one process builds at a time (a lock file), the others pick the package up when it appears;
* results equal the eager network's within 1e-5 nats (floating-point reassociation): the null calibrations
  and every cached result stay valid (the estimator's fingerprint does not change);
* a batch of one pair, bf16 autocast (``amp``) and a failed build use the eager network; a failed build is
  logged once with its cause and not retried until the package's inputs change;
* ``streamcorr compile`` builds it at once and waits (an image build, a deployment step);
* ``STREAMCORR_AOT=0`` turns it off (eager only), for a machine without a C++ compiler or a test run.

The package key: the weights' digest, the network's source (model.py), torch's version, the CPU model and its
instruction-set flags.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_dir

log = logging.getLogger("streamcorr.estimate.aot")

__all__ = ["AotForward", "aot_enabled", "build_package", "package_path"]

AOT_ENV = "STREAMCORR_AOT"
POLL_S = 5.0  # how often a process without the package looks for it
STALE_LOCK_S = 900.0  # a build lock older than this is from a process that died


def aot_enabled() -> bool:
    return os.environ.get(AOT_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _cpu_id() -> str:
    model, flags = platform.processor(), ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()}|{model}|{flags}"


def _model_source() -> str:
    """Digest of the network's source: a package compiled from an older model.py must not be loaded."""
    from . import model

    return hashlib.sha256(Path(model.__file__).read_bytes()).hexdigest()[:16]


def package_path(weights_digest: str) -> Path:
    """Where the package for these weights, this torch and this CPU lives."""
    parts = (weights_digest, torch.__version__, _cpu_id(), _model_source())
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]
    return cache_dir() / "aot" / f"infonet-{weights_digest[:12]}-{key}.pt2"


def build_package(model: torch.nn.Module, grid: int, out: Path) -> None:
    """Export the network with a dynamic batch and compile it into ``out`` (written whole, then renamed)."""
    from torch._inductor import aoti_compile_and_package

    example = (torch.rand(4, grid, grid), torch.rand(4, grid), torch.rand(4, grid))
    batch = torch.export.Dim("batch", min=2, max=1 << 20)
    with torch.inference_mode():
        exported = torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}, {0: batch}))
    tmp = out.with_name(f"{out.stem}.{os.getpid()}.tmp.pt2")
    aoti_compile_and_package(exported, package_path=str(tmp))
    tmp.replace(out)


def _import_loader() -> None:
    with contextlib.suppress(Exception):  # loading it later reports any failure
        from torch._inductor import aoti_load_package  # noqa: F401


class AotForward:
    """The network's forward (hist, mx, my) -> theta, through the AOT package once it is there.

    Shared by an estimator and its views (the engine's stoppable estimator), so a package that appears later
    serves all of them.
    """

    def __init__(self, model: torch.nn.Module, weights: str | Path | None, digest: str, grid: int) -> None:
        self.model, self.weights, self.grid = model, weights, grid
        self.path = package_path(digest)
        self._runner: Any = None
        self._next_poll = 0.0
        self._failed = self.path.with_suffix(".failed")
        self._child: subprocess.Popen[bytes] | None = None
        self._loader: threading.Thread | None = None
        self.state = "eager"  # eager -> building -> ready (or failed)
        self._poll(start_build=True)
        if self.state == "building":  # the loader's import takes about 2 s: not inside the hop that picks it up
            threading.Thread(target=_import_loader, name="streamcorr-aot-import", daemon=True).start()

    def __call__(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        if self._runner is None and time.monotonic() >= self._next_poll:
            self._poll(start_build=False, background=True)
        if self._runner is not None and hist.shape[0] >= 2:
            out: torch.Tensor = self._runner(hist, mx, my)
            return out
        out = self.model(hist, mx, my)
        return out

    def _poll(self, start_build: bool, background: bool = False) -> None:
        """Look for the package. ``background``: one that appears while estimates run is loaded in a thread (a
        second or two), and the eager network serves until it is in."""
        self._next_poll = time.monotonic() + POLL_S
        if self.path.is_file():
            if not background:
                self._load()
            elif self._loader is None or not self._loader.is_alive():
                self._loader = threading.Thread(target=self._load, name="streamcorr-aot-load", daemon=True)
                self._loader.start()
            return
        if self._failed.is_file():
            if self.state != "failed":
                why = self._failed.read_text(errors="replace").strip()[:500]
                log.warning("network: compiling it for this CPU failed (%s); the eager network serves. Delete %s "
                            "to try again, or set %s=0", why, self._failed, AOT_ENV)  # fmt: skip
            self.state = "failed"
            return
        if start_build:
            self._start_build()

    def _load(self) -> None:
        try:
            from torch._inductor import aoti_load_package

            runner = aoti_load_package(str(self.path))
        except Exception as exc:  # a package from a broken build: eager, and a rebuild next start
            log.warning("network: could not load %s (%s); eager until rebuilt", self.path, exc)
            self.path.unlink(missing_ok=True)
            return
        self._runner = runner  # one assignment: a caller sees the eager network or the package, never half
        self.state = "ready"
        log.info("network: the compiled package for this CPU is in use (%s)", self.path.name)

    def _start_build(self) -> None:
        lock = self.path.with_suffix(".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
                lock.unlink()
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            self.state = "building"  # another process builds it
            return
        except OSError as exc:  # a read-only cache: eager
            log.info("network: no compiled package (cannot write %s: %s)", lock.parent, exc)
            return
        os.close(fd)
        cmd = [sys.executable, "-m", "streamcorr.estimate.aot", str(self.weights or ""), str(self.grid), str(self.path)]
        log.info("network: compiling it for this CPU in the background (once per machine, about 30 s of CPU; "
                 "eager meanwhile), into %s", self.path.parent)  # fmt: skip
        # the child's output goes to a file beside the package (a pipe nobody reads could fill and stall it)
        with open(self.path.with_suffix(".log"), "wb") as out:
            self._child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True)  # fmt: skip
        self.state = "building"

    def ensure(self, timeout_s: float) -> bool:
        """Build now if needed (a recorded failure is retried), waiting up to timeout_s: `streamcorr compile`,
        e.g. while a container image is built. True once the package serves."""
        if self._runner is not None:
            return True
        self._failed.unlink(missing_ok=True)
        self.state = "eager"
        if self._child is None:
            self._poll(start_build=True)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> bool:
        """Wait for this process's build (tests, benchmarks); True once the package serves."""
        if self._child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._child.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._runner is None and time.monotonic() < deadline and self.state != "failed":
            self._poll(start_build=False)
            if self._runner is None:
                time.sleep(0.2)
        return self._runner is not None


def _main(argv: list[str]) -> int:
    """``python -m streamcorr.estimate.aot WEIGHTS GRID OUT``: build one package (the child process of AotForward)."""
    from .weights import load_model

    weights, grid, out = argv[0] or None, int(argv[1]), Path(argv[2])
    lock, failed = out.with_suffix(".lock"), out.with_suffix(".failed")
    with contextlib.suppress(OSError):
        os.nice(10)  # the engine comes first
    try:
        model, _ = load_model(weights, "cpu")
        if model.cfg.grid != grid:
            raise ValueError(f"weights have grid {model.cfg.grid}, expected {grid}")
        build_package(model, grid, out)
    except Exception as exc:
        failed.write_text(f"{type(exc).__name__}: {exc}\n"[:4000])
        print(f"streamcorr.estimate.aot: build failed: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
