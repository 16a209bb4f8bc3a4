"""gpt-oss from its original checkpoint (config.json with `quantization_config: {"quant_method": "mxfp4"}`) to
graph_gptoss's graph: sinks, sliding window and YaRN as that builder writes them, experts as QMoE.

The checkpoint's experts are MXFP4 (the OCP microscaling format, as transformers' integrations/mxfp4.py reads
it): `model.layers.N.mlp.experts.gate_up_proj_blocks` [E, 2I, H/32, 16] and `down_proj_blocks` [E, H, I/32, 16]
are uint8, two FP4 e2m1 codes a byte, the low nibble first (element 2j in the low nibble, 2j+1 in the high);
`*_scales` [E, N, K/32] are E8M0 exponents, one per block of 32 values along K, biased by 127. Code c means
FP4_VALUES[c] = {0, .5, 1, 1.5, 2, 3, 4, 6} (c < 8) or their negatives (c >= 8), so an element is
FP4_VALUES[c] * 2^(scale - 127). The rows are already QMoE's: fc1 [E, 2I, H] with gate and up interleaved
(gate_up[..., 0::2] is the gate, swiglu_fusion=1), fc2 [E, H, I], K last; nothing is transposed.

What the experts become (`bits`):
- 8: QMoE int8, exact. 2 * FP4 value is an integer in [-12, 12], so code = 2 * value (+128, QMoE's zero point)
  with the block scale 2^(scale - 128) dequantizes to the checkpoint's value bit for bit.
- 4: QMoE int4, not exact in general: an int4 block is q * s with q in [-8, 7] and one float s, an evenly
  spaced grid, and FP4's magnitudes are not (in units of half the block's step they are 0, 1, 2, 3, 4, 6, 8,
  12). A block is representable only where one s divides every value into [-8, 7]: no 0.5 or 1.5 beside a
  4 or 6 (a block holding 0.5 and 6 would need 6/0.5 = 12 > 8 steps). Each block gets the s (sign included:
  QMoE's CPU kernel takes signed scales, so +8 units can be q = -8) of least squared error: every exact
  candidate, a grid over the lossy range, then the least-squares s of the chosen rounding. Blocks that can be
  exact are; measured error in docs/models.md ("Import gpt-oss-20b").
- 32: experts decoded to float32 (the MoE op) and dense projections unquantized: the reference path tests use.
Everything else is as graph_gptoss writes it: dense projections MatMulNBits int8 (block 32), the router,
norms, sinks, biases and the embedding table float32 (bf16 in the checkpoint, widened exactly).

A checkpoint whose experts are not quantized (`gate_up_proj` [E, H, 2I], `down_proj` [E, I, H], as
transformers saves a GptOssForCausalLM) imports too: graph_gptoss quantizes those itself.

Tensors are read one at a time through importers/checkpoint.py (safetensors' numpy API, memory-mapped; bf16
through ml_dtypes); the writer streams each one into model.onnx.data as it goes, so a 20B checkpoint imports
holding about one layer's experts and the head at a time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from service.engine.config import CONFIG_FILE, HARMONY_VOCAB_SIZE, DecoderConfig
from service.engine.gptoss import EXPERT_BLOCK, FULL, SLIDING, GptOssSpec
from service.engine.importers.checkpoint import Checkpoint, abbreviated
from service.engine.importers.dense import UnsupportedCheckpoint
from service.engine.model_files import ModelDirError, copy_support_files, new_directory

Progress = Callable[[str], None]

MXFP4_BLOCK = 32  # values per E8M0 scale
E8M0_BIAS = 127
E8M0_NAN = 255
# FP4 e2m1 by code, as transformers' FP4_VALUES: bit 3 is the sign.
FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
_HALF_UNITS = (FP4_VALUES * 2).astype(np.float32)  # integers in [-12, 12]
BITS = (4, 8, 32)
_CHUNK = 4096  # blocks converted at once to int4 (the search's temporaries stay in cache)
# The served context unless asked for another: gpt-oss's own before YaRN (`initial_context_length`). Not the
# dense families' 32,768: a graph with sliding windows is prefilled in one run, and GroupQueryAttention's scratch
# on a full-attention layer is heads x prompt x context floats (64 x 6,000 x 32,768 x 4 B = 50 GB, measured); at
# 4,096 a whole-context prompt needs 4.3 GB beside gpt-oss-20b's 15.7 GB, which fits 24 GiB.
DEFAULT_CONTEXT = 4096
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx", ".onnx.data")
# By packed byte (two codes, low nibble first): both values, both int8 codes, and each code's count in a
# uint64 of eight 8-bit counters (codes 0-7 and 8-15), so a block's histogram is a sum of 16 table entries.
_BYTES = np.arange(256, dtype=np.uint8)
_PAIR_CODES = np.stack([_BYTES & 0x0F, _BYTES >> 4], axis=1)  # [256, 2]
_PAIR_VALUES = FP4_VALUES[_PAIR_CODES]  # [256, 2] float32
_PAIR_INT8 = (_HALF_UNITS[_PAIR_CODES] + 128).astype(np.uint8)  # [256, 2]
_ONE = np.uint64(1)
_COUNT_LO = np.array([sum(_ONE << np.uint64(8 * c) for c in pair if c < 8) for pair in _PAIR_CODES], np.uint64)
_COUNT_HI = np.array([sum(_ONE << np.uint64(8 * (c - 8)) for c in pair if c >= 8) for pair in _PAIR_CODES], np.uint64)


def fp4_codes(blocks: np.ndarray) -> np.ndarray:
    """[..., G, 16] packed bytes -> [..., G, 32] codes 0..15, element 2j from the low nibble."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    return np.asarray(_PAIR_CODES[blocks].reshape(*blocks.shape[:-1], 2 * blocks.shape[-1]))


