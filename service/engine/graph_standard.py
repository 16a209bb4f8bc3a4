"""A Llama-style decoder-with-past in standard ONNX ops (opset 17), the common Optimum layout.

Inputs: input_ids [b, s], attention_mask [b, past + s], position_ids [b, s] (int64) and
past_key_values.{i}.key/.value [b, kv_heads, past, head_dim]; outputs logits [b, s', vocab]
(s' = s, or 1 when only the last position's logits are computed) and present.{i}.key/.value.
Linear weights are stored pre-transposed ([in, out]) so every projection, the tied lm_head
included, is a MatMul by a constant that quantize_dynamic turns into int8.
"""

from __future__ import annotations

import numpy as np
import onnx

from service.engine.config import DecoderConfig
from service.engine.graph_util import FLOAT, INT64, GraphWriter, tensor_info
from service.engine.weights import rope_tables

LM_HEAD = "lm_head.weight_t"  # [hidden, vocab]; with tied embeddings also the embedding table (Gather axis 1)
NEG_INF = -1e9  # additive mask; finite so an all-masked row cannot produce NaN


def transposed_name(hf_name: str) -> str:
    return hf_name + "_t"


def rms_norm(g: GraphWriter, x: str, weight: str, eps: float) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div: the pattern ORT fuses into SimplifiedLayerNormalization.
    var = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0, np.float32)])], axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.const(eps, np.float32)])])
    return g.op("Mul", [g.op("Div", [x, std]), weight])


def rope(g: GraphWriter, t: str, cos: str, sin: str, half: int) -> str:
    """Rotate-half RoPE of t [b, heads, s, d] with cos/sin [b, 1, s, d/2]."""
    a = g.op("Slice", [t, g.const([0]), g.const([half]), g.const([3])])
    b = g.op("Slice", [t, g.const([half]), g.const([2 * half]), g.const([3])])
    first = g.op("Sub", [g.op("Mul", [a, cos]), g.op("Mul", [b, sin])])
    second = g.op("Add", [g.op("Mul", [b, cos]), g.op("Mul", [a, sin])])
    return g.op("Concat", [first, second], axis=3)


def heads(g: GraphWriter, x: str, n: int, d: int) -> str:
    """[b, s, n*d] -> [b, n, s, d]."""
    return g.op("Transpose", [g.op("Reshape", [x, g.const([0, 0, n, d])])], perm=[0, 2, 1, 3])


