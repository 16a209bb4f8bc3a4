"""Incremental Harmony output parser: completion tokens -> output item chunks.

Wraps openai_harmony.StreamableParser (strict). The Harmony parser owns the
grammar; we only watch its state change on special tokens (ordinary tokens
never move it between header and content) to open and close items.

Kind of an item, decided once its header is complete (at `<|message|>`):
  - a recipient (e.g. `to=functions.get_weather`) -> "function_call", name without the `functions.` prefix;
  - channel "analysis" -> "reasoning";
  - anything else ("final", or a "commentary" preamble without recipient) -> "message".
"""

from __future__ import annotations

from openai_harmony import HarmonyEncoding, Role, StreamableParser, StreamState

from service.prompting.base import ItemDelta, ItemEnded, ItemStarted, MalformedOutput, OutputChunk

FUNCTIONS_PREFIX = "functions."


def _kind_of(channel: str | None, recipient: str | None) -> ItemStarted:
    if recipient:
        name = recipient.removeprefix(FUNCTIONS_PREFIX)
        return ItemStarted("function_call", name=name)
    if channel == "analysis":
        return ItemStarted("reasoning")
    return ItemStarted("message")


class HarmonyOutputParser:
    """OutputParser for one assistant completion (the prompt ended with `<|start|>assistant`)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._parser = StreamableParser(encoding, Role.ASSISTANT, strict=True)
        self._open = False
        self._error: str | None = None
        self._count = 0

    def feed(self, token_id: int) -> list[OutputChunk]:
        if self._error is not None:
            raise MalformedOutput(self._error)
        self._count += 1
        try:
            self._parser.process(token_id)
            return self._chunks_after(token_id)
        except MalformedOutput as exc:
            self._error = str(exc)
            raise
        except Exception as exc:  # HarmonyError, or anything odd from the Rust side: the model's output is bad
            self._error = f"invalid Harmony output at completion token {self._count} (id {token_id}): {exc}"
            raise MalformedOutput(self._error) from exc

    def _chunks_after(self, token_id: int) -> list[OutputChunk]:
        out: list[OutputChunk] = []
        if self._encoding.is_special_token(token_id):
            in_content = self._parser.state is StreamState.CONTENT
            if self._open and not in_content:
                self._open = False
                out.append(ItemEnded())
            elif not self._open and in_content:
                role = self._parser.current_role
                if role is not Role.ASSISTANT:
                    raise MalformedOutput(f"model wrote a message as {role.value if role else 'no role'!r}")
                self._open = True
                out.append(_kind_of(self._parser.current_channel, self._parser.current_recipient))
                return out  # the header token itself carries no content
        if self._open:
            delta = self._parser.last_content_delta
            if delta:
                out.append(ItemDelta(delta))
        return out

    def finish(self) -> list[OutputChunk]:
        if self._error is None and self._open:
            self._open = False
            return [ItemEnded()]
        return []
