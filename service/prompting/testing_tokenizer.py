"""A tiny, offline, deterministic chat-model tokenizer for end-to-end tests of the
non-Harmony path: byte-level BPE (encodes any text) + a ChatML chat template."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_VOCAB_SIZE = 512  # 3 specials + 256 byte symbols + merges

# ChatML, with tools listed in the system turn, tool calls as <tool_call> JSON and tool
# results as a "tool" turn (close to the Qwen2 template, which real models use).
CHATML_TEMPLATE = (
    "{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}{% if sys %}{{ sys + '\\n\\n' }}{% endif %}{{ '# Tools' }}"
    "{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif sys -%}"
    "{{ '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set args = call.function.arguments -%}"
    '{{ \'\\n<tool_call>{"name": "\' + call.function.name + \'", "arguments": \' }}'
    "{{ args if args is string else (args | tojson) }}{{ '}</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)

# Fixed training text: English, code-ish JSON, and some non-ASCII so merges cover multi-byte chars.
_CORPUS = [
    "Hello! How can I help you today? The weather in Paris is sunny and warm.",
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "user assistant system tool function call output message reasoning",
    "héllo wörld, ça va? naïve café. 世界 你好 こんにちは 🙂 emoji",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159",
]


def build_tiny_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def write_tiny_chat_model_tokenizer(out_dir: Path) -> int:
    """Write tokenizer.json + tokenizer_config.json (ChatML template) into out_dir; return the vocab size."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer()
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2)
    )
    return tok.get_vocab_size()
