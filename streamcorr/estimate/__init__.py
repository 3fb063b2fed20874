"""Estimation: windows of samples in, mutual information out.

``copula`` turns a window into ranks (Numba kernels, incremental) and histograms; ``model`` is InfoNet, which maps
a window's pairs to a lookup table; ``weights`` loads it from safetensors; ``estimator`` is the one histogram ->
MI path (the Donsker-Varadhan read-out, sliced MI); ``refine`` sharpens high-MI estimates by the chain rule;
``aot`` and ``tensor_path`` are the compiled CPU and device-resident CUDA paths; ``significance`` and
``surrogates`` give the estimator's null distribution at a pair's effective sample size. Nothing here knows of
streams, clocks or asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "Estimator": "estimator",
    "estimate_mi": "estimator",
    "estimate_mi_batch": "estimator",
    "sliced_mi": "estimator",
    "NullTable": "significance",
    "SurrogateNulls": "surrogates",
    "rank_transform": "copula",
    "SlidingRanks": "copula",
}
__all__ = [
    "Estimator",
    "NullTable",
    "SlidingRanks",
    "SurrogateNulls",
    "estimate_mi",
    "estimate_mi_batch",
    "rank_transform",
    "sliced_mi",
]

if TYPE_CHECKING:
    from .copula import SlidingRanks, rank_transform
    from .estimator import Estimator, estimate_mi, estimate_mi_batch, sliced_mi
    from .significance import NullTable
    from .surrogates import SurrogateNulls

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
