"""Chat-template format on the tiny offline tokenizer: rendering, stop ids, incremental detokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.prompting import chat_format_for
from service.prompting.base import (
    ItemDelta,
    ItemEnded,
    ItemStarted,
    OutputChunk,
    PartialTurn,
    PromptRequest,
    next_turn_prefix,
)
from service.prompting.chat_template import ChatTemplateFormat, IncrementalDetokenizer
from service.prompting.testing_tokenizer import write_tiny_chat_model_tokenizer

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TEXTS = ["héllo 世界", "Hello! How can I help? 🙂 naïve café", "x" * 50 + " 你好こんにちは 🙂🙂", ""]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_tok")
    vocab = write_tiny_chat_model_tokenizer(d)
    assert 300 < vocab <= 512
    return d


@pytest.fixture(scope="module")
def fmt(model_dir: Path) -> ChatTemplateFormat:
    f = chat_format_for(model_dir, {"chat_format": "chat_template"})
    assert isinstance(f, ChatTemplateFormat)
    return f


def _msg(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def test_tiny_tokenizer_is_deterministic(tmp_path: Path, model_dir: Path) -> None:
    write_tiny_chat_model_tokenizer(tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == (model_dir / "tokenizer.json").read_text()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]


def test_render_simple_conversation(fmt: ChatTemplateFormat) -> None:
    request = PromptRequest(
        items=[_msg("user", "héllo 世界"), _msg("assistant", "Hi!"), _msg("user", "Bye")], instructions="Be brief."
    )
    ids = fmt.render(request)
    text = fmt.tokenizer.decode(ids)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhéllo 世界<|im_end|>\n"
        "<|im_start|>assistant\nHi!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert ids == fmt.render(request)


def test_render_tools_calls_and_outputs(fmt: ChatTemplateFormat) -> None:
    request = PromptRequest(
        items=[
            _msg("user", "Weather?"),
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hidden"}], "summary": []},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        tools=(TOOL,),
    )
    text = fmt.tokenizer.decode(fmt.render(request))
    assert '"name": "get_weather"' in text.split("<|im_end|>")[0]  # tool listed in the system turn
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text
    assert "hidden" not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_stop_ids_and_count(fmt: ChatTemplateFormat, model_dir: Path) -> None:
    im_end = fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert fmt.stop_token_ids() == frozenset({im_end})
    assert fmt.new_constraint() is None and fmt.constraint_for(PromptRequest(items=[])) is None
    assert fmt.count_tokens("héllo 世界") == len(fmt.tokenizer.encode("héllo 世界", add_special_tokens=False))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, 0]}))
    try:
        assert ChatTemplateFormat(model_dir).stop_token_ids() == frozenset({im_end, 0})
    finally:
        (model_dir / "generation_config.json").unlink()


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenization_equals_full_decode(fmt: ChatTemplateFormat, text: str) -> None:
    ids = fmt.tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(fmt.tokenizer)
    deltas = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == text == fmt.tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def _byte_symbols() -> dict[int, str]:
    """GPT-2 byte-level mapping: byte -> the vocab symbol standing for it."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def test_detokenizer_single_byte_tokens(fmt: ChatTemplateFormat) -> None:
    # A model may emit a multi-byte character one byte token at a time: hold it back until complete.
    symbols = _byte_symbols()
    ids = [fmt.tokenizer.convert_tokens_to_ids(symbols[b]) for b in "a🙂é".encode()]
    detok = IncrementalDetokenizer(fmt.tokenizer)
    deltas = [detok.push(t) for t in ids] + [detok.flush()]
    assert deltas == ["a", "", "", "", "🙂", "", "é", ""]


def test_detokenizer_flushes_incomplete_tail_as_replacement(fmt: ChatTemplateFormat) -> None:
    ids = fmt.tokenizer.encode("世", add_special_tokens=False)
    detok = IncrementalDetokenizer(fmt.tokenizer)
    if len(ids) < 2:
        pytest.skip("character is a single token")
    partial = ids[:-1]
    assert "".join(detok.push(t) for t in partial) == ""
    assert detok.flush() == fmt.tokenizer.decode(partial)


def test_plain_text_parser(fmt: ChatTemplateFormat) -> None:
    stop = next(iter(fmt.stop_token_ids()))
    ids = fmt.tokenizer.encode("héllo 世界 🙂", add_special_tokens=False) + [stop]
    parser = fmt.new_parser()
    chunks: list[OutputChunk] = []
    for t in ids:
        chunks += parser.feed(t)
    chunks += parser.finish()
    assert chunks[0] == ItemStarted("message") and chunks[-1] == ItemEnded()
    assert sum(isinstance(c, ItemEnded) for c in chunks) == 1
    assert "".join(c.text for c in chunks if isinstance(c, ItemDelta)) == "héllo 世界 🙂"


def test_plain_text_parser_truncated(fmt: ChatTemplateFormat) -> None:
    parser = fmt.new_parser()
    chunks = [c for t in fmt.tokenizer.encode("Hello", add_special_tokens=False) for c in parser.feed(t)]
    assert chunks[0] == ItemStarted("message")
    assert parser.finish()[-1] == ItemEnded()
    assert parser.finish() == []


def test_missing_template_is_a_clear_error(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="chat_template"):
        ChatTemplateFormat(tmp_path)


def test_next_turn_prefix_is_how_the_next_turn_starts(fmt: ChatTemplateFormat) -> None:
    request = PromptRequest(items=[_msg("user", "héllo 世界")], instructions="Be brief.")
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi! 🙂"}]}
    prefix = next_turn_prefix(fmt, request, [answer])
    follow_up = fmt.render(PromptRequest(items=[*request.items, answer, _msg("user", "Bye")], instructions="Be brief."))
    assert follow_up[: len(prefix)] == prefix
    assert fmt.tokenizer.decode(prefix).endswith("<|im_start|>assistant\nHi! 🙂<|im_end|>\n<|im_start|>user\n")
    assert len(follow_up) - len(prefix) <= len(fmt.tokenizer.encode("Bye<|im_end|>\n<|im_start|>assistant\n"))


def test_partial_turn_is_how_the_next_turn_starts(fmt: ChatTemplateFormat) -> None:
    request = PromptRequest(items=[_msg("user", "héllo 世界")], instructions="Be brief.")
    text = "Hi there! 🙂 How are you doing today?"
    follow_up = fmt.render(
        PromptRequest(items=[*request.items, _answer(text), _msg("user", "Bye")], instructions="Be brief.")
    )
    partial = PartialTurn(fmt, request)
    for cut in range(0, len(text) + 1, 3):
        prefix = partial.prefix([_answer(text[:cut])])
        assert prefix and follow_up[: len(prefix)] == prefix, cut
    assert "Hi there! 🙂 How are you" in fmt.tokenizer.decode(prefix)


def _answer(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
