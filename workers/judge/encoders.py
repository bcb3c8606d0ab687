"""Which encoder the local judge runs: numpy float32 (the reference) or onnxruntime (fp32, int8).

``auto`` takes onnxruntime's int8 encoder when ``onnx`` and ``onnxruntime`` are installed and the
numpy one otherwise. It is decided from what is installed, before any model is loaded, because the
choice is part of the labels' identity (``workers.judge.local.local_prompt_version``).

The two packages are the package's ``onnx`` extra, not a hard dependency, so that ``auto`` has
somewhere to fall back to: an install without them (``pip install retrieval-monitor``) judges with
numpy alone, at float32's labels. The numpy encoder stays a backend rather than a test-only
oracle because it is both: the encoder the default thresholds were fitted with, and the reference
the ONNX graph is checked against (``tests/unit/workers/judge/test_onnx_encoder.py``), which runs
the same token batches through both. The image and ``scripts/bootstrap.sh`` install the extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from workers.judge.text_encoder import TextEncoder

Backend = Literal["numpy", "onnx-fp32", "onnx-int8"]
BACKENDS: tuple[Backend, ...] = ("numpy", "onnx-fp32", "onnx-int8")


def onnx_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def resolve_backend(choice: str) -> Backend:
    """The backend a setting of auto, numpy, onnx-fp32 or onnx-int8 names."""
    if choice == "auto":
        return "onnx-int8" if onnx_available() else "numpy"
    for backend in BACKENDS:
        if choice == backend:
            if backend != "numpy" and not onnx_available():
                raise ModuleNotFoundError(
                    f"the local judge's {backend} encoder needs the onnx and onnxruntime packages"
                )
            return backend
    raise ValueError(f"unknown local judge backend {choice!r}; use auto or one of {BACKENDS}")


def load_encoder(
    backend: Backend, *, cache_dir: Path | None = None, threads: int | None = None
) -> TextEncoder:
    if backend == "numpy":
        from workers.judge.embedding import MiniLMEncoder

        return MiniLMEncoder.load(threads=threads)
    from workers.judge.onnx_encoder import OnnxMiniLMEncoder

    return OnnxMiniLMEncoder.load(
        precision="int8" if backend == "onnx-int8" else "fp32", cache_dir=cache_dir, threads=threads
    )
