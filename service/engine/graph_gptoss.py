"""gpt-oss as an ONNX Runtime contrib-op graph, in the layout of graph_contrib (the engine feeds both alike).

Per layer: RMSNorm -> fused QKV (+bias) -> GroupQueryAttention (rotary from YaRN cos/sin caches,
`head_sink` = the layer's sinks, `local_window_size` on sliding layers) -> o_proj (+bias) ->
RMSNorm -> router (fp32 MatMul + bias) -> MoE (fp32 experts) or QMoE (int8/int4 block-wise experts),
SwiGLU with gpt-oss's clamp (limit), alpha and the (up + 1) of activation_beta=1, interleaved gate/up
(swiglu_fusion=1), top-k with softmax over the chosen experts (normalize_routing_weights).
Dense projections are MatMulNBits int8 when `quantize_dense`. The KV cache is the shared
[b, kv_heads, max_context, d] buffer of every GQA graph: sliding layers keep whole-context buffers and
the window is a mask, so batching and resume work exactly as for the other graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from service.engine.config import DecoderConfig, ModelMeta, write_config
from service.engine.cpu import cpu_features
from service.engine.gptoss import EXPERT_BLOCK, SLIDING, GptOssSpec, rope_caches
from service.engine.graph_contrib import MS, linear_op, skip_norm_op
from service.engine.graph_util import FLOAT, INT64, GraphWriter, tensor_info
from service.engine.model_files import EXTERNAL_DATA_THRESHOLD, MODEL_FILE, save_model


def quantize_experts(w: np.ndarray, bits: int, block: int = EXPERT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric block-wise codes of w [E, N, K] along K for QMoE: (uint8 [E, N, K*bits/8], scales [E, N, K/block]).

    Zero point is QMoE's default 2^(bits-1); 4-bit codes pack two per byte, low nibble first."""
    e, n, k = w.shape
    if k % block:
        raise ValueError(f"expert input size {k} is not a multiple of the block size {block}")
    qmax = (1 << (bits - 1)) - 1
    blocks = w.reshape(e, n, k // block, block)
    scale = np.abs(blocks).max(axis=3) / qmax
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[..., None]), -qmax, qmax).astype(np.int16) + (1 << (bits - 1))
    codes = q.reshape(e, n, k).astype(np.uint8)
    if bits == 4:
        codes = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    elif bits != 8:
        raise ValueError("expert bits must be 4 or 8")
    return codes, scale


