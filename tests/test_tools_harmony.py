"""The tool-result continuation for Harmony equals rendering the whole conversation for completion."""

from __future__ import annotations

from openai_harmony import Author, Conversation, Message, Role

from service.prompting.harmony import load_harmony
from service.prompting.harmony_tools import tool_author, tool_result_tokens


def test_continuation_matches_a_full_render() -> None:
    encoding = load_harmony()
    user = Message.from_role_and_content(Role.USER, "What is 2 + 40?")
    call = (
        Message.from_role_and_content(Role.ASSISTANT, '{"a": 2, "b": 40}')
        .with_channel("commentary")
        .with_recipient("counter.add")
        .with_content_type("<|constrain|>json")
    )
    author = tool_author("counter", "add")
    result = (
        Message.from_author_and_content(Author.new(Role.TOOL, author), "42")
        .with_channel("commentary")
        .with_recipient("assistant")
    )
    prompt = list(encoding.render_conversation_for_completion(Conversation.from_messages([user]), Role.ASSISTANT))
    whole = list(
        encoding.render_conversation_for_completion(Conversation.from_messages([user, call, result]), Role.ASSISTANT)
    )
    # What the model generated: the call message after the prompt's `<|start|>assistant`, ending in <|call|>.
    rendered_call = list(encoding.render(call))
    start_assistant = list(encoding.encode("<|start|>assistant", allowed_special="all"))
    generated = rendered_call[len(start_assistant) :]
    assert encoding.decode(generated[-1:]) == "<|call|>"
    assert prompt + generated + tool_result_tokens(encoding, author, "42") == whole
    assert tool_author("python", "") == "python"
