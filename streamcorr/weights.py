"""Saving and loading InfoNet weights as safetensors (no pickle), config in the metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import ModelLoadError
from .model import InfoNet, InfoNetConfig

DEFAULT_WEIGHTS = Path(__file__).parent / "data" / "infonet.safetensors"


def save_weights(model: InfoNet, path: Path, meta: dict[str, Any]) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"streamcorr": json.dumps(meta)})


def load_model(path: Path | str | None = None, device: str | torch.device = "cpu") -> tuple[InfoNet, dict[str, Any]]:
    """Build InfoNet from a safetensors file; returns the model (eval mode) and its metadata."""
    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        msg = f"model weights not found at {path}; reinstall streamcorr or pass weights=<path to .safetensors>"
        raise ModelLoadError(msg)
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["streamcorr"])
        tensors = load_file(str(path), device=str(device))
        model = InfoNet(InfoNetConfig(**meta["config"]))
        model.load_state_dict(tensors)
    except (SafetensorError, KeyError, json.JSONDecodeError, TypeError, RuntimeError, OSError) as exc:
        msg = f"could not load InfoNet weights from {path}: {exc}; the file is corrupt or from another version"
        raise ModelLoadError(msg) from exc
    return model.to(device).eval(), meta
