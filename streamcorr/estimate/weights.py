"""Saving and loading InfoNet weights as safetensors (no pickle), config in the metadata.

Shipped weights are named: ``infonet-v2`` (the default: v1 grown to two gated smoothers and fine-tuned on
quantised, bounded-noise and high-MI data as well as the paper's mixtures) and ``infonet-v1`` (about 1.2x
faster per pair on a CPU; models/README.md compares them). Anything else passed as weights is a path to a
.safetensors file.

>>> weights_path("infonet-v2").name
'infonet-v2.safetensors'
>>> weights_path(None) == weights_path(DEFAULT_WEIGHTS_NAME)
True

This module imports torch only when it loads or saves, so that the config schema can check names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_WEIGHTS_NAME, SHIPPED_WEIGHTS
from ..errors import ModelLoadError

if TYPE_CHECKING:
    import torch

    from .copula import Ties
    from .model import InfoNet

# One copy of each file lives in models/; streamcorr/data/<name>.safetensors are symlinks to them, which
# setuptools follows when it builds a wheel (package data), so an installed package holds real files.
WEIGHTS_DIR = Path(__file__).parents[1] / "data"
DEFAULT_WEIGHTS = WEIGHTS_DIR / f"{DEFAULT_WEIGHTS_NAME}.safetensors"
# Tie policy for weights whose metadata names none (infonet-v1, trained on continuous data). Jittered ties equal
# mid-ranks on untied data and cut v1's quantised-sensor MAE from 0.093 to 0.015 nats (bench/results/
# estimator_v2_v2.md); weights trained with a policy (infonet-v2: jitter) carry it in their metadata.
DEFAULT_TIES: Ties = "jitter"


def weights_path(weights: str | Path | None) -> Path:
    """The file of a shipped name (``None``: the default), or ``weights`` itself as a path."""
    if weights is None:
        return DEFAULT_WEIGHTS
    if isinstance(weights, str) and weights in SHIPPED_WEIGHTS:
        return WEIGHTS_DIR / f"{weights}.safetensors"
    return Path(weights)


def save_weights(model: InfoNet, path: Path, meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"streamcorr": json.dumps(meta)})


def load_model(path: Path | str | None = None, device: str | torch.device = "cpu") -> tuple[InfoNet, dict[str, Any]]:
    """Build InfoNet from a shipped name or a safetensors file; returns the model (eval mode) and its metadata."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    from .model import InfoNet, InfoNetConfig

    path = weights_path(path)
    if not path.is_file():
        names = ", ".join(SHIPPED_WEIGHTS)
        msg = f"model weights not found at {path}; pass one of {names}, or a path to a .safetensors file"
        raise ModelLoadError(msg)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["streamcorr"])
        tensors = load_file(str(path), device=str(device))
        model = InfoNet(InfoNetConfig(**meta["config"]))
        model.load_state_dict(tensors)
    except (SafetensorError, KeyError, json.JSONDecodeError, TypeError, RuntimeError, OSError) as exc:
        msg = f"could not load InfoNet weights from {path}: {exc}; the file is corrupt or from another version"
        raise ModelLoadError(msg) from exc
    return model.to(device).eval(), meta
