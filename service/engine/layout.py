"""What a decoder graph expects: input/output names, KV shape and dtype, read off the session.

Past/present names follow the usual patterns (past_key_values.N.key, present.N.value, ...), or the
templates a genai_config.json declares (past_key_names "past_key_values.%d.key", logits, ...)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.engine.base import EngineError
from service.engine.config import DecoderConfig

_PAST = re.compile(r"^(?:past_key_values|past)\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^(?:present|present_key_values)\.(\d+)\.(key|value)$")
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class GraphLayout:
    past_names: list[str]  # key, value of layer 0, then layer 1, ...
    present_names: list[str]  # in the same order
    logits_name: str
    has_attention_mask: bool
    has_position_ids: bool
    has_use_cache_branch: bool  # Optimum merged decoders
    kv_dtype: type
    kv_heads: int
    head_dim: int
    shared_buffer: bool  # past and present are one [b, kv_heads, max_context, d] buffer (GQA)

    @property
    def num_layers(self) -> int:
        return len(self.past_names) // 2


def _ordered(names: list[str], pattern: re.Pattern[str]) -> list[str]:
    found = {}
    for n in names:
        m = pattern.match(n)
        if m:
            found[(int(m.group(1)), 0 if m.group(2) == "key" else 1)] = n
    return [found[k] for k in sorted(found)]


def _templated(names: dict[str, str], key: str, value: str, layers: int) -> list[str] | None:
    if key not in names or value not in names:
        return None
    try:
        return [template % i for i in range(layers) for template in (names[key], names[value])]
    except TypeError as exc:  # a template without exactly one %d
        raise EngineError(f"bad name template {names[key]!r} / {names[value]!r}: {exc}") from exc


def detect_layout(
    session: ort.InferenceSession,
    config: DecoderConfig,
    *,
    shared_buffer: bool,
    names: dict[str, str] | None = None,
) -> GraphLayout:
    """`names`: genai_config.json's decoder input/output names (past_key_names, present_value_names, logits, ...)."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    names = names or {}
    past = _templated(names, "past_key_names", "past_value_names", config.num_layers) or _ordered(list(inputs), _PAST)
    present = _templated(names, "present_key_names", "present_value_names", config.num_layers) or _ordered(
        outputs, _PRESENT
    )
    missing = [n for n in past if n not in inputs] + [n for n in present if n not in outputs]
    if "input_ids" not in inputs or not past or len(past) != len(present) or missing:
        raise EngineError(f"not a decoder-with-past graph: inputs {sorted(inputs)}, outputs {outputs}")
    shape = inputs[past[0]].shape
    kv_heads = shape[1] if isinstance(shape[1], int) else config.num_kv_heads
    head_dim = shape[3] if isinstance(shape[3], int) else config.head_dim
    dtype = _DTYPES.get(inputs[past[0]].type)
    if dtype is None:
        raise EngineError(f"unsupported KV dtype {inputs[past[0]].type}")
    return GraphLayout(
        past_names=past,
        present_names=present,
        logits_name=names.get("logits") or ("logits" if "logits" in outputs else outputs[0]),
        has_attention_mask="attention_mask" in inputs,
        has_position_ids="position_ids" in inputs,
        has_use_cache_branch="use_cache_branch" in inputs,
        kv_dtype=dtype,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        shared_buffer=shared_buffer,
    )
