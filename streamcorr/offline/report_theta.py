"""The report's lookup tables: each pair's theta (the network's table over the copula square) as an inline PNG
heatmap (blue below independence, red above) with one hover cell per node giving both ranks and theta.

Self-contained like the report: the PNG is written with zlib and the PNG chunk layout (no image library, so the
report needs no optional dependency).
"""

from __future__ import annotations

import base64
import html
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["table_figure"]


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _png_data_uri(rgb: np.ndarray) -> str:
    """A (H, W, 3) uint8 image as an inline PNG (data: URI): zlib and the PNG chunk layout, no image library."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(h))  # filter byte 0 per scanline

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


def table_figure(tb: dict[str, Any]) -> str:
    """One pair's table from tables.json ({a, b, mi, table: (G, G) nested lists}) as a <figure>."""
    theta = np.asarray(tb["table"], dtype=float)[::-1]  # (G, G); image rows top-down: a's rank upwards
    lim = max(float(np.abs(theta).max()), 1e-9)
    v = theta / lim  # -1 .. 1: blue where the pair occurs less often than under independence, red more
    pos, neg = np.clip(v, 0, 1), np.clip(-v, 0, 1)
    rgb = np.stack([255 - 60 * pos - 200 * neg, 255 - 210 * pos - 120 * neg, 255 - 200 * pos - 40 * neg], axis=-1)
    uri = _png_data_uri(np.clip(rgb, 0, 255).astype(np.uint8))
    name = _esc(f"{tb['a']} ~ {tb['b']}")
    return (
        f"<figure class='theta'><figcaption>{name}<br><span class='note'>MI {tb['mi']:.3f} nats; "
        f"&theta; in &plusmn;{lim:.2f}</span></figcaption><div class='cells'><img src='{uri}' width='180' "
        f"height='180' alt='lookup table {name}'>{_table_hover(theta, str(tb['a']), str(tb['b']))}</div></figure>"
    )


def _table_hover(theta: np.ndarray, a: str, b: str) -> str:
    """An SVG over the table's image with one transparent cell per node whose <title> (the hover text) gives both
    channels' ranks there and theta; ``theta`` (G, G) as drawn, a's rank upwards."""
    g = theta.shape[0]
    ranks = np.linspace(0.0, 1.0, g)  # the table's nodes
    sa, sb = _esc(a if len(a) <= 24 else a[:23] + "\u2026"), _esc(b if len(b) <= 24 else b[:23] + "\u2026")
    cells = "".join(f"<rect x='{c}' y='{r}' width='1' height='1'><title>{sa} rank {ranks[g - 1 - r]:.2f}, {sb} rank "
                    f"{ranks[c]:.2f}: &theta; {theta[r, c]:+.3f}</title></rect>"
                    for r in range(g) for c in range(g))  # fmt: skip
    return f"<svg class='hover' viewBox='0 0 {g} {g}' width='180' height='180' preserveAspectRatio='none'>{cells}</svg>"