def _powers_of_two(scales: np.ndarray, offset: int) -> np.ndarray:
    """2^(scale - offset) as float32, exactly (subnormal below 2^-126, as E8M0's smallest scales are)."""
    return np.ldexp(np.float32(1), scales.astype(np.int32) - offset).astype(np.float32)


def mxfp4_to_float(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The checkpoint's values, float32 [..., G * 32], exactly (FP4 * 2^(scale - 127))."""
    _check_scales(blocks, scales)
    values = _PAIR_VALUES[blocks].reshape(*blocks.shape[:-1], MXFP4_BLOCK)
    values *= _powers_of_two(scales, E8M0_BIAS)[..., None]  # a power of two: exact
    return np.asarray(values.reshape(*blocks.shape[:-2], -1))


def mxfp4_to_int8(blocks: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QMoE int8, exactly: codes uint8 [..., G * 32] (2 * value + 128) and float32 scales [..., G] (2^(scale - 128))."""
    _check_scales(blocks, scales)
    codes = _PAIR_INT8[blocks].reshape(*blocks.shape[:-2], -1)
    return codes, _powers_of_two(scales, E8M0_BIAS + 1)


# int4 scale candidates in half-units of the MXFP4 block: every divisor that can make a block exact (a block
# of integers u is exact iff t = +-gcd(u) maps it into [-8, 7]), then a grid over where lossy blocks' best lies.
_EXACT_T = np.array([1, 2, 3, 4, 6, 8, 12], dtype=np.float32)
_GRID_T = np.linspace(1.25, 2.4, 24, dtype=np.float32)
_T = np.concatenate([_EXACT_T, -_EXACT_T, _GRID_T, -_GRID_T])  # exact ones first: they win ties
_Q = np.clip(np.rint(_HALF_UNITS[None, :] / _T[:, None]), -8, 7).astype(np.float32)  # [T, 16]: q of each code
_QU = _Q * _HALF_UNITS  # [T, 16]: for the least-squares step
_QQ = _Q * _Q
_Q_BYTES = (_Q[:, _PAIR_CODES[:, 0]] + 8).astype(np.uint8) | ((_Q[:, _PAIR_CODES[:, 1]] + 8).astype(np.uint8) << 4)
# A candidate's squared error over a block, in 1/64 half-units squared (each element's error rounded), times 64
# plus the candidate's index: one float32 matmul of the histogram (and a column of ones) gives keys whose
# minimum names the candidate of least error. Keys stay below 2^24 (32 x 36 x 64 x 64), so float32 holds them.
_KEY_INDEX = 64
_KEYS = np.concatenate(
    [
        np.rint((_HALF_UNITS[None, :] - _Q * _T[:, None]) ** 2 * 64) * _KEY_INDEX,
        np.arange(len(_T), dtype=np.float32)[:, None],
    ],
    axis=1,
).astype(np.float32)  # [T, 17]
assert _KEYS[:, :16].max() * 32 + len(_T) < 2**24
# Blocks per matmul: OpenBLAS threads a product of more than 65536 x 4 multiply-adds, and its threads spinning on
# a busy machine cost ~20x the product itself (2.5 us a block against 0.1 us measured here); 192 x 62 x 17 stays under.
_MATMUL_ROWS = 192


def mxfp4_to_int4(blocks: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """QMoE int4 of least squared error per block: packed codes uint8 [..., G * 16] (q + 8, low nibble first)
    and float32 scales [..., G]. Exact for the blocks int4 can represent; see the module for the others."""
    _check_scales(blocks, scales)
    flat = np.asarray(blocks, dtype=np.uint8).reshape(-1, MXFP4_BLOCK // 2)
    packed = np.empty_like(flat)
    steps = np.empty(len(flat), dtype=np.float32)
    for start in range(0, len(flat), _CHUNK):
        stop = min(start + _CHUNK, len(flat))
        packed[start:stop], steps[start:stop] = _int4_blocks(flat[start:stop])
    steps *= _powers_of_two(scales.reshape(-1), E8M0_BIAS + 1)  # half-units -> values
    return packed.reshape(*blocks.shape[:-2], -1), steps.reshape(scales.shape)


def _int4_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """blocks [n, 16] -> (packed int4 codes [n, 16], steps t [n] in half-units) with q * t nearest the block's
    half-units in least squares."""
    n = len(blocks)
    hist = np.empty((n, 17), dtype=np.float32)  # a block's histogram of codes, then a 1
    hist[:, :8] = _COUNT_LO[blocks].sum(axis=1, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    hist[:, 8:16] = _COUNT_HI[blocks].sum(axis=1, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    hist[:, 16] = 1
    keys = np.empty((len(_T), n), dtype=np.float32)
    for start in range(0, n, _MATMUL_ROWS):  # small products: OpenBLAS keeps them on this thread
        np.matmul(_KEYS, hist[start : start + _MATMUL_ROWS].T, out=keys[:, start : start + _MATMUL_ROWS])
    best = (np.min(keys, axis=0) % _KEY_INDEX).astype(np.intp)
    # For that rounding, the least-squares step sum(u q) / sum(q q) (the candidate itself for an all-zero block).
    num = np.einsum("nc,nc->n", hist[:, :16], _QU[best])
    den = np.einsum("nc,nc->n", hist[:, :16], _QQ[best])
    t = np.where(den > 0, num / np.where(den > 0, den, 1), _T[best]).astype(np.float32)
    packed = _Q_BYTES.reshape(-1)[best[:, None] * 256 + blocks]
    return packed, t


def _check_scales(blocks: np.ndarray, scales: np.ndarray) -> None:
    if blocks.shape[-1] != MXFP4_BLOCK // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not match")
    if np.any(scales == E8M0_NAN):
        raise ValueError("an E8M0 scale is 255 (NaN)")


def import_gpt_oss(
    src_dir: Path, out_dir: Path, *, bits: int, progress: Progress | None = None, max_context: int | None = None
) -> Path:
    """Import the gpt-oss checkpoint in `src_dir` into the new directory `out_dir` (written beside it and
    renamed into place): model.onnx (+ .data), config.json, and the tokenizer, chat template and generation
    config copied. `bits`: 4 or 8 (QMoE experts, int8 dense projections) or 32 (unquantized; tests);
    `max_context`: the served context (default DEFAULT_CONTEXT, at most the checkpoint's).
    ModelDirError (UnsupportedCheckpoint) in one line for what does not fit, missing tensors listed by name."""
    from service.engine.graph_gptoss import write_gptoss_model

    src_dir, out_dir = Path(src_dir), Path(out_dir)
    note = progress or (lambda _msg: None)
    if bits not in BITS:
        raise ModelDirError(f"gpt-oss imports with bits 4, 8 or 32, not {bits}")
    with Checkpoint(src_dir) as ckpt:
        config, spec, extra = read_gpt_oss_config(ckpt.config, max_context=max_context)
        spec = dataclasses.replace(spec, expert_bits=None if bits == 32 else bits)
        weights = GptOssWeights(ckpt, config, spec, on_layer=lambda i: note(f"layer {i + 1}/{config.num_layers}"))
        extra["expert_conversion"] = weights.conversion
        note(
            f"{ckpt.architecture}: {config.num_layers} layers, {spec.num_experts} experts "
            f"({weights.expert_format}) -> {weights.conversion}"
        )
        with new_directory(out_dir) as tmp:
            write_gptoss_model(tmp, config, spec, weights, quantize_dense=bits != 32, extra=extra)
            copy_support_files(src_dir, tmp, skip=_not_carried(src_dir))
    note(f"wrote {out_dir}")
    return out_dir


def read_gpt_oss_config(
    cfg: dict[str, Any], *, max_context: int | None = None
) -> tuple[DecoderConfig, GptOssSpec, dict[str, Any]]:
    """The decoder shape, gpt-oss's extras and config.json metadata of a checkpoint's config.json; the served
    context is `max_context` (default DEFAULT_CONTEXT), at most the trained one."""
    if cfg.get("model_type") != "gpt_oss":
        raise UnsupportedCheckpoint(f"model_type {cfg.get('model_type')!r} is not gpt_oss")
    method = (cfg.get("quantization_config") or {}).get("quant_method")
    if method not in (None, "mxfp4"):
        raise UnsupportedCheckpoint(f"gpt-oss quantized as {method!r} (only the original mxfp4, or unquantized)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise UnsupportedCheckpoint(f"RoPE scaling {kind!r} (gpt-oss: yarn or none)")
    try:
        config = DecoderConfig.from_dict(cfg)
        spec = GptOssSpec.from_hf(cfg)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnsupportedCheckpoint(f"config.json does not describe gpt-oss: {exc!r}") from exc
    odd = sorted(set(spec.layer_types) - {SLIDING, FULL})
    if len(spec.layer_types) != config.num_layers or odd:
        raise UnsupportedCheckpoint(f"layer_types {odd or len(spec.layer_types)} (sliding/full, one per layer)")
    for name, size in (("hidden_size", config.hidden_size), ("intermediate_size", config.intermediate_size)):
        if size % EXPERT_BLOCK:
            raise UnsupportedCheckpoint(f"{name} {size} is not a multiple of {EXPERT_BLOCK} (QMoE blocks)")
    trained = config.max_position
    config = dataclasses.replace(config, max_position=min(trained, max_context or DEFAULT_CONTEXT))
    extra: dict[str, Any] = {}
    if config.max_position < trained:
        extra["trained_context"] = trained
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list) and len(eos) > 1:
        extra["eos_token_ids"] = [int(t) for t in eos]
    if config.vocab_size == HARMONY_VOCAB_SIZE:
        extra["chat_format"] = "harmony"  # the o200k_harmony vocabulary: the server's Harmony renderer drives it
    return config, spec, extra


class GptOssWeights(Mapping[str, np.ndarray]):
    """The tensors build_gptoss_graph reads, by its names, made from the checkpoint when asked: plain weights
    as float32; experts as QMoE codes and scales (fc1/fc2 .codes/.scales) or, for bits 32 or an unquantized
    checkpoint, float32 in HF's layout (gate_up_proj [E, H, 2I], down_proj [E, I, H]). Shapes are checked
    against the headers first; tensors the graph has no place for are refused."""

    def __init__(
        self, ckpt: Checkpoint, config: DecoderConfig, spec: GptOssSpec, *, on_layer: Callable[[int], None]
    ) -> None:
        self.ckpt, self.config, self.spec, self.on_layer = ckpt, config, spec, on_layer
        c, e = config, spec.num_experts
        h, d, inter = c.hidden_size, c.head_dim, c.intermediate_size
        self.mxfp4 = "model.layers.0.mlp.experts.gate_up_proj_blocks" in ckpt
        stored: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
        if "lm_head.weight" in ckpt or not c.tie_embeddings:
            stored["lm_head.weight"] = (c.vocab_size, h)
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            stored[p + "input_layernorm.weight"] = (h,)
            stored[p + "post_attention_layernorm.weight"] = (h,)
            for m, rows in (("q", c.num_heads * d), ("k", c.num_kv_heads * d), ("v", c.num_kv_heads * d)):
                stored[p + f"self_attn.{m}_proj.weight"] = (rows, h)
                stored[p + f"self_attn.{m}_proj.bias"] = (rows,)
            stored[p + "self_attn.o_proj.weight"] = (h, c.num_heads * d)
            stored[p + "self_attn.o_proj.bias"] = (h,)
            stored[p + "self_attn.sinks"] = (c.num_heads,)
            stored[p + "mlp.router.weight"] = (e, h)
            stored[p + "mlp.router.bias"] = (e,)
            x = p + "mlp.experts."
            stored[x + "gate_up_proj_bias"] = (e, 2 * inter)
            stored[x + "down_proj_bias"] = (e, h)
            if self.mxfp4:
                for proj, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
                    stored[x + proj + "_blocks"] = (e, n, k // MXFP4_BLOCK, MXFP4_BLOCK // 2)
                    stored[x + proj + "_scales"] = (e, n, k // MXFP4_BLOCK)
            else:
                stored[x + "gate_up_proj"] = (e, h, 2 * inter)
                stored[x + "down_proj"] = (e, inter, h)
        self._check(stored)
        self.stored = stored
        self.names = [n for n in stored if not n.endswith(("_blocks", "_scales"))]
        if "lm_head.weight" not in stored:
            self.names.append("lm_head.weight")  # tied: the embedding table
        if self.mxfp4:
            kinds: tuple[str, ...] = ("gate_up_proj", "down_proj")
            if spec.expert_bits is not None:
                kinds = ("fc1.codes", "fc1.scales", "fc2.codes", "fc2.scales")
            self.names += [f"model.layers.{i}.mlp.experts.{k}" for i in range(c.num_layers) for k in kinds]
        self._known = set(self.names)
        self._cache: tuple[str, tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def expert_format(self) -> str:
        if self.mxfp4:
            return "MXFP4"
        return "/".join(sorted({self.ckpt.dtype("model.layers.0.mlp.experts.gate_up_proj")}))

    @property
    def conversion(self) -> str:
        """How the experts were made, for config.json (`expert_conversion`)."""
        bits = self.spec.expert_bits
        if not self.mxfp4:
            target = f"QMoE int{bits}, absmax blocks of 32" if bits else "fp32 MoE"
            return f"{self.expert_format} experts -> {target}"
        if bits == 8:
            return "MXFP4 -> QMoE int8, exact (code 2 x FP4, scale 2^(e8m0 - 128))"
        if bits == 4:
            return "MXFP4 -> QMoE int4, least-squares signed scale per block of 32 (exact where int4 can be)"
        return "MXFP4 -> fp32 MoE, exact"

    def _check(self, stored: dict[str, tuple[int, ...]]) -> None:
        ckpt = self.ckpt
        ckpt.require(list(stored))
        wrong = [f"{n} {ckpt.shape(n)} (expected {want})" for n, want in stored.items() if ckpt.shape(n) != want]
        if wrong:
            raise ModelDirError(f"{ckpt.path} ({ckpt.architecture}): misshapen: {', '.join(abbreviated(wrong))}")
        packed = [n for n in stored if n.endswith(("_blocks", "_scales")) and ckpt.dtype(n) != "U8"]
        if packed:
            raise ModelDirError(f"{ckpt.path}: MXFP4 tensors not stored as U8: {', '.join(abbreviated(packed))}")
        unused = sorted(n for n in ckpt.names() if n not in stored)
        if unused:
            raise UnsupportedCheckpoint(
                f"{ckpt.path} ({ckpt.architecture}): tensors the gpt-oss graph has no place for: "
                f"{', '.join(abbreviated(unused))}"
            )

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._known:
            raise KeyError(name)
        if name == "lm_head.weight" and name not in self.stored:
            return self.ckpt.get("model.embed_tokens.weight")
        if name.endswith("input_layernorm.weight"):
            self.on_layer(int(name.split(".")[2]))
        if name in self.stored:
            return self.ckpt.get(name)
        prefix, _, kind = name.rpartition("mlp.experts.")
        experts = prefix + "mlp.experts."
        if kind in ("gate_up_proj", "down_proj"):  # bits 32: HF's layout, which the builder transposes back
            values = mxfp4_to_float(*self._packed(experts + kind))
            return np.ascontiguousarray(values.transpose(0, 2, 1))
        proj, part = kind.split(".")
        return self._converted(experts, proj)[0 if part == "codes" else 1]

    def _packed(self, stem: str) -> tuple[np.ndarray, np.ndarray]:
        return self.ckpt.raw(stem + "_blocks"), self.ckpt.raw(stem + "_scales")

    def _converted(self, experts: str, proj: str) -> tuple[np.ndarray, np.ndarray]:
        """fc1/fc2 codes and scales, converted once (the builder asks for both)."""
        key = experts + proj
        if self._cache is None or self._cache[0] != key:
            blocks, scales = self._packed(experts + ("gate_up_proj" if proj == "fc1" else "down_proj"))
            convert = mxfp4_to_int8 if self.spec.expert_bits == 8 else mxfp4_to_int4
            self._cache = None  # drop the previous projection's arrays before making the next
            self._cache = (key, convert(blocks, scales))
        return self._cache[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._known


def _not_carried(src: Path) -> set[str]:
    """What stays behind: weights of every format, their index, folders (`original/`, `metal/`), config.json."""
    skip = {CONFIG_FILE}
    for path in src.iterdir():
        if path.is_dir() or path.name.endswith(_WEIGHT_SUFFIXES) or path.name.endswith(".index.json"):
            skip.add(path.name)
    return skip
