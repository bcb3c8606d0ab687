"""The all-MiniLM-L6-v2 sentence encoder as an ONNX graph, built from the same weights as numpy's.

The graph computes what ``workers.judge.embedding.MiniLMEncoder`` computes (BERT encoder, mean
pooling over real tokens, L2 normalisation), so the two are checked against each other to float32
rounding; onnxruntime runs it in float32 or after dynamic int8 quantisation of its weight products
(``workers.judge.onnx_encoder``). It is built with ``onnx.helper`` rather than exported from torch,
so nothing beyond the weights is needed and the graph is exactly the one written here.

Self-attention is onnxruntime's ``com.microsoft.Attention`` operator (queries, keys and values
from one product, scaled scores, the padding mask, softmax and the weighted sum in one kernel):
spelled out in standard operators, the mask addition, split and transposes over the
(batch, heads, width, width) scores took more time than the int8 products around them, and the
quantiser turns this operator into ``QAttention`` with an int8 projection.

Inputs: ``input_ids`` (batch, width) int64 and ``attention_mask`` (batch, width) int64, 1 on real
tokens. Output: ``embeddings`` (batch, hidden) float32, unit length.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

# LayerNormalization is a standard operator from opset 17 on (onnxruntime 1.14 and newer).
OPSET = 17
IR_VERSION = 8

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
OUTPUT = "embeddings"

# Node names of the products that carry weights: the ones dynamic quantisation turns into int8.
QUANTISABLE_PREFIX = "weights_"


class _Builder:
    """Collects nodes and initialisers under unique names."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self._helper = helper
        self._numpy_helper = numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, stem: str, value: npt.ArrayLike, dtype: type = np.float32) -> str:
        name = self.name(stem)
        array: npt.NDArray[Any] = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        self.initializers.append(self._numpy_helper.from_array(array, name))
        return name

    def op(
        self,
        op_type: str,
        inputs: list[str],
        stem: str | None = None,
        *,
        output: str | None = None,
        **attrs: Any,
    ) -> str:
        node_name = self.name(stem or op_type.lower())
        out = output or node_name
        self.nodes.append(self._helper.make_node(op_type, inputs, [out], name=node_name, **attrs))
        return out

    def dense(self, x: str, weight: npt.ArrayLike, bias: npt.ArrayLike, stem: str) -> str:
        """x @ weight + bias, ``weight`` shaped (in, out)."""
        product = self.op("MatMul", [x, self.const(stem, weight)], QUANTISABLE_PREFIX + stem)
        return self.op("Add", [product, self.const(stem + "_bias", bias)])

    def layer_norm(self, x: str, gamma: npt.ArrayLike, beta: npt.ArrayLike, eps: float) -> str:
        inputs = [x, self.const("ln_gamma", gamma), self.const("ln_beta", beta)]
        return self.op("LayerNormalization", inputs, axis=-1, epsilon=eps)


def build_minilm_graph(
    weights: dict[str, npt.NDArray[Any]],
    *,
    num_heads: int,
    layer_norm_eps: float,
    max_tokens: int,
) -> Any:
    """The float32 ``onnx.ModelProto`` of the encoder with these (BERT-named) weights."""
    from onnx import TensorProto, helper

    b = _Builder()
    word = weights["embeddings.word_embeddings.weight"]
    hidden = int(word.shape[1])
    # Token type 0 everywhere, as sentence-transformers feeds it: its row folds into positions.
    position = (
        weights["embeddings.position_embeddings.weight"][:max_tokens]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    width = b.op("Gather", [b.op("Shape", [INPUT_IDS]), b.const("one", [1], np.int64)], axis=0)
    start = b.const("zero", [0], np.int64)
    positions = b.op("Slice", [b.const("position", position), start, width])
    x = b.op("Add", [b.op("Gather", [b.const("word", word), INPUT_IDS], axis=0), positions])
    x = b.layer_norm(
        x,
        weights["embeddings.LayerNorm.weight"],
        weights["embeddings.LayerNorm.bias"],
        layer_norm_eps,
    )
    # The Attention operator takes the (batch, width) 0/1 mask as int32 and gives padded keys
    # a score of -10000 before the softmax: exp of that is 0 in float32, as in the numpy encoder.
    mask_i32 = b.op("Cast", [ATTENTION_MASK], to=TensorProto.INT32)

    index = 0
    while f"encoder.layer.{index}.attention.self.query.weight" in weights:
        p = f"encoder.layer.{index}."

        def w(name: str, prefix: str = p) -> npt.NDArray[Any]:
            return weights[prefix + name]

        qkv_w = np.concatenate([w(f"attention.self.{n}.weight") for n in ("query", "key", "value")])
        qkv_b = np.concatenate([w(f"attention.self.{n}.bias") for n in ("query", "key", "value")])
        context = b.op(
            "Attention",
            [x, b.const(f"l{index}_qkv", qkv_w.T), b.const(f"l{index}_qkv_bias", qkv_b), mask_i32],
            f"{QUANTISABLE_PREFIX}l{index}_attention",
            domain="com.microsoft",
            num_heads=num_heads,
        )
        attended = b.dense(
            context,
            w("attention.output.dense.weight").T,
            w("attention.output.dense.bias"),
            f"l{index}_out",
        )
        x = b.layer_norm(
            b.op("Add", [attended, x]),
            w("attention.output.LayerNorm.weight"),
            w("attention.output.LayerNorm.bias"),
            layer_norm_eps,
        )
        h = b.dense(
            x, w("intermediate.dense.weight").T, w("intermediate.dense.bias"), f"l{index}_ff1"
        )
        # The erf GELU BERT was trained with, h * (1 + erf(h / sqrt 2)) / 2; onnxruntime fuses
        # the pattern (with the bias before it) into one kernel.
        erf = b.op("Erf", [b.op("Div", [h, b.const("sqrt2", math.sqrt(2.0))])])
        h = b.op("Mul", [h, b.op("Add", [erf, b.const("one", 1.0)])])
        h = b.op("Mul", [h, b.const("half", 0.5)])
        h = b.dense(h, w("output.dense.weight").T, w("output.dense.bias"), f"l{index}_ff2")
        x = b.layer_norm(
            b.op("Add", [h, x]),
            w("output.LayerNorm.weight"),
            w("output.LayerNorm.bias"),
            layer_norm_eps,
        )
        index += 1
    if index == 0:
        raise ValueError("the weights hold no encoder layer")

    # The mean over real tokens, then x / max(|x|, 1e-12) as sentence-transformers' Normalize.
    mask_f = b.op("Cast", [ATTENTION_MASK], to=TensorProto.FLOAT)
    token_mask = b.op("Unsqueeze", [mask_f, b.const("axis", [2], np.int64)])
    masked = b.op("Mul", [x, token_mask])
    summed = b.op("ReduceSum", [masked, b.const("axis", [1], np.int64)], keepdims=0)
    counts = b.op("ReduceSum", [mask_f, b.const("axis", [1], np.int64)], keepdims=1)
    pooled = b.op("Div", [summed, counts])
    norm = b.op("ReduceL2", [pooled], axes=[1], keepdims=1)  # axes an attribute until opset 18
    norm = b.op("Max", [norm, b.const("tiny", 1e-12)])
    b.op("Div", [pooled, norm], output=OUTPUT)

    graph = helper.make_graph(
        b.nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch", "width"]),
            helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, ["batch", "width"]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", hidden])],
        b.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = IR_VERSION
    return model
