"""Harmony format: rendering parity with openai-harmony, incremental parsing, header constraint."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
)

from service.prompting import chat_format_for
from service.prompting.base import (
    ItemDelta,
    ItemEnded,
    ItemStarted,
    MalformedOutput,
    OutputChunk,
    PartialTurn,
    PromptRequest,
    next_turn_prefix,
)
from service.prompting.harmony import HarmonyFormat
from service.prompting.harmony_constraint import HarmonyHeaderConstraint
from service.vocab import O200K_SHA256, VocabError, ensure_harmony_vocab

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "City name"}},
    "required": ["city"],
}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}


def _text(role: str, text: str, kind: str = "input_text") -> dict:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


@pytest.fixture(scope="module")
def fmt() -> HarmonyFormat:
    return HarmonyFormat()


@pytest.fixture(scope="module")
def enc(fmt: HarmonyFormat) -> HarmonyEncoding:
    return fmt.encoding


def _special(enc: HarmonyEncoding, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


# --- vocab -----------------------------------------------------------------------------


def test_vocab_file_is_verified_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_VOCAB_CACHE", str(tmp_path))
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/nonexistent")
    cache = ensure_harmony_vocab()
    assert cache == tmp_path
    target = tmp_path / "o200k_base.tiktoken"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256
    import os

    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(tmp_path)
    # A corrupted cache file is replaced from the bundled copy.
    target.write_bytes(b"garbage")
    ensure_harmony_vocab()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256


def test_vocab_hash_mismatch_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVICE_VOCAB_CACHE", str(tmp_path))
    monkeypatch.setattr("service.vocab._bundled_gz", lambda: gzip.compress(b"not the vocab"))
    with pytest.raises(VocabError, match="SHA-256"):
        ensure_harmony_vocab()
    assert not (tmp_path / "o200k_base.tiktoken").exists()


def test_chat_format_for_harmony(tmp_path: Path) -> None:
    f = chat_format_for(tmp_path, {"chat_format": "harmony"})
    assert f.name == "harmony"
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        chat_format_for(tmp_path, {})


# --- rendering -------------------------------------------------------------------------


def _system(effort: ReasoningEffort) -> Message:
    return Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(effort))


def _developer() -> Message:
    content = (
        DeveloperContent.new()
        .with_instructions("Answer briefly.")
        .with_function_tools([ToolDescription.new("get_weather", "Current weather", parameters=WEATHER_PARAMS)])
    )
    return Message.from_role_and_content(Role.DEVELOPER, content)


def test_render_multi_turn_with_tools_matches_harmony(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    args = '{"city":"Paris"}'
    request = PromptRequest(
        items=[
            _text("user", "Hi"),
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Greet back."}], "summary": []},
            _text("assistant", "Hello!", "output_text"),
            _text("user", "Weather in Paris?"),
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Need the tool."}], "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"sky":"sunny"}'},
        ],
        instructions="Answer briefly.",
        tools=(WEATHER_TOOL,),
        reasoning_effort="high",
    )
    by_hand = [
        _system(ReasoningEffort.HIGH),
        _developer(),
        Message.from_role_and_content(Role.USER, "Hi"),
        # "Greet back." belongs to a finished turn: dropped.
        Message.from_role_and_content(Role.ASSISTANT, "Hello!").with_channel("final"),
        Message.from_role_and_content(Role.USER, "Weather in Paris?"),
        Message.from_role_and_content(Role.ASSISTANT, "Need the tool.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, args)
        .with_channel("commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), '{"sky":"sunny"}')
        .with_channel("commentary")
        .with_recipient("assistant"),
    ]
    expected = enc.render_conversation_for_completion(
        Conversation.from_messages(by_hand), Role.ASSISTANT, RenderConversationConfig(auto_drop_analysis=False)
    )
    got = fmt.render(request)
    assert got == expected
    assert got[-2:] == _special(enc, "<|start|>assistant")
    text = enc.decode(got)
    assert "Greet back." not in text and "Need the tool." in text
    assert "type get_weather" in text and "Reasoning: high" in text


def test_render_new_turn_matches_harmony_auto_drop(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    request = PromptRequest(
        items=[
            _text("user", "What is 2 + 2?"),
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Simple."}], "summary": []},
            _text("assistant", "4.", "output_text"),
            _text("user", "And 9 / 2?"),
        ],
        reasoning_effort="low",
    )
    by_hand = [
        _system(ReasoningEffort.LOW),
        Message.from_role_and_content(Role.USER, "What is 2 + 2?"),
        Message.from_role_and_content(Role.ASSISTANT, "Simple.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "4.").with_channel("final"),
        Message.from_role_and_content(Role.USER, "And 9 / 2?"),
    ]
    # Here harmony's own auto-drop applies (conversation's last assistant message is final).
    expected = enc.render_conversation_for_completion(Conversation.from_messages(by_hand), Role.ASSISTANT)
    assert fmt.render(request) == expected
    assert "Simple." not in enc.decode(expected)


def test_render_is_deterministic_and_counts_tokens(fmt: HarmonyFormat) -> None:
    request = PromptRequest(items=[_text("user", "Hi")])
    assert fmt.render(request) == fmt.render(request)
    assert fmt.count_tokens("hello world") == 2
    assert fmt.count_tokens("<|end|>") > 1  # user text never becomes a special token


def test_stop_tokens(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    assert fmt.stop_token_ids() == frozenset(_special(enc, "<|return|><|call|>"))


# --- parsing ---------------------------------------------------------------------------


def _chunks_from_messages(messages: list[Message]) -> list[OutputChunk]:
    """What the parser should emit for whole parsed messages (deltas concatenated)."""
    out: list[OutputChunk] = []
    for m in messages:
        if m.recipient:
            out.append(ItemStarted("function_call", name=m.recipient.removeprefix("functions.")))
        elif m.channel == "analysis":
            out.append(ItemStarted("reasoning"))
        else:
            out.append(ItemStarted("message"))
        text = "".join(c.text for c in m.content)
        if text:
            out.append(ItemDelta(text))
        out.append(ItemEnded())
    return out


def _merge_deltas(chunks: list[OutputChunk]) -> list[OutputChunk]:
    out: list[OutputChunk] = []
    for c in chunks:
        if isinstance(c, ItemDelta) and out and isinstance(out[-1], ItemDelta):
            out[-1] = ItemDelta(out[-1].text + c.text)
        else:
            out.append(c)
    return out


def _feed_all(fmt: HarmonyFormat, tokens: list[int]) -> list[OutputChunk]:
    parser = fmt.new_parser()
    chunks: list[OutputChunk] = []
    for t in tokens:
        chunks += parser.feed(t)
    return chunks + parser.finish()


COMPLETIONS = {
    "analysis_final": "<|channel|>analysis<|message|>User greets; answer with café 世界 🙂.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello — café 世界 🙂!<|return|>",
    "analysis_call": "<|channel|>analysis<|message|>Need weather.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    "<|call|>",
    "preamble_call_role_recipient": "<|channel|>commentary<|message|>Checking.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city":"Oslo"}'
    "<|call|>",
}


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_incremental_parser_matches_whole_parse(fmt: HarmonyFormat, enc: HarmonyEncoding, name: str) -> None:
    tokens = _special(enc, COMPLETIONS[name])
    whole = enc.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    chunks = _feed_all(fmt, tokens)
    assert _merge_deltas(chunks) == _chunks_from_messages(whole)
    # Multi-byte characters split over tokens never leak partial text.
    assert all("\ufffd" not in c.text for c in chunks if isinstance(c, ItemDelta))


def test_parser_item_kinds(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    kinds = [c for c in _feed_all(fmt, _special(enc, COMPLETIONS["analysis_call"])) if isinstance(c, ItemStarted)]
    assert kinds == [ItemStarted("reasoning"), ItemStarted("function_call", name="get_weather")]


def test_parser_finish_closes_truncated_item(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    parser = fmt.new_parser()
    chunks: list[OutputChunk] = []
    for t in _special(enc, "<|channel|>final<|message|>Hello wor"):
        chunks += parser.feed(t)
    assert chunks[0] == ItemStarted("message") and not isinstance(chunks[-1], ItemEnded)
    assert parser.finish() == [ItemEnded()]
    assert parser.finish() == []


@pytest.mark.parametrize(
    "bad",
    [
        "<|channel|>final<|message|>Hi<|end|>oops",  # text where <|start|> must come
        "<|channel|>final<|message|>Hi<|end|><|start|>user<|message|>x<|end|>",  # model writes as the user
    ],
)
def test_parser_raises_malformed_output_only(fmt: HarmonyFormat, enc: HarmonyEncoding, bad: str) -> None:
    parser = fmt.new_parser()
    with pytest.raises(MalformedOutput):
        for t in _special(enc, bad):
            parser.feed(t)
    with pytest.raises(MalformedOutput):  # stays failed
        parser.feed(0)
    assert parser.finish() == []


# --- header constraint -----------------------------------------------------------------


def _sample(fmt: HarmonyFormat, request: PromptRequest, seed: int, max_tokens: int) -> list[int]:
    """A random-weight 'model': uniform among allowed ids, with some extra mass on the few
    special tokens a body allows (uniform alone would almost never end a message)."""
    rng = np.random.default_rng(seed)
    constraint = fmt.constraint_for(request)
    stops = fmt.stop_token_ids()
    tokens: list[int] = []
    for _ in range(max_tokens):
        allowed = constraint.allowed_token_ids()
        assert isinstance(allowed, np.ndarray) and len(allowed) > 0  # no grammar: id arrays
        if len(allowed) > 1000 and rng.random() < 0.05:
            tid = int(rng.choice(allowed[allowed >= 199998]))
        else:
            tid = int(rng.choice(allowed))
        constraint.accept(tid)
        tokens.append(tid)
        if tid in stops:
            break
    return tokens


@pytest.mark.parametrize("with_tools", [False, True])
def test_constraint_random_sampling_always_parses(fmt: HarmonyFormat, enc: HarmonyEncoding, with_tools: bool) -> None:
    tools = (WEATHER_TOOL, {**WEATHER_TOOL, "name": "get_weather_forecast"}) if with_tools else ()
    request = PromptRequest(items=[_text("user", "Hi")], tools=tools)
    seen_kinds: set[str] = set()
    for seed in range(12):
        tokens = _sample(fmt, request, seed, max_tokens=300)
        chunks = _feed_all(fmt, tokens)  # raises MalformedOutput on failure
        starts = [c for c in chunks if isinstance(c, ItemStarted)]
        assert starts, enc.decode(tokens)
        assert sum(isinstance(c, ItemEnded) for c in chunks) == len(starts)
        for s in starts:
            seen_kinds.add(s.kind)
            if s.kind == "function_call":
                assert with_tools and s.name in {"get_weather", "get_weather_forecast"}
        if tokens[-1] in fmt.stop_token_ids():  # a finished completion also parses as a whole
            enc.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    assert {"reasoning", "message"} <= seen_kinds
    if with_tools:
        assert "function_call" in seen_kinds


def _allowed(c: HarmonyHeaderConstraint) -> list[int]:
    ids = c.allowed_token_ids()
    assert isinstance(ids, np.ndarray)
    return [int(i) for i in ids]


def test_constraint_forces_header_tokens(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    c = fmt.new_constraint()
    assert _allowed(c) == _special(enc, "<|channel|>")
    for t in _special(enc, "<|channel|>final<|message|>"):
        assert t in _allowed(c)
        c.accept(t)
    body = c.allowed_token_ids()
    assert isinstance(body, np.ndarray) and len(body) > 199_000
    assert set(_special(enc, "<|end|><|return|>")) <= set(body.tolist())
    assert not set(_special(enc, "<|call|><|start|><|channel|><|message|>")) & set(body.tolist())
    assert body is c.allowed_token_ids()  # cached, not rebuilt per step
    c.accept(_special(enc, "<|end|>")[0])
    assert _allowed(c) == _special(enc, "<|start|>")
    c.accept(_special(enc, "<|start|>")[0])
    assert _allowed(c) == enc.encode("assistant")


def test_constraint_without_tools_forbids_recipients(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    c = fmt.constraint_for(PromptRequest(items=[]))
    for t in _special(enc, "<|channel|>commentary"):
        c.accept(t)
    assert _allowed(c) == _special(enc, "<|message|>")


def test_constraint_off_grammar_token_disables_it(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    c = fmt.new_constraint()
    c.accept(enc.encode("hello")[0])  # e.g. replaying tokens sampled without a constraint
    assert c.allowed_token_ids() is None


def test_next_turn_prefix_is_how_the_next_turn_starts(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    """What an idle worker prefills after a run: the next turn's prompt starts with it, whatever that turn
    adds, and only the new message's text and the assistant header follow. Earlier reasoning is dropped
    as the next turn drops it."""
    request = PromptRequest(items=[_text("user", "What is 2+2?")], instructions="Be brief.")
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Add them."}], "summary": []}
    answer = _text("assistant", "It is 4.", "output_text")
    prefix = next_turn_prefix(fmt, request, [reasoning, answer])
    follow_up = fmt.render(
        PromptRequest(items=[*request.items, reasoning, answer, _text("user", "And 3+3?")], instructions="Be brief.")
    )
    assert follow_up[: len(prefix)] == prefix
    assert enc.decode(follow_up[len(prefix) :]) == "And 3+3?<|end|><|start|>assistant"
    assert "Add them" not in enc.decode(prefix) and enc.decode(prefix).endswith(
        "It is 4.<|end|><|start|>user<|message|>"
    )
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2}'}
    tools = (
        {"type": "function", "name": "add", "description": "Adds", "parameters": {"type": "object"}, "strict": False},
    )
    with_tools = PromptRequest(items=request.items, instructions="Be brief.", tools=tools)
    prefix = next_turn_prefix(fmt, with_tools, [call])
    output = {"type": "function_call_output", "call_id": "c1", "output": "4"}
    next_prompt = fmt.render(PromptRequest(items=[*request.items, call, output], instructions="Be brief.", tools=tools))
    common = next((i for i, (a, b) in enumerate(zip(prefix, next_prompt, strict=False)) if a != b), len(prefix))
    assert enc.decode(prefix[:common]).endswith('{"a": 2}<|call|><|start|>')  # the call is prefilled ahead


def test_partial_turn_is_how_the_next_turn_starts(fmt: HarmonyFormat, enc: HarmonyEncoding) -> None:
    """What is warmed while a continued conversation's turn decodes: however far the answer has come, the
    next turn starts with it (the answer's last word, still growing, is left out)."""
    request = PromptRequest(items=[_text("user", "Tell me a story.")], instructions="Be brief.")
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "A short one."}], "summary": []}
    text = "Once upon a time, 12345 dragons lived in Zürich.\n\nThe end."
    follow_up = fmt.render(
        PromptRequest(
            items=[*request.items, reasoning, _text("assistant", text, "output_text"), _text("user", "More.")],
            instructions="Be brief.",
        )
    )
    partial = PartialTurn(fmt, request)  # one per run: the head is rendered once, the text encoded each time
    lengths = []
    for cut in range(0, len(text) + 1, 3):
        prefix = partial.prefix([reasoning, _text("assistant", text[:cut], "output_text")])
        assert prefix and follow_up[: len(prefix)] == prefix, cut
        assert "A short one" not in enc.decode(prefix)  # the reasoning is dropped as the next turn drops it
        lengths.append(len(prefix))
    assert lengths == sorted(lengths) and "12345 dragons lived in" in enc.decode(prefix)
    assert partial.prefix([]) == [] and partial.prefix([{"type": "reasoning", "summary": []}]) == []