def build_gptoss_graph(
    config: DecoderConfig,
    spec: GptOssSpec,
    w: Mapping[str, np.ndarray],
    *,
    quantize_dense: bool,
    writer: GraphWriter | None = None,
) -> onnx.ModelProto:
    """Weights `w` in HF GptOss names/layouts. spec.expert_bits: None keeps fp32 experts (reference tests)."""
    c = config
    g = writer or GraphWriter()
    d, nh, kvh = c.head_dim, c.num_heads, c.num_kv_heads

    def linear(x: str, name: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        y = linear_op(g, x, name, weight, quantize=quantize_dense)
        return y if bias is None else g.op("Add", [y, g.weight(name + ".bias", bias)])

    def skip_norm(x: str, residual: str, name: str) -> tuple[str, str]:
        return skip_norm_op(g, x, residual, name, w[name], c.rms_norm_eps)

    def experts(x: str, router: str, p: str) -> str:
        gate_up: np.ndarray | None = None
        down: np.ndarray | None = None
        if p + "gate_up_proj" in w:
            gate_up = np.ascontiguousarray(w[p + "gate_up_proj"].transpose(0, 2, 1))  # [E, 2I, H], interleaved rows
            down = np.ascontiguousarray(w[p + "down_proj"].transpose(0, 2, 1))  # [E, H, I]
        attrs: dict[str, Any] = {
            "k": spec.top_k,
            "activation_type": "swiglu",
            "swiglu_fusion": 1,
            "activation_alpha": spec.swiglu_alpha,
            "activation_beta": 1.0,
            "swiglu_limit": spec.swiglu_limit,
            "normalize_routing_weights": 1,
        }
        bias1 = g.weight(p + "gate_up_proj_bias", w[p + "gate_up_proj_bias"])
        bias2 = g.weight(p + "down_proj_bias", w[p + "down_proj_bias"])
        if spec.expert_bits is None:
            assert gate_up is not None and down is not None
            ins = [x, router, g.weight(p + "fc1", gate_up), bias1, g.weight(p + "fc2", down), bias2]
            return str(g.op("MoE", ins, domain=MS, **attrs))
        bits = spec.expert_bits
        if p + "fc1.codes" in w:  # already quantized (random real-shape models: no fp32 experts in memory)
            q1, s1, q2, s2 = (w[p + n] for n in ("fc1.codes", "fc1.scales", "fc2.codes", "fc2.scales"))
        else:
            assert gate_up is not None and down is not None
            q1, s1 = quantize_experts(gate_up, bits)
            q2, s2 = quantize_experts(down, bits)
        ins = [x, router, g.weight(p + "fc1.q", q1), g.weight(p + "fc1.scales", s1), bias1]
        ins += [g.weight(p + "fc2.q", q2), g.weight(p + "fc2.scales", s2), bias2]
        return str(
            g.op(
                "QMoE",
                ins,
                domain=MS,
                expert_weight_bits=bits,
                block_size=EXPERT_BLOCK,
                weights_prepacked=0,
                accuracy_level=4,
                **attrs,
            )
        )

    x = g.op("Gather", [g.weight("model.embed_tokens.weight", w["model.embed_tokens.weight"]), "input_ids"])
    cos_t, sin_t = rope_caches(c, spec)
    cos, sin = g.weight("rope.cos", cos_t), g.weight("rope.sin", sin_t)
    seqlens = g.op("Sub", [g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=0), g.const(1)])
    seqlens = g.op("Cast", [seqlens], to=onnx.TensorProto.INT32)
    total = g.op("Gather", [g.op("Shape", ["attention_mask"]), g.const(1)], axis=0)
    total = g.op("Cast", [total], to=onnx.TensorProto.INT32)
    hidden_2d = g.const([-1, c.hidden_size])

    name0 = "model.layers.0.input_layernorm.weight"
    hdn = g.op("SimplifiedLayerNormalization", [x, g.weight(name0, w[name0])], axis=-1, epsilon=c.rms_norm_eps)
    residual = x
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        if i > 0:
            hdn, residual = skip_norm(x, residual, p + "input_layernorm.weight")
        a = p + "self_attn."
        qkv_w = np.concatenate([w[a + f"{m}_proj.weight"] for m in "qkv"], axis=0)
        qkv_b = np.concatenate([w[a + f"{m}_proj.bias"] for m in "qkv"], axis=0)
        qkv = linear(hdn, a + "qkv_proj", qkv_w, qkv_b)
        # local_window_size = W reproduces HF's sliding-window mask (checked against transformers to 1e-7).
        windowed = spec.layer_types[i] == SLIDING and spec.sliding_window > 0
        window = spec.sliding_window if windowed else -1
        sink = g.weight(a + "sinks", w[a + "sinks"].astype(np.float32))
        ctx = g.op(
            "GroupQueryAttention",
            [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens, total, cos, sin]
            + ["", "", sink],
            n_out=3,
            domain=MS,
            num_heads=nh,
            kv_num_heads=kvh,
            scale=float(1 / np.sqrt(d)),
            do_rotary=1,
            rotary_interleaved=0,
            local_window_size=window,
            sliding_window_cache=int(windowed),  # a window-sized cache: the op evicts the oldest rows
        )
        g.nodes[-1].output[1] = f"present.{i}.key"
        g.nodes[-1].output[2] = f"present.{i}.value"
        x = linear(ctx[0], a + "o_proj", w[a + "o_proj.weight"], w[a + "o_proj.bias"])
        hdn, residual = skip_norm(x, residual, p + "post_attention_layernorm.weight")
        flat = g.op("Reshape", [hdn, hidden_2d])
        r = p + "mlp.router."
        router = g.op("MatMul", [flat, g.weight(r + "weight_t", np.ascontiguousarray(w[r + "weight"].T))])
        router = g.op("Add", [router, g.weight(r + "bias", w[r + "bias"])])
        moe = experts(flat, router, p + "mlp.experts.")
        x = g.op("Reshape", [moe, g.op("Shape", [hdn])])

    last = g.last_position(x)
    last_res = g.last_position(residual)
    hdn, _ = skip_norm(last, last_res, "model.norm.weight")
    logits = linear(hdn, "lm_head", w["lm_head.weight"])
    g.op_named("Identity", [logits], ["logits"])

    kv: list[int | str] = ["batch", kvh, "max_context", d]
    inputs = [
        tensor_info("input_ids", INT64, ["batch", "seq"]),
        tensor_info("attention_mask", INT64, ["batch", "total_seq"]),
    ]
    outputs = [tensor_info("logits", FLOAT, ["batch", 1, c.vocab_size])]
    window_kv: list[int | str] = ["batch", kvh, "window_capacity", d]
    for i in range(c.num_layers):
        shape = window_kv if i in window_layers(spec) else kv
        inputs += [tensor_info(f"past_key_values.{i}.{kind}", FLOAT, shape) for kind in ("key", "value")]
        outputs += [tensor_info(f"present.{i}.{kind}", FLOAT, shape) for kind in ("key", "value")]
    return g.model(inputs, outputs, {"": 17, MS: 1})


