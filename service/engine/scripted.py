"""A scripted decoder: an ONNX graph on the Harmony vocabulary whose next token follows a script, not weights.

For tests of real clients whose prompts exceed the built-in model's context (Codex CLI's stock prompt is ~5,600
tokens): the server, its protocol, log and constrained decoding are the real ones, only the model is a script.

How it works. The graph has the shared-buffer decoder layout of the contrib graphs (engine/graph_contrib.py: one
[batch, 1, max_context, 2] KV buffer per tensor, bound by the engine as both past and present, so sequences decode
batched, right-padded as attention_mask says) with one layer whose cache holds the token ids as floats (exact
below 2**24), written at their positions by ScatterElements: each step sees every token of its row so far.
From them it finds the last `<|start|>` (each completion starts after the prompt's `<|start|>assistant`) and k,
the number of tokens after it; and it picks a rule: the first whose `when` patterns (token sequences) all occur in
the sequence before that `<|start|>` (rules without patterns always match). The next token is the rule's
script[k], where a script is the tokens after `<|start|>`: `assistant` and then the completion text, e.g.
`<|channel|>final<|message|>Hello!<|return|>`. Its logit is SCRIPTED_LOGIT, every other one 0, so it wins under
any sampling unless a constraint masks it out (then the engine picks among the allowed tokens and the script is
off: give tool arguments that fit the tool's schema). Past a script's end the model emits `<|return|>`. The
output depends only on the tokens, so the engine replays it token for token like any model.

A script is one assistant message (it should end in `<|return|>`, `<|call|>` or `<|end|>`): a `<|start|>` inside
a script would restart the count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from service.engine.config import (
    HARMONY_BOS_ID,
    HARMONY_EOS_ID,
    HARMONY_VOCAB_SIZE,
    DecoderConfig,
    ModelMeta,
    write_config,
)
from service.engine.graph_util import FLOAT, INT64, GraphWriter, tensor_info
from service.engine.model_files import MODEL_FILE, new_directory, save_model

HARMONY_START_ID = 200_006  # <|start|>
SCRIPTED_LOGIT = 100.0  # e^-100 * 201,088: the other tokens' total probability at temperature 1 is ~1e-38
DEFAULT_MAX_CONTEXT = 32_768
_KV_WIDTH = 2  # head_dim: the config wants it even; both columns hold the token id


@dataclass(frozen=True)
class Rule:
    """Emit `script` (the completion's Harmony text, special tokens included) when every `when` text occurs in
    the prompt (before the completion's `<|start|>`)."""

    script: str
    when: list[str] = field(default_factory=list)


def parse_rules(text: str) -> list[Rule]:
    """Rules as JSON: a list of {"script": "...", "when": ["...", ...]} (or of bare script strings)."""
    raw = json.loads(text)
    if isinstance(raw, (str, dict)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ValueError("rules must be a JSON list of {script, when} objects or strings")
    rules = []
    for entry in raw:
        if isinstance(entry, str):
            entry = {"script": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("script"), str):
            raise ValueError(f"a rule needs a script string: {entry!r}")
        when = entry.get("when", [])
        if isinstance(when, str):
            when = [when]
        if not isinstance(when, list) or not all(isinstance(w, str) and w for w in when):
            raise ValueError(f"a rule's `when` is a list of non-empty strings: {entry!r}")
        rules.append(Rule(entry["script"], list(when)))
    return rules


def _harmony_tokens(text: str) -> list[int]:
    from service.vocab import load_harmony

    return list(load_harmony().encode(text, allowed_special="all"))


def script_tokens(script: str) -> list[int]:
    """What follows `<|start|>` in the sequence: the role (tokenized on its own, as the renderer does), then
    the completion."""
    return _harmony_tokens("assistant") + _harmony_tokens(script)


def build_scripted_graph(
    tables: list[list[int]], patterns: list[list[list[int]]], *, vocab_size: int = HARMONY_VOCAB_SIZE
) -> onnx.ModelProto:
    """tables[r]: rule r's tokens after `<|start|>`; patterns[r]: the token sequences rule r needs."""
    g = GraphWriter()
    fallback = [HARMONY_EOS_ID]
    tables = [*tables, fallback]
    patterns = [*patterns, []]
    width = max(len(t) for t in tables) + 1
    table = np.full((len(tables), width), HARMONY_EOS_ID, dtype=np.int64)
    for r, toks in enumerate(tables):
        table[r, : len(toks)] = toks

    # The cache: ids as floats, one [b, 1, max_context, 2] buffer that the engine binds as both past and present
    # (as GroupQueryAttention's): this run's ids are written at their positions, after each row's past.
    ids = g.op("Cast", ["input_ids"], to=onnx.TensorProto.FLOAT)
    new = g.op("Expand", [g.op("Unsqueeze", [ids, g.const([1, 3])]), g.const([1, 1, 1, _KV_WIDTH])])  # [b,1,s,2]
    total = g.op("Shape", ["attention_mask"], start=1, end=2)  # [1]: T, the longest row's past + s
    steps = g.op("Shape", ["input_ids"], start=1, end=2)
    past_len = g.op("Sub", [g.op("ReduceSum", ["attention_mask", g.const([1])], keepdims=1), steps])  # [b, 1]
    offsets = g.op("Unsqueeze", [g.op("Range", [g.const(0), g.op("Squeeze", [steps]), g.const(1)]), g.const([0])])
    positions = g.op("Unsqueeze", [g.op("Add", [past_len, offsets]), g.const([1, 3])])  # [b, 1, s, 1]
    where = g.op("Expand", [positions, g.op("Shape", [new])])
    for kind in ("key", "value"):
        g.op_named("ScatterElements", [f"past_key_values.0.{kind}", where, new], [f"present.0.{kind}"], axis=2)

    # seq [b, T]: the ids, -1 where attention_mask is 0 (a shorter row's padding).
    col = g.op(
        "Slice", ["present.0.key", g.const([0, 0]), g.op("Concat", [total, g.const([1])], axis=0), g.const([2, 3])]
    )
    seq = g.op("Reshape", [col, g.const([0, -1])])
    real = g.op("Cast", ["attention_mask"], to=onnx.TensorProto.BOOL)
    neg = g.const(-1.0, np.float32)
    seq = g.op("Where", [real, seq, neg])
    idx = g.op("Cast", [g.op("Range", [g.const(0), g.op("Squeeze", [total]), g.const(1)])], to=onnx.TensorProto.FLOAT)
    idx = g.op("Unsqueeze", [idx, g.const([0])])  # [1, T]

    # The last <|start|> and k, the real tokens after it.
    is_start = g.op("Equal", [seq, g.const(float(HARMONY_START_ID), np.float32)])
    last = g.op("ReduceMax", [g.op("Where", [is_start, idx, neg])], axes=[1], keepdims=1)  # [b, 1]
    after = g.op("And", [g.op("Greater", [idx, last]), real])
    k = g.op("ReduceSum", [g.op("Cast", [after], to=onnx.TensorProto.INT64), g.const([1])], keepdims=0)  # [b]

    # The prompt before that <|start|>, padded with -1 so every pattern's shifted slices have T columns.
    before = g.op("Where", [g.op("Less", [idx, last]), seq, neg])
    longest = max([len(p) for pats in patterns for p in pats] + [1])
    pad = g.op("Expand", [neg, g.op("Concat", [g.op("Shape", [seq], start=0, end=1), g.const([longest])], axis=0)])
    padded = g.op("Concat", [before, pad], axis=1)
    matches = []
    for pats in patterns:
        ok = g.op("Expand", [g.const([1.0], np.float32), g.op("Shape", [k])])  # [b] ones
        for pattern in pats:
            # hit[b, i]: the pattern starts at position i (its j-th token is at i + j for every j).
            eqs = []
            for j, token in enumerate(pattern):
                end = g.op("Add", [total, g.const([j])])
                part = g.op("Slice", [padded, g.const([j]), end, g.const([1])])
                eqs.append(g.op("Equal", [part, g.const(float(token), np.float32)]))
            hit = eqs[0]
            for eq in eqs[1:]:
                hit = g.op("And", [hit, eq])
            found = g.op("ReduceMax", [g.op("Cast", [hit], to=onnx.TensorProto.FLOAT)], axes=[1], keepdims=0)
            ok = g.op("Mul", [ok, found])
        matches.append(g.op("Unsqueeze", [ok, g.const([1])]))
    rule = g.op("ArgMax", [g.op("Concat", matches, axis=1)], axis=1, keepdims=0)  # the first match; [b]

    # token = table[rule, min(k, width - 1)]; logits one-hot at SCRIPTED_LOGIT.
    flat = g.op("Add", [g.op("Mul", [rule, g.const(width)]), g.op("Min", [k, g.const(width - 1)])])
    next_token = g.op("Gather", [g.weight("script.table", table.reshape(-1)), flat], axis=0)
    values = g.const([0.0, SCRIPTED_LOGIT], np.float32)
    onehot = g.op("OneHot", [next_token, g.const(vocab_size), values], axis=-1)  # [b, V]
    g.op_named("Unsqueeze", [onehot, g.const([1])], ["logits"])

    kv: list[int | str] = ["batch", 1, "max_context", _KV_WIDTH]
    inputs = [
        tensor_info("input_ids", INT64, ["batch", "seq"]),
        tensor_info("attention_mask", INT64, ["batch", "total_seq"]),
        tensor_info("past_key_values.0.key", FLOAT, kv),
        tensor_info("past_key_values.0.value", FLOAT, kv),
    ]
    present = kv
    outputs = [
        tensor_info("logits", FLOAT, ["batch", 1, vocab_size]),
        tensor_info("present.0.key", FLOAT, present),
        tensor_info("present.0.value", FLOAT, present),
    ]
    return g.model(inputs, outputs, {"": 17})


def scripted_config(max_context: int = DEFAULT_MAX_CONTEXT) -> DecoderConfig:
    return DecoderConfig(
        vocab_size=HARMONY_VOCAB_SIZE,
        hidden_size=_KV_WIDTH,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=_KV_WIDTH,
        intermediate_size=0,
        max_position=max_context,
        bos_token_id=HARMONY_BOS_ID,
        eos_token_id=HARMONY_EOS_ID,
    )


def write_scripted_model(
    out: Path, rules: list[Rule], *, max_context: int = DEFAULT_MAX_CONTEXT, model_id: str = "scripted"
) -> Path:
    """A new model directory (config.json + model.onnx) serving `rules`; SERVICE_MODEL=out serves it."""
    tables = [script_tokens(rule.script) for rule in rules]
    patterns = [[_harmony_tokens(w) for w in rule.when] for rule in rules]
    model = build_scripted_graph(tables, patterns)
    extra: dict[str, Any] = {
        "format": "onnx-decoder-with-past",
        "graph": "scripted",
        "kv_cache": "shared_buffer",
        "logits": "last_position",
        "quantization": None,
        "model_id": model_id,
        "chat_format": "harmony",
        "scripted_rules": [{"script": r.script, "when": r.when} for r in rules],
    }
    with new_directory(out) as tmp:
        save_model(model, tmp / MODEL_FILE)
        write_config(tmp, ModelMeta(scripted_config(max_context), extra))
    return out