def build_standard_graph(
    config: DecoderConfig, w: dict[str, np.ndarray], *, all_logits: bool = False
) -> onnx.ModelProto:
    """The graph for weights `w` in HF names/layout (see weights.random_weights)."""
    c = config
    g = GraphWriter()
    d, half = c.head_dim, c.head_dim // 2
    nh, kvh, grp = c.num_heads, c.num_kv_heads, c.group_size

    def linear(x: str, hf_name: str) -> str:
        return g.op("MatMul", [x, g.weight(transposed_name(hf_name), w[hf_name].T)])

    # Embedding; tied: gather columns of the pre-transposed lm_head so one table serves both.
    if c.tie_embeddings:
        g.weight(LM_HEAD, w["model.embed_tokens.weight"].T)
        cols = g.op("Gather", [LM_HEAD, "input_ids"], axis=1)  # [H, b, s]
        x = g.op("Transpose", [cols], perm=[1, 2, 0])
    else:
        emb = g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"])
        g.weight(LM_HEAD, w["lm_head.weight"].T)
        x = g.op("Gather", [emb, "input_ids"], axis=0)

    # RoPE tables gathered by position: [b, 1, s, d/2].
    cos_t, sin_t = rope_tables(c)
    cos = g.op("Unsqueeze", [g.op("Gather", [g.weight("rope.cos", cos_t), "position_ids"]), g.const([1])])
    sin = g.op("Unsqueeze", [g.op("Gather", [g.weight("rope.sin", sin_t), "position_ids"]), g.const([1])])

    # Additive mask [b, 1, grp*s, total]: causal over absolute positions, and the padding mask.
    total = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)], axis=0)
    past = g.op("Gather", [g.op("Shape", ["past_key_values.0.key"]), g.const(2)], axis=0)
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(1)], axis=0)
    kidx = g.op("Range", [g.const(0), total, g.const(1)])
    qidx = g.op("Range", [past, g.op("Add", [past, seq]), g.const(1)])
    causal = g.op("LessOrEqual", [g.op("Unsqueeze", [kidx, g.const([0])]), g.op("Unsqueeze", [qidx, g.const([1])])])
    pad = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=onnx.TensorProto.BOOL), g.const([1, 2])])
    allowed = g.op("And", [causal, pad])
    mask = g.op("Where", [allowed, g.const(0.0, np.float32), g.const(NEG_INF, np.float32)])
    mask = g.op("Tile", [mask, g.const([1, 1, grp, 1])])
    scale = g.const(1.0 / np.sqrt(d), np.float32)

    outputs = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        hdn = rms_norm(g, x, g.weight(p + "input_layernorm.weight", w[p + "input_layernorm.weight"]), c.rms_norm_eps)
        q = rope(g, heads(g, linear(hdn, p + "self_attn.q_proj.weight"), nh, d), cos, sin, half)
        k = rope(g, heads(g, linear(hdn, p + "self_attn.k_proj.weight"), kvh, d), cos, sin, half)
        v = heads(g, linear(hdn, p + "self_attn.v_proj.weight"), kvh, d)
        pk, pv = f"present.{i}.key", f"present.{i}.value"
        g.op_named("Concat", [f"past_key_values.{i}.key", k], [pk], axis=2)
        g.op_named("Concat", [f"past_key_values.{i}.value", v], [pv], axis=2)
        # GQA without repeating K/V: fold each KV head's query group into the row axis.
        qg = g.op("Reshape", [q, g.const([0, kvh, -1, d])])  # [b, kvh, grp*s, d]
        scores = g.op("MatMul", [qg, g.op("Transpose", [pk], perm=[0, 1, 3, 2])])
        scores = g.op("Add", [g.op("Mul", [scores, scale]), mask])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), pv])  # [b, kvh, grp*s, d]
        ctx = g.op("Transpose", [g.op("Reshape", [ctx, g.const([0, nh, -1, d])])], perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, g.const([0, 0, nh * d])])
        x = g.op("Add", [x, linear(ctx, p + "self_attn.o_proj.weight")])
        pn = p + "post_attention_layernorm.weight"
        hdn = rms_norm(g, x, g.weight(pn, w[pn]), c.rms_norm_eps)
        gate = linear(hdn, p + "mlp.gate_proj.weight")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), linear(hdn, p + "mlp.up_proj.weight")])
        x = g.op("Add", [x, linear(act, p + "mlp.down_proj.weight")])
        outputs += [pk, pv]

    if not all_logits:  # decode and prefill only ever need the last position
        x = g.last_position(x)
    x = rms_norm(g, x, g.weight("model.norm.weight", w["model.norm.weight"]), c.rms_norm_eps)
    g.op_named("MatMul", [x, LM_HEAD], ["logits"])

    kv_shape: list[int | str] = ["batch", kvh, "past_seq", d]
    inputs = [
        tensor_info("input_ids", INT64, ["batch", "seq"]),
        tensor_info("attention_mask", INT64, ["batch", "total_seq"]),
        tensor_info("position_ids", INT64, ["batch", "seq"]),
    ]
    outs = [tensor_info("logits", FLOAT, ["batch", "seq" if all_logits else 1, c.vocab_size])]
    for i in range(c.num_layers):
        inputs += [tensor_info(f"past_key_values.{i}.{kind}", FLOAT, kv_shape) for kind in ("key", "value")]
        outs += [tensor_info(f"present.{i}.{kind}", FLOAT, ["batch", kvh, "total_seq", d]) for kind in ("key", "value")]
    return g.model(inputs, outs, {"": 17})


def weights_from_standard(model: onnx.ModelProto, config: DecoderConfig) -> dict[str, np.ndarray]:
    """Read HF-layout weights back from an fp32 standard graph's initializers (inverse of the builder)."""
    from onnx import numpy_helper

    raw = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w: dict[str, np.ndarray] = {}
    for name, arr in raw.items():
        if name == LM_HEAD:
            w["model.embed_tokens.weight" if config.tie_embeddings else "lm_head.weight"] = arr.T
        elif name.endswith("_t"):
            w[name[:-2]] = arr.T
        elif name.startswith("model."):
            w[name] = arr
    return w
