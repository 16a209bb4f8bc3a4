"""The create request's option sub-models: reasoning, scheduling and cache hints, stream options, the conversation
and context management parameters (tools are in tools.py, the text format in text.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from service.protocol.base import Strict

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
SummaryMode = Literal["auto", "concise", "detailed"]
# Every effort OpenAI accepts, onto the model's three levels (and so onto config's reasoning budgets).
MODEL_EFFORT: dict[str, Literal["low", "medium", "high"]] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


class ReasoningConfig(Strict):
    effort: Effort | None = None
    # Echoed; the stream builder adds a summary part to each reasoning item (service/reasoning_summary.py).
    summary: SummaryMode | None = None
    generate_summary: SummaryMode | None = None  # deprecated alias of `summary`


class BackgroundOptions(Strict):
    """Scheduling hints: runs start in arrival order here whatever the window."""

    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None


class PromptCacheOptions(Strict):
    """Hints for OpenAI's prompt cache; this server's prefix cache keeps what it can regardless."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = None
    # Prewarming returns no output: accepting it while generating would be a different answer.
    prewarm: bool | None = None  # true is refused in parse_create_request


class ImageOptions(Strict):
    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class StreamOptions(Strict):
    # Pads delta events with an `obfuscation` field (random characters) against length side channels.
    include_obfuscation: bool | None = None


# Tool outputs a request may ask to include; no tool that produces them runs here, so they add nothing.
NO_OP_INCLUDES = Literal[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
]


class ConversationRef(Strict):
    id: str


class ContextManagement(Strict):
    # Compact the history before generating when the prompt exceeds compact_threshold (service/compaction.py).
    type: Literal["compaction"]
    compact_threshold: Annotated[int, Field(ge=1)] | None = None


Penalty = Annotated[float, Field(ge=-2, le=2)]
