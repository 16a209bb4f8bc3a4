"""The decoder in ONNX Runtime contrib ops, the layout onnxruntime-genai uses for CPU.

GroupQueryAttention (rotary inside, past and present sharing one [b, kv_heads, max_context, d]
buffer per layer that the engine binds as both input and output), SimplifiedLayerNormalization /
SkipSimplifiedLayerNormalization, fused QKV and gate/up projections, and int8 linear layers whose
result for a row does not depend on the rest of the batch: MatMulNBits bits=8 (accuracy_level=4:
activations quantized per row block) or, with block "row", MatMulIntegerToFloat over weights with
one scale per output channel and activations quantized per row in the graph; or MatMulNBits bits=4 in
blocks of 16 or 32 (the block sizes where its one-row and many-row kernels agree). Optional q/k/v
biases (Qwen2) are added after the fused projection; optional per-head q/k RMSNorms (Qwen3) are applied
to the split projection before GroupQueryAttention's rotary. A model trained on part of the vocabulary
(service.engine.compact) keeps both tables compact: the embedding gathered through an id -> row table, the
head computing only the ids the model writes, the rest given UNSEEN_LOGIT. Inputs: input_ids [b, s],
attention_mask [b, past + s]; outputs logits [b, 1, vocab] (last position) and present.{i}.key/.value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from service.engine.compact import EMBED_INDEX, HEAD_IDS, UNSEEN_LOGIT
from service.engine.config import (
    INT8_BLOCK_NAMES,
    INT8_BLOCK_SIZE,
    INT8_BLOCK_SIZES,
    INT8_PER_ROW,
    DecoderConfig,
)
from service.engine.cpu import cpu_features
from service.engine.graph_util import FLOAT, INT64, GraphWriter, tensor_info
from service.engine.weights import rope_tables

MS = "com.microsoft"


def _symmetric_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes of x along its last axis (-127..127) and their float32 scales, one per vector
    along that axis (1 for an all-zero vector)."""
    scale = np.abs(x).max(axis=-1) / 127.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    return np.clip(np.rint(x / scale[..., None]), -127, 127).astype(np.int8), scale


def _around_128(q: np.ndarray) -> np.ndarray:
    """int8 codes stored as uint8 with zero point 128."""
    return (q.astype(np.int16) + 128).astype(np.uint8)


# Rows quantized at a time: a head of 201,088 x 2,880 would otherwise take a few float32 copies of itself in
# temporaries (padding, division, rounding); each row's codes are the same either way.
_QUANTIZE_ELEMENTS = 1 << 24


