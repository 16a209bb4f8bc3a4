"""Harmony rendering whose cost stays linear in the text, in bounded native calls.

openai-harmony renders a conversation in one native call that tokenizes every text in it while holding the
GIL, and its tokenizer is quadratic in the length of one pre-token (see bounded_encode). Harmony renders a
message as its header, then each content's text tokenized on its own, then an end token; so we let harmony
render what is small (a header: a message with its text left out) and tokenize the texts ourselves, in
pieces. A developer message's content is text that harmony composes (instructions, tool descriptions and
schemas as TypeScript): it is rendered with every long stretch of its strings stood in for by a short
placeholder, decoded, the stretches put back, and tokenized in pieces. The result is token for token what
harmony renders (tests compare them) except where a stretch of text has no pre-token boundary for longer than
bounded_encode.MAX_PIECE_CHARS; it depends only on the messages, so a resumed run rebuilds the same prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from openai_harmony import (
    DeveloperContent,
    HarmonyEncoding,
    Message,
    RenderOptions,
    Role,
    SystemContent,
    TextContent,
)

from service.prompting.bounded_encode import encode_in_pieces

# Header strings (an author or recipient name) longer than this are tokenized here rather than by harmony.
_LONG_HEADER_CHARS = 256
# Stretches of a developer message's strings at least this long are stood in for while harmony composes it.
_MIN_STAND_IN_CHARS = 64
# A stretch harmony copies verbatim wherever it puts a string: no line break (descriptions are split into
# `// ` lines), no control character or quote (in case of escaping), not starting or ending with a space (in
# case of trimming). `null` is left alone: harmony looks for it in composed types.
_STRETCH = re.compile(
    rf"[^\s\x00-\x1f\x7f\"\\](?:[^\r\n\x00-\x1f\x7f\"\\\x85\u2028\u2029]{{{_MIN_STAND_IN_CHARS - 2},}}"
    r"[^\s\x00-\x1f\x7f\"\\])"
)
# Stand-in delimiters: private-use characters, the first one absent from the message is taken.
_DELIMITERS = [chr(c) for c in (*range(0xE000, 0xF900), *range(0xF0000, 0xFFFFE), *range(0x100000, 0x10FFFE))]


class BoundedRenderer:
    """Renders Harmony messages like `HarmonyEncoding.render_conversation_for_completion`, in bounded calls."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self.encoding = encoding
        self._start, self._message, self._channel, self._constrain, self._end, self._call = (
            encoding.encode(t, allowed_special="all")[0]
            for t in ("<|start|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|end|>", "<|call|>")
        )

    def encode_text(self, text: str) -> list[int]:
        """Plain text (special tokens in it taken as text), in bounded calls."""
        return encode_in_pieces(self._encode_piece, text)

    def _encode_piece(self, text: str) -> list[int]:
        return list(self.encoding.encode(text, disallowed_special=()))

    def conversation_for_completion(self, messages: Sequence[Message], next_role: Role = Role.ASSISTANT) -> list[int]:
        """The conversation, then the next message's `<|start|>role` (harmony's analysis dropping is off)."""
        options = RenderOptions(conversation_has_function_tools=has_function_tools(messages))
        out: list[int] = []
        for message in messages:
            out += self.message(message, options)
        return [*out, self._start, *self.encode_text(next_role.value)]

    def message(self, message: Message, options: RenderOptions | None = None) -> list[int]:
        """One message's tokens, as `HarmonyEncoding.render` gives them."""
        options = options or RenderOptions()
        head, end = self._frame(message, options)
        body: list[int] = []
        for content in message.content:
            if isinstance(content, TextContent):
                body += self.encode_text(content.text)
            elif isinstance(content, DeveloperContent):
                body += self._developer_content(content, options)
            elif isinstance(content, SystemContent):
                body += self._native_content(Role.SYSTEM, content, options)  # the server's own text: short
            else:
                raise ValueError(f"unsupported Harmony content {type(content).__name__}")
        return [*head, *body, end]

    def _frame(self, message: Message, options: RenderOptions) -> tuple[list[int], int]:
        """The message's header (`<|start|>` to `<|message|>`) and its end token."""
        header_strings = (message.author.name, message.recipient, message.channel, message.content_type)
        if all(s is None or len(s) <= _LONG_HEADER_CHARS for s in header_strings):
            shell = message.model_copy(update={"content": [TextContent(text="")]})
            tokens = list(self.encoding.render(shell, options))
            return tokens[:-1], tokens[-1]
        return self._long_header(message), self._end_token(message)

    def _long_header(self, message: Message) -> list[int]:
        # Harmony's own header rendering (openai-harmony's encoding.rs), each part tokenized on its own.
        author = message.author
        if author.role == Role.TOOL:
            if author.name is None:
                raise ValueError("a tool message needs an author name")
            out = [self._start, *self.encode_text(author.name)]
        else:
            out = [self._start, *self.encode_text(author.role.value)]
            if author.name is not None:
                out += self.encode_text(f":{author.name}")
        if message.recipient is not None and message.recipient != "all":
            out += self.encode_text(f" to={message.recipient}")
        if message.channel is not None:
            out += [self._channel, *self.encode_text(message.channel)]
        if message.content_type is not None:
            if message.content_type.startswith("<|constrain|>"):
                rest = message.content_type.removeprefix("<|constrain|>")
                out += [*self.encode_text(" "), self._constrain, *self.encode_text(rest)]
            else:
                out += self.encode_text(f" {message.content_type}")
        return [*out, self._message]

    def _end_token(self, message: Message) -> int:
        ends_in_call = message.author.role == Role.ASSISTANT and message.recipient is not None
        return int(self._call if ends_in_call else self._end)

    def _native_content(self, role: Role, content: Any, options: RenderOptions) -> list[int]:
        tokens = list(self.encoding.render(Message.from_role_and_content(role, content), options))
        return tokens[tokens.index(self._message) + 1 : -1]

    def _developer_content(self, content: DeveloperContent, options: RenderOptions) -> list[int]:
        raw = content.model_dump(exclude_none=True)
        instructions = raw.pop("instructions", None)  # copied verbatim: stood in for whole, line breaks and all
        delimiter = _free_delimiter(json.dumps([instructions, raw], ensure_ascii=False))
        if delimiter is None:  # every private-use character occurs in it: let harmony tokenize it all
            return self._native_content(Role.DEVELOPER, content, options)
        stretches: dict[str, str] = {}  # stretch -> its stand-in: equal strings stay equal, distinct distinct
        originals: list[str] = []

        def stand_in(match: re.Match[str]) -> str:
            stretch = match.group()
            if "null" in stretch:
                return stretch
            if stretch not in stretches:
                stretches[stretch] = f"{delimiter}{len(originals)}{delimiter}"
                originals.append(stretch)
            return stretches[stretch]

        mapped = _map_strings(raw, stand_in)
        if instructions is not None:
            mapped["instructions"] = f"{delimiter}{len(originals)}{delimiter}"
            originals.append(instructions)
        composed_with_stand_ins = self.encoding.decode_utf8(
            self._native_content(Role.DEVELOPER, DeveloperContent(**mapped), options)
        )
        composed = re.sub(
            rf"{delimiter}(\d+){delimiter}", lambda m: originals[int(m.group(1))], composed_with_stand_ins
        )
        return self.encode_text(composed)


def has_function_tools(messages: Sequence[Message]) -> bool:
    """Whether a developer message declares function tools (harmony then says so in the system message)."""
    for message in messages:
        for content in message.content:
            if isinstance(content, DeveloperContent) and content.tools:
                functions = content.tools.get("functions")
                if functions is not None and functions.tools:
                    return True
    return False


def _free_delimiter(text: str) -> str | None:
    present = set(text)
    return next((d for d in _DELIMITERS if d not in present), None)


def _map_strings(value: Any, stand_in: Any) -> Any:
    """`value` with every long stretch of its strings (keys too) replaced by `stand_in(match)`."""
    if isinstance(value, str):
        return _STRETCH.sub(stand_in, value) if len(value) >= _MIN_STAND_IN_CHARS else value
    if isinstance(value, dict):
        return {_map_strings(k, stand_in): _map_strings(v, stand_in) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, stand_in) for v in value]
    return value
