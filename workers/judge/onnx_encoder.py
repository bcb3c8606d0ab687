"""all-MiniLM-L6-v2 on onnxruntime, in float32 or with int8 weight products: the fast encoder.

The graph is built from the installed weights (``workers.judge.onnx_graph``), quantised when int8 is
asked for, and written to a cache folder under a name derived from a hash of the weights, the
graph's version and (for int8) the quantiser's version: the first start of a process builds it
(a few seconds), later ones load the file. Nothing is downloaded and nothing is committed.

Why int8: the matrix products are four fifths of the work, and onnxruntime's int8 kernels (VNNI,
AMX where the CPU has them) do about twice the float32 work per CPU second here, attention and
element-wise work included. The activations are quantised per batch at run time ("dynamic"), the
weights per output channel, which keeps the embeddings within a cosine of about 0.99 of float32's
(see docs/performance.md for the figures and the grades' agreement).

Threads: one onnxruntime thread per call, with batches spread over worker threads as the numpy
encoder does (``TextEncoder.encode``): on cores shared with other processes, onnxruntime's own
thread pool spends its time waiting for its slowest thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.primitives.keys import composite_key
from workers.judge.onnx_graph import (
    ATTENTION_MASK,
    INPUT_IDS,
    OUTPUT,
    QUANTISABLE_PREFIX,
    build_minilm_graph,
)
from workers.judge.text_encoder import F32, ModelFolder, TextEncoder, default_model_dir

log = logging.getLogger(__name__)

Precision = Literal["int8", "fp32"]

# Bump when the graph or its quantisation changes, so cached files of the old one are not used.
GRAPH_VERSION = "1"

# Products left in float32 by the int8 graph. The first layer's feed-forward down-projection reads
# the widest-ranging activations of the model, and one scale per batch serves them worst: leaving
# it (a twentieth of the work) in float32 raised the lowest cosine with float32 over 400 SciFact
# abstracts from 0.991 to 0.994.
KEEP_FLOAT32 = (f"{QUANTISABLE_PREFIX}l0_ff2_",)
_CACHE_APP_DIR = "retrieval-monitor"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/retrieval-monitor/local-judge`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / _CACHE_APP_DIR / "local-judge"


@dataclass(frozen=True, slots=True)
class StartUp:
    """How the encoder got its graph: built (and quantised) now, or read from the cache."""

    built: bool
    seconds: float
    path: Path | None  # None when the cache folder could not be written


class OnnxMiniLMEncoder(TextEncoder):
    """Sentence embeddings of all-MiniLM-L6-v2 computed by onnxruntime."""

    def __init__(
        self, session: Any, tokenizer: Any, *, precision: Precision, max_tokens: int, start: StartUp
    ) -> None:
        dim = int(session.get_outputs()[0].shape[-1])
        super().__init__(tokenizer, dim=dim, max_tokens=max_tokens)
        self._session = session
        self.precision = precision
        self.backend = f"onnx-{precision}"
        self.start = start

    @classmethod
    def load(
        cls,
        model_dir: Path | None = None,
        *,
        precision: Precision = "int8",
        cache_dir: Path | None = None,
        threads: int | None = None,
    ) -> OnnxMiniLMEncoder:
        """Load (building and caching on first use) the graph for the weights in ``model_dir``.

        ``cache_dir`` defaults to ``default_cache_dir()``; when it cannot be written the graph
        is built in a temporary folder on every start instead.
        """
        import onnxruntime

        started = time.perf_counter()
        folder = ModelFolder.read(default_model_dir() if model_dir is None else Path(model_dir))
        cache = default_cache_dir() if cache_dir is None else Path(cache_dir)
        key = cache_key(folder, precision)
        path = cache / f"all-minilm-l6-v2-{precision}-{key}.onnx"
        built = False
        kept: Path | None = path
        if not path.is_file():
            built = True
            try:
                cache.mkdir(parents=True, exist_ok=True)
                _build(folder, precision, path)
            except OSError as exc:
                log.warning(
                    "cannot write the local judge's graph to %s (%s); building it in a "
                    "temporary folder, as on every start until it can",
                    path,
                    exc,
                )
                kept = None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # its warnings about the graph are about its own fusions
        if kept is None:
            with tempfile.TemporaryDirectory() as scratch:
                temporary = Path(scratch) / path.name
                _build(folder, precision, temporary)
                session = onnxruntime.InferenceSession(
                    str(temporary), options, providers=["CPUExecutionProvider"]
                )
        else:
            session = onnxruntime.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        encoder = cls(
            session,
            folder.tokenizer(),
            precision=precision,
            max_tokens=folder.max_tokens,
            start=StartUp(built=built, seconds=time.perf_counter() - started, path=kept),
        )
        if threads is not None:
            encoder.threads = max(1, threads)
        return encoder

    def _forward(self, ids: npt.NDArray[np.int64], lengths: npt.NDArray[np.int_]) -> F32:
        mask = (np.arange(ids.shape[1]) < lengths[:, None]).astype(np.int64)
        (vectors,) = self._session.run([OUTPUT], {INPUT_IDS: ids, ATTENTION_MASK: mask})
        result: F32 = np.asarray(vectors, dtype=np.float32)
        return result


def cache_key(folder: ModelFolder, precision: Precision) -> str:
    """Hash of what the cached graph depends on: weights, config, graph and quantiser versions."""
    import onnxruntime

    digest = hashlib.sha256()
    with folder.weights_path.open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    digest.update((folder.path / "config.json").read_bytes())
    digest.update(composite_key(str(GRAPH_VERSION), precision, str(folder.max_tokens)).encode())
    if precision == "int8":
        digest.update(onnxruntime.__version__.encode())
    return digest.hexdigest()[:16]


def _build(folder: ModelFolder, precision: Precision, path: Path) -> None:
    """Write the graph to ``path`` atomically (a concurrent start sees the whole file or none)."""
    import onnx

    model = build_minilm_graph(
        folder.weights(),
        num_heads=folder.num_heads,
        layer_norm_eps=folder.layer_norm_eps,
        max_tokens=folder.max_tokens,
    )
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if precision == "int8":
            _quantise(model, partial)
        else:
            onnx.save(model, str(partial))
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def _quantise(model: Any, path: Path) -> None:
    """Dynamic int8: weights per output channel, activations per batch at run time."""
    if not any(n.name.startswith(KEEP_FLOAT32) for n in model.graph.node):
        raise ValueError(f"the graph has no {KEEP_FLOAT32} product to keep in float32")
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    chosen = [
        n.name
        for n in model.graph.node
        if n.name.startswith(QUANTISABLE_PREFIX) and not n.name.startswith(KEEP_FLOAT32)
    ]
    # The quantiser suggests "pre-processing" through the root logger; the graph needs none.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            model,
            path,
            weight_type=QuantType.QInt8,
            per_channel=True,
            nodes_to_quantize=chosen,
            # Its type inference stops at the Attention operator (not a standard one).
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        root.setLevel(level)
