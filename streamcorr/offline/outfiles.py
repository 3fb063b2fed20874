"""Output files that never write through a link: a symlink planted at an output's name is replaced, and the
file it points to is left alone.

Each file is written under a new name created exclusively in the destination's directory
(``O_CREAT | O_EXCL | O_NOFOLLOW``: fails on any existing name, a dangling symlink included), then renamed
over the final name; ``os.replace`` replaces a link at the destination rather than following it, and a
reader sees the old file or the whole new one. Writers that open their files by name themselves (the
Parquet history) write into a :func:`staging_dir` (mode 0700, so nobody else can plant a link in it) and
their files are moved to their names with :func:`move_into`.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     n = (Path(d) / "victim").write_text("keep")
...     (Path(d) / "out.json").symlink_to(Path(d) / "victim")
...     write_file(Path(d) / "out.json", b"{}")
...     (Path(d) / "victim").read_text(), (Path(d) / "out.json").is_symlink()
('keep', False)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["move_into", "staging_dir", "write_file"]

# exclusive create: fails on any existing name, a symlink (even dangling) included; O_NOFOLLOW says it twice
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_file(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a new exclusive file renamed over it (OSError on failure, nothing
    left behind)."""
    path = Path(path)
    part = path.parent / f".{path.name}.{secrets.token_hex(8)}.part"
    fd = os.open(part, _CREATE, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(part, path)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()
        raise


def staging_dir(outdir: str | Path) -> Path:
    """A new private directory inside ``outdir`` (created when missing) for files to be moved by move_into."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".streamcorr-", dir=out))


def move_into(staging: Path, outdir: str | Path, names: Iterable[str]) -> None:
    """Rename each of ``names`` present in ``staging`` to ``outdir`` (replacing, never following, a link at its
    name), then remove ``staging``."""
    try:
        for name in names:
            if (staging / name).exists():
                os.replace(staging / name, Path(outdir) / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