def _by_rows(
    w: np.ndarray, quantize: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """`quantize` applied to w [N, K] a chunk of rows at a time, the codes and scales concatenated along N."""
    rows = max(1, _QUANTIZE_ELEMENTS // max(1, w.shape[1]))
    if w.shape[0] <= rows:
        return quantize(w)
    parts = [quantize(w[i : i + rows]) for i in range(0, w.shape[0], rows)]
    return np.concatenate([q for q, _ in parts]), np.concatenate([s for _, s in parts])


def quantize_blockwise_int8(w: np.ndarray, block: int = INT8_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 8-bit blocks along K of w [N, K] (HF [out, in]): MatMulNBits B (uint8, zero point 128)
    and scales. The zero points are left out: MatMulNBits then takes 128 for every block, which gives
    the same results bit for bit and saves a byte per block that every decoded token would read."""

    def chunk(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, k = rows.shape
        kb = -(-k // block)
        padded = np.zeros((n, kb * block), dtype=np.float32)
        padded[:, :k] = rows
        q, scale = _symmetric_int8(padded.reshape(n, kb, block))
        return _around_128(q), scale.reshape(-1)

    return _by_rows(w, chunk)


def check_block_size(block: int) -> int:
    if block not in INT8_BLOCK_SIZES:
        raise ValueError(f"int8 block size must be one of {', '.join(INT8_BLOCK_NAMES)}, not {block}")
    return block


# MatMulNBits bits=4 (accuracy level 4) gives a row the same bits alone as in a batch only for blocks of 16 and
# 32 (measured with onnxruntime 1.32 on AVX-512 VNNI: at 64 and 128 the one-row and many-row kernels round
# differently; tests/test_importers.py). Without VNNI the engine decodes such a model one sequence at a time.
INT4_BLOCK_SIZES = (16, 32)


def check_int4_block_size(block: int) -> int:
    if block not in INT4_BLOCK_SIZES:
        sizes = ", ".join(map(str, INT4_BLOCK_SIZES))
        raise ValueError(
            f"int4 weights decode batch-invariantly only in blocks of {sizes} (MatMulNBits), not "
            f"{'row' if block == INT8_PER_ROW else block}"
        )
    return block


def quantize_blockwise_int4(w: np.ndarray, block: int = INT8_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 4-bit blocks along K of w [N, K] (HF [out, in]): MatMulNBits B [N, blocks, block / 2] (two codes
    a byte, the even index in the low nibble, zero point 8, which MatMulNBits takes when none is given) and
    scales. A block's largest-magnitude value maps to -8 exactly (scale = that value / -8), so the codes use the
    full range -8..7, as llama.cpp's Q4_0 and onnxruntime's symmetric 4-bit quantizer do."""
    check_int4_block_size(block)

    def chunk(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, k = rows.shape
        kb = -(-k // block)
        padded = np.zeros((n, kb * block), dtype=np.float32)
        padded[:, :k] = rows
        blocks = padded.reshape(n, kb, block)
        peak = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        scale = np.where(peak == 0, 1.0, peak / -8.0).astype(np.float32)
        codes = (np.clip(np.rint(blocks / scale[..., None]), -8, 7) + 8).astype(np.uint8)
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), scale.reshape(-1)

    return _by_rows(w, chunk)


def contrib_int4_scheme(block: int) -> dict[str, Any]:
    """config.json's description of graph_contrib's int4 weights (the head stays int8 in the same blocks)."""
    return {
        "scheme": "matmulnbits_int4",
        "op": "com.microsoft.MatMulNBits",
        "bits": 4,
        "block_size": block,
        "symmetric": True,
        "accuracy_level": 4,
        "activation_type": "int8 (dynamic, per row block)",
        "lm_head": {"bits": 8, "block_size": block},
        "built_for_kernel": cpu_features().int8_kernel,
    }


def quantize_rows_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with one scale per row of w [N, K] (per output channel): B [K, N] int8 and scales [N]."""
    q, scale = _by_rows(w, _symmetric_int8)
    return np.ascontiguousarray(q.T), scale


def row_int8_kernel() -> str:
    """The MLAS QGEMM a per-row int8 model is built for on this CPU (CpuFeatures.row_int8_qgemm)."""
    return cpu_features().row_int8_qgemm


def row_zero_points(g: GraphWriter, like: str) -> str:
    """128 as uint8, shaped [b, s, 1] after `like` [b, s] (input_ids): the zero points row_int8_linear's
    QuantizeLinear takes, one per row (a blocked QuantizeLinear wants them shaped as its scales). Made once
    per run and shared by every linear layer."""
    shape = g.op("Concat", [g.op("Shape", [like]), g.const([1])], axis=0)
    value = onnx.helper.make_tensor("value", onnx.TensorProto.UINT8, [1], [128])
    return str(g.op("ConstantOfShape", [shape], value=value))


def row_int8_linear(
    g: GraphWriter, x: str, name: str, weight: np.ndarray, out: str | None = None, zero_points: str | None = None
) -> str:
    """x @ weight.T with per-output-channel int8 weights and x quantized per row (symmetric, 127 levels, stored
    as uint8 around 128): exact int32 sums in MatMulIntegerToFloat (times the weight scales), then times the
    row's scale. Every step is row-wise and the sums are exact, so a row's output is the same bits whatever
    else is in the batch or the run.

    With `zero_points` (row_zero_points; opset 21) the row is quantized by one blocked QuantizeLinear (a block
    is the whole row) instead of Div, Round, Add and Cast: the same IEEE division and round-half-to-even, so
    the same bytes, in one pass over the activations instead of four (prefill and large batches gain most).
    `model quantize` keeps the four nodes: it rewrites graphs of any opset."""
    q, w_scale = quantize_rows_int8(weight)
    zero = g.const(128, np.uint8)
    if row_int8_kernel() == "u8s8":
        b, b_zero = g.weight(name + ".qweight", q), ""
    else:
        b, b_zero = g.weight(name + ".qweight", _around_128(q)), zero
    amax = _row_amax(g, x, opset21=zero_points is not None)
    x_scale = g.op("Div", [g.op("Max", [amax, g.const(1e-30, np.float32)]), g.const(127.0, np.float32)])
    if zero_points is not None:
        x_q = g.op("QuantizeLinear", [x, x_scale, zero_points], axis=-1, block_size=weight.shape[1])
    else:
        x_q = g.op("Add", [g.op("Round", [g.op("Div", [x, x_scale])]), g.const(128.0, np.float32)])
        x_q = g.op("Cast", [x_q], to=onnx.TensorProto.UINT8)  # integers in [1, 255]: exact
    ins = [x_q, b, g.const(1.0, np.float32), g.weight(name + ".scales", w_scale), zero]
    y = g.op("MatMulIntegerToFloat", ins + ([b_zero] if b_zero else []), domain=MS)
    if out is None:
        return str(g.op("Mul", [y, x_scale]))
    g.op_named("Mul", [y, x_scale], [out])
    return out


def _row_amax(g: GraphWriter, x: str, *, opset21: bool) -> str:
    """max |x| over each row, kept as [.., 1] (ReduceMax takes its axes as an input from opset 18 on)."""
    if opset21:
        return str(g.op("ReduceMax", [g.op("Abs", [x]), g.const([-1])], keepdims=1))
    return str(g.op("ReduceMax", [g.op("Abs", [x])], axes=[-1], keepdims=1))


def linear_op(
    g: GraphWriter,
    x: str,
    name: str,
    weight: np.ndarray,
    *,
    quantize: bool,
    block: int = INT8_BLOCK_SIZE,
    zero_points: str | None = None,
    bits: int = 8,
) -> str:
    """x @ weight.T for weight [N, K] (HF [out, in]): int8 in blocks of `block` (MatMulNBits) or per row, int4 in
    blocks (`bits` 4), or fp32 MatMul. `zero_points`: see row_int8_linear."""
    n, k = weight.shape
    if not quantize:
        return str(g.op("MatMul", [x, g.weight(name + ".weight_t", weight.T)]))
    if bits == 4:
        b, scales = quantize_blockwise_int4(weight, block)
    elif bits != 8:
        raise ValueError(f"linear layers are fp32, int8 or int4, not {bits}-bit")
    elif block == INT8_PER_ROW:
        return row_int8_linear(g, x, name, weight, zero_points=zero_points)
    else:
        b, scales = quantize_blockwise_int8(weight, check_block_size(block))
    ins = [x, g.weight(name + ".qweight", b), g.weight(name + ".scales", scales)]
    return str(g.op("MatMulNBits", ins, domain=MS, K=k, N=n, bits=bits, block_size=block, accuracy_level=4))


def scatter_head(g: GraphWriter, logits: str, ids: np.ndarray, vocab_size: int) -> str:
    """Logits [b, 1, n] of a compact head (row i is id ids[i]) as [b, 1, vocab_size], UNSEEN_LOGIT for every
    other id: scattered into a row of UNSEEN_LOGIT (ScatterElements; a Gather of the whole vocabulary through an
    id -> slot table is many times slower on the CPU)."""
    shape = g.op("Shape", [logits])
    base = g.weight("lm_head.unseen_logits", np.full((1, 1, vocab_size), UNSEEN_LOGIT, dtype=np.float32))
    rows = g.op("Concat", [g.op("Slice", [shape, g.const([0]), g.const([2])]), g.const([vocab_size])], axis=0)
    where = g.weight(HEAD_IDS, np.asarray(ids, dtype=np.int64).reshape(1, 1, -1))
    return str(g.op("ScatterElements", [g.op("Expand", [base, rows]), g.op("Expand", [where, shape]), logits], axis=2))


def skip_norm_op(g: GraphWriter, x: str, residual: str, name: str, weight: np.ndarray, eps: float) -> tuple[str, str]:
    """(RMS-normalized x + residual, x + residual) in one SkipSimplifiedLayerNormalization."""
    ins = [x, residual, g.weight(name, weight)]
    outs = g.op("SkipSimplifiedLayerNormalization", ins, n_out=4, domain=MS, epsilon=eps)
    return outs[0], outs[3]


def build_contrib_graph(
    config: DecoderConfig,
    w: Mapping[str, np.ndarray],
    *,
    quantize: bool = True,
    block: int = INT8_BLOCK_SIZE,
    bits: int = 8,
    writer: GraphWriter | None = None,
) -> onnx.ModelProto:
    """Weights `w` in HF names/layout (any mapping: a lazy one reads each weight when the graph needs it);
    quantize=False keeps fp32 MatMuls (for exact reference tests); `block`: the quantized weights' block size
    along K, or INT8_PER_ROW (int8 only); `bits`: 8, or 4 for the layers' projections (the head stays int8).
    `writer`: where the tensors go (graph_gptoss.ExternalWriter streams the large ones to a data file as they
    are made, so a big model is never whole in memory); a plain GraphWriter by default."""
    c = config
    g = writer or GraphWriter()
    d, nh, kvh = c.head_dim, c.num_heads, c.num_kv_heads
    if quantize and bits == 4:
        check_int4_block_size(block)
    # Per row, the activations are quantized by blocked QuantizeLinear (opset 21), whose zero points are shaped
    # [b, rows, 1]: one tensor for every position, then the last position's for the head.
    per_row = quantize and block == INT8_PER_ROW
    zero_points = row_zero_points(g, "input_ids") if per_row else None

    def linear(x: str, name: str, weight: np.ndarray, layer_bits: int = bits) -> str:
        return linear_op(g, x, name, weight, quantize=quantize, block=block, zero_points=zero_points, bits=layer_bits)

    def head_norm(x: str, heads: int, name: str) -> str:
        """RMSNorm over each head's d values of x [b, s, heads * d] (Qwen3's q_norm/k_norm): row-wise."""
        per_head = g.op("Reshape", [x, g.const([0, 0, heads, d])])
        normed = g.op(
            "SimplifiedLayerNormalization", [per_head, g.weight(name, w[name])], axis=-1, epsilon=c.rms_norm_eps
        )
        return str(g.op("Reshape", [normed, g.const([0, 0, heads * d])]))

    def skip_norm(x: str, residual: str, name: str) -> tuple[str, str]:
        return skip_norm_op(g, x, residual, name, w[name], c.rms_norm_eps)

    rows: str = "input_ids"
    if EMBED_INDEX in w:  # a compact table: its row for each id first
        rows = g.op("Gather", [g.weight(EMBED_INDEX, w[EMBED_INDEX].astype(np.int32)), "input_ids"])
    x = g.op("Gather", [g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"]), rows])
    cos_t, sin_t = rope_tables(c)
    cos, sin = g.weight("rope.cos", cos_t), g.weight("rope.sin", sin_t)
    # GQA wants the last valid index per row and the total length, as int32.
    seqlens = g.op("Sub", [g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0), g.const(1)])
    seqlens = g.op("Cast", [seqlens], to=onnx.TensorProto.INT32)
    total = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)], axis=0)
    total = g.op("Cast", [total], to=onnx.TensorProto.INT32)

    name0 = "model.layers.0.input_layernorm.weight"
    hdn = g.op("SimplifiedLayerNormalization", [x, g.weight(name0, w[name0])], axis=-1, epsilon=c.rms_norm_eps)
    residual = x
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        if i > 0:
            hdn, residual = skip_norm(x, residual, p + "input_layernorm.weight")
        qkv_w = np.concatenate([w[p + f"self_attn.{m}_proj.weight"] for m in "qkv"], axis=0)
        qkv = linear(hdn, p + "self_attn.qkv_proj", qkv_w)
        if p + "self_attn.q_proj.bias" in w:  # Qwen2: q/k/v biases, one Add (row-wise: batch-invariant)
            qkv_b = np.concatenate([w[p + f"self_attn.{m}_proj.bias"] for m in "qkv"])
            qkv = g.op("Add", [qkv, g.weight(p + "self_attn.qkv_proj.bias", qkv_b)])
        query, key, value = qkv, "", ""
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: q and k normalized per head, then GQA's rotary
            q, k, value = g.op("Split", [qkv, g.const([nh * d, kvh * d, kvh * d])], n_out=3, axis=-1)
            query = head_norm(q, nh, p + "self_attn.q_norm.weight")
            key = head_norm(k, kvh, p + "self_attn.k_norm.weight")
        ctx = g.op(
            "GroupQueryAttention",
            [query, key, value, f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total, cos, sin],
            n_out=3,
            domain=MS,
            num_heads=nh,
            kv_num_heads=kvh,
            scale=float(1 / np.sqrt(d)),
            do_rotary=1,
            rotary_interleaved=0,
            # a sliding window (Mistral v0.1) is a mask over the full cache: HF's window, as graph_gptoss's
            local_window_size=c.attention_window or -1,
        )
        g.nodes[-1].output[1] = f"present.{i}.key"
        g.nodes[-1].output[2] = f"present.{i}.value"
        x = linear(ctx[0], p + "self_attn.o_proj", w[p + "self_attn.o_proj.weight"])
        hdn, residual = skip_norm(x, residual, p + "post_attention_layernorm.weight")
        gate_up = linear(
            hdn,
            p + "mlp.gate_up_proj",
            np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], axis=0),
        )
        gate, up = g.op("Split", [gate_up, g.const([c.intermediate_size, c.intermediate_size])], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        x = linear(act, p + "mlp.down_proj", w[p + "mlp.down_proj.weight"])

    # Only the last position's logits: slice before the final norm and the (large) head.
    last = g.last_position(x)
    last_res = g.last_position(residual)
    hdn, _ = skip_norm(last, last_res, "model.norm.weight")
    if zero_points is not None:  # linear() reads it when called: the head's rows are the last positions
        zero_points = g.last_position(zero_points)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    logits = linear(hdn, "lm_head", head, 8)
    if HEAD_IDS in w:
        logits = scatter_head(g, logits, w[HEAD_IDS], c.vocab_size)
    g.op_named("Identity", [logits], ["logits"])

    kv: list[int | str] = ["batch", kvh, "max_context", d]
    inputs = [
        tensor_info("input_ids", INT64, ["batch", "seq"]),
        tensor_info("attention_mask", INT64, ["batch", "total_seq"]),
    ]
    outputs = [tensor_info("logits", FLOAT, ["batch", 1, c.vocab_size])]
    for i in range(c.num_layers):
        inputs += [tensor_info(f"past_key_values.{i}.{kind}", FLOAT, kv) for kind in ("key", "value")]
        outputs += [tensor_info(f"present.{i}.{kind}", FLOAT, kv) for kind in ("key", "value")]
    return g.model(inputs, outputs, {"": 21 if per_row else 17, MS: 1})
