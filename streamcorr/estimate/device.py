"""Where the estimator runs: the torch device a setting names (checked), and the CPU heap tuned for inference."""

from __future__ import annotations

import ctypes
import sys

import torch

from ..errors import InputError

__all__ = ["resolve_device", "tune_allocator"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_allocator_tuned = False


def tune_allocator() -> None:
    """Keep freed activation buffers in the heap instead of returning them to the OS.

    glibc serves large blocks with fresh mmap pages and trims the heap after
    frees, so every forward pass page-faults its activations back in: measured
    here, that doubled CPU inference time. Peak memory is bounded by batch_size.
    """
    global _allocator_tuned
    if _allocator_tuned or not sys.platform.startswith("linux"):
        return
    _allocator_tuned = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 256 * 2**20)
        libc.mallopt(_M_TRIM_THRESHOLD, 1024 * 2**20)
    except (OSError, AttributeError):  # not glibc: leave the allocator alone
        pass


def resolve_device(device: str) -> torch.device:
    """The torch device for "cpu", "cuda", "cuda:N" or "auto" (CUDA where torch sees it), checked."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InputError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto'; got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} requested but torch sees no CUDA device; use device='cpu' or 'auto'")
    return torch.device(device)