class ExternalWriter(GraphWriter):
    """Tensors of 1 MiB or more go straight into a data file beside the model as they are made, so a
    real-shape model is never whole in memory (and no tensor meets protobuf's 2 GiB limit)."""

    def __init__(self, data_path: Path) -> None:
        super().__init__()
        self._file = data_path.open("wb")
        self._location = data_path.name

    def weight(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if array.nbytes < 1 << 20:
            return super().weight(name, array)
        offset = self._file.tell()
        pad = -offset % 4096  # page-aligned, so ORT can map the file
        self._file.write(b"\0" * pad)
        offset += pad
        self._file.write(array.reshape(-1).view(np.uint8).data)
        tensor = onnx.TensorProto(name=name, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.dims.extend(array.shape)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self._location), ("offset", str(offset)), ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        return name

    def close(self) -> None:
        self._file.close()


def window_layers(spec: GptOssSpec) -> list[int]:
    """Layers whose KV cache holds only the sliding window."""
    if spec.sliding_window <= 0:
        return []
    return [i for i, kind in enumerate(spec.layer_types) if kind == SLIDING]


def write_gptoss_model(
    out_dir: Path,
    config: DecoderConfig,
    spec: GptOssSpec,
    weights: Mapping[str, np.ndarray],
    *,
    quantize_dense: bool,
    extra: dict[str, Any] | None = None,
) -> Path:
    """config.json + model.onnx for the engine (shared-buffer KV cache, last-position logits)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec.total_parameters(config) * 4 > EXTERNAL_DATA_THRESHOLD:  # would be large in fp32: stream it out
        writer = ExternalWriter(out_dir / (MODEL_FILE + ".data"))
        try:
            model = build_gptoss_graph(config, spec, weights, quantize_dense=quantize_dense, writer=writer)
        finally:
            writer.close()
        onnx.save_model(model, str(out_dir / MODEL_FILE))  # the big tensors are already in the data file
    else:
        save_model(build_gptoss_graph(config, spec, weights, quantize_dense=quantize_dense), out_dir / MODEL_FILE)
    scheme: dict[str, Any] | None = None
    if quantize_dense or spec.expert_bits:
        scheme = {
            "scheme": "gpt_oss_blockwise",
            "dense": "MatMulNBits int8, block 32, accuracy_level 4" if quantize_dense else "fp32",
            "experts": f"QMoE int{spec.expert_bits}, block {EXPERT_BLOCK}" if spec.expert_bits else "fp32 (MoE)",
            "expert_bits": spec.expert_bits,
            "built_for_kernel": cpu_features().int8_kernel,
        }
    meta = {
        "format": "onnx-decoder-with-past",
        "graph": "gpt_oss",
        "kv_cache": "shared_buffer",
        "logits": "last_position",
        "quantization": scheme,
        "gpt_oss": spec.to_dict(),
        "kv_window": {"layers": window_layers(spec), "capacity": spec.sliding_window},
        **(extra or {}),
    }
    write_config(out_dir, ModelMeta(config, meta))
    return out_dir
