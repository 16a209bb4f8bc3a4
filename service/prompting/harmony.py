"""The Harmony chat format (gpt-oss): Responses items <-> Harmony messages and tokens."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import llguidance
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
    ToolNamespaceConfig,
)

from service.constraints.plan import DecodingPlan
from service.constraints.tokenizer import harmony_tokenizer
from service.prompting.base import ChatFormat, ConversationItem, FunctionTool, PromptRequest
from service.prompting.harmony_constraint import HarmonyHeaderConstraint, HarmonyVocab
from service.prompting.harmony_parser import FUNCTIONS_PREFIX, HarmonyOutputParser
from service.prompting.harmony_render import BoundedRenderer
from service.prompting.harmony_tools import SERVER_ITEM_TYPES, server_item_messages, tool_author, tool_result_tokens
from service.protocol.client_tools import as_function_item
from service.protocol.items import unseen_part_text
from service.vocab import load_harmony

_EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
# We drop earlier turns' reasoning ourselves (see drop_earlier_reasoning), so tell harmony not to.
_KEEP_ANALYSIS = RenderConversationConfig(auto_drop_analysis=False)
JSON_CONTENT_TYPE = "<|constrain|>json"

_TOOL_TYPES = ("function", "custom")  # both are addressed as functions.NAME

_vocab_cache: dict[int, HarmonyVocab] = {}


def _vocab_for(encoding: HarmonyEncoding) -> HarmonyVocab:
    # Built once per encoding object (~1.6 MB per body mask), shared by every request.
    vocab = _vocab_cache.get(id(encoding))
    if vocab is None or vocab.encoding is not encoding:
        vocab = _vocab_cache[id(encoding)] = HarmonyVocab(encoding)
    return vocab


def _text_of(content: Any, *, item: ConversationItem) -> str:
    """The text of a Responses content field: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])  # input_text, output_text, reasoning_text, summary_text, refusal-free text
        elif isinstance(part, dict) and part.get("type") == "refusal":
            parts.append(str(part.get("refusal", "")))
        elif (unseen := unseen_part_text(part)) is not None:
            parts.append(unseen)  # a tool returned an image or a file: the model is told it cannot see it
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content part {kind!r} is not supported by the harmony format (item {item!r:.200})")
    return "".join(parts)


def function_tool_description(tool: FunctionTool) -> ToolDescription:
    if tool.get("type") == "custom":
        return custom_tool_description(tool)
    params = tool.get("parameters")
    if not params or not params.get("properties"):
        params = None  # renders `() => any`, as gpt-oss saw argument-less tools in training
    return ToolDescription.new(tool["name"], tool.get("description") or "", parameters=params)


def custom_tool_description(tool: FunctionTool) -> ToolDescription:
    """A custom tool takes raw text, not JSON: rendered as a function with no JSON parameters whose
    description states the input format (the call header then carries no `<|constrain|>json`)."""
    fmt = tool.get("format") or {"type": "text"}
    description = tool.get("description") or ""
    if fmt.get("type") == "grammar":
        syntax = "Lark grammar" if fmt.get("syntax") == "lark" else "regular expression"
        note = f"Input: raw text (not JSON) matching this {syntax}:\n{fmt.get('definition', '')}"
    else:
        note = "Input: raw text (not JSON)."
    return ToolDescription.new(tool["name"], f"{description}\n{note}".strip(), parameters=None)


def response_format_section(fmt: dict[str, Any] | None) -> str:
    """The developer-message section gpt-oss reads a structured-output format from (Harmony's
    `# Response Formats`), appended to the instructions."""
    if not fmt:
        return ""
    if fmt.get("type") == "json_schema":
        description = f"// {fmt['description']}\n" if fmt.get("description") else ""
        schema = json.dumps(fmt.get("schema"), ensure_ascii=False)
        return f"\n\n# Response Formats\n\n## {fmt.get('name', 'response')}\n\n{description}{schema}"
    if fmt.get("type") == "json_object":
        return "\n\n# Response Formats\n\nRespond with a JSON object."
    return ""


def server_namespaces(tools: Sequence[FunctionTool]) -> list[ToolNamespaceConfig]:
    """MCP tools (type `mcp_function`, with their server label as `namespace`) grouped per server."""
    grouped: dict[str, list[ToolDescription]] = {}
    descriptions: dict[str, str | None] = {}
    for tool in tools:
        if tool.get("type") != "mcp_function":
            continue
        grouped.setdefault(tool["namespace"], []).append(function_tool_description({**tool, "type": "function"}))
        descriptions[tool["namespace"]] = tool.get("server_description")
    return [ToolNamespaceConfig(name=n, description=descriptions[n], tools=t) for n, t in grouped.items()]


def items_to_messages(items: Sequence[ConversationItem]) -> list[Message]:
    """Conversation items -> Harmony messages (no system/developer header messages)."""
    names_by_call_id: dict[str, str] = {}
    out: list[Message] = []
    for item in map(as_function_item, items):  # a client tool's call/output reads as its function's
        kind = item.get("type", "message")  # Responses allows bare {"role", "content"} messages
        if kind == "message":
            role = item.get("role")
            text = _text_of(item.get("content"), item=item)
            if role == "user":
                out.append(Message.from_role_and_content(Role.USER, text))
            elif role in ("system", "developer"):
                # Harmony's system message is reserved for meta (identity, effort, channels):
                # gpt-oss reads user-supplied system prompts from developer messages.
                out.append(Message.from_role_and_content(Role.DEVELOPER, text))
            elif role == "assistant":
                out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
            else:
                raise ValueError(f"message role {role!r} is not supported")
        elif kind == "reasoning":
            text = _text_of(item.get("content") or item.get("summary"), item=item)
            out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"))
        elif kind == "function_call":
            names_by_call_id[item["call_id"]] = item["name"]
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, item.get("arguments") or "")
                .with_channel("commentary")
                .with_recipient(FUNCTIONS_PREFIX + item["name"])
                .with_content_type(JSON_CONTENT_TYPE)
            )
        elif kind == "custom_tool_call":
            names_by_call_id[item["call_id"]] = item["name"]
            out.append(
                Message.from_role_and_content(Role.ASSISTANT, item.get("input") or "")
                .with_channel("commentary")
                .with_recipient(FUNCTIONS_PREFIX + item["name"])
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            name = names_by_call_id.get(item["call_id"])
            if name is None:
                raise ValueError(f"function_call_output for unknown call_id {item['call_id']!r}")
            output = item.get("output")
            text = output if isinstance(output, str) else _text_or_json(output, item)
            out.append(
                Message.from_author_and_content(Author.new(Role.TOOL, FUNCTIONS_PREFIX + name), text)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        elif kind in SERVER_ITEM_TYPES:
            out += server_item_messages(item, items)
        else:
            raise ValueError(f"conversation item of type {kind!r} is not supported by the harmony format")
    return out


def _text_or_json(output: Any, item: ConversationItem) -> str:
    try:
        return _text_of(output, item=item)
    except (ValueError, TypeError):
        return json.dumps(output, ensure_ascii=False)


def drop_earlier_reasoning(messages: list[Message]) -> list[Message]:
    """Harmony: reasoning of turns that ended in a `final` message is not shown again.

    openai-harmony's own auto_drop_analysis only drops analysis before the *first* final
    message, and only when the conversation's last assistant message is final; that keeps
    the reasoning of turns 2..n-1 and of the turn before a tool result. We drop every
    analysis message before the *last* final message and keep the ongoing turn's reasoning
    (needed while it is calling functions).
    """
    last_final = max(
        (i for i, m in enumerate(messages) if m.author.role == Role.ASSISTANT and m.channel == "final"), default=-1
    )
    return [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]


class HarmonyFormat(ChatFormat):
    """ChatFormat for Harmony models. Stateless and shared by all requests; use
    `constraint_for(request)` (not new_constraint()) so the request's function tools can be called."""

    name = "harmony"

    def __init__(
        self,
        encoding: HarmonyEncoding | None = None,
        *,
        model_identity: str | None = None,
        conversation_start_date: str | None = None,
        knowledge_cutoff: str | None = None,
    ) -> None:
        self.encoding = encoding if encoding is not None else load_harmony()
        self._vocab = _vocab_for(self.encoding)
        self._renderer = BoundedRenderer(self.encoding)
        self._model_identity = model_identity
        self._start_date = conversation_start_date  # fixed string or None: prompts stay deterministic
        self._knowledge_cutoff = knowledge_cutoff
        self._stop = frozenset(self.encoding.stop_tokens_for_assistant_actions())
        # The grammar tokenizer takes about a second to build: start now, in the background, so the
        # first constrained request (or a resume replaying one) does not wait for all of it.
        threading.Thread(target=harmony_tokenizer, args=(self.encoding,), name="grammar-tokenizer", daemon=True).start()

    def constraint_for(self, request: PromptRequest, plan: DecodingPlan | None = None) -> HarmonyHeaderConstraint:
        """A fresh constraint for one completion of `request`: with a plan, what it allows (tool_choice,
        grammars, reasoning budget); without one, calls to any of its function tools (new_constraint()
        allows none). On resume, replay generated tokens via accept()."""
        if plan is not None:
            return HarmonyHeaderConstraint(self._vocab, plan=plan, tokenizer=self.grammar_tokenizer())
        names = [t["name"] for t in request.tools if t.get("type", "function") == "function"]
        return HarmonyHeaderConstraint(self._vocab, names)

    def grammar_tokenizer(self) -> llguidance.LLTokenizer:
        """The llguidance tokenizer over this encoding's vocabulary (built once, ~1 s)."""
        return harmony_tokenizer(self.encoding)

    def system_message(self, request: PromptRequest) -> Message:
        content = SystemContent.new().with_reasoning_effort(_EFFORT[request.reasoning_effort])
        if any(t.get("type") == "python" for t in request.tools):
            content = content.with_python_tool()  # the code interpreter, as gpt-oss was trained to see it
        if self._model_identity is not None:
            content = content.with_model_identity(self._model_identity)
        if self._knowledge_cutoff is not None:
            content = content.with_knowledge_cutoff(self._knowledge_cutoff)
        if self._start_date is not None:
            content = content.with_conversation_start_date(self._start_date)
        return Message.from_role_and_content(Role.SYSTEM, content)

    def developer_message(self, request: PromptRequest) -> Message | None:
        tools = [function_tool_description(t) for t in request.tools if t.get("type", "function") in _TOOL_TYPES]
        instructions = (request.instructions or "") + response_format_section(request.response_format)
        if not instructions and not tools:
            return None
        namespaces = server_namespaces(request.tools)
        if not instructions and not tools and not namespaces:
            return None
        content = DeveloperContent.new()
        if instructions:
            content = content.with_instructions(instructions.lstrip("\n"))
        if tools:
            content = content.with_function_tools(tools)
        for namespace in namespaces:  # MCP servers: their tools under the server label, like functions
            content = content.with_tools(namespace)
        return Message.from_role_and_content(Role.DEVELOPER, content)

    def messages(self, request: PromptRequest) -> list[Message]:
        """Every Harmony message of the prompt, in order, reasoning of earlier turns dropped."""
        head = [self.system_message(request)]
        developer = self.developer_message(request)
        if developer is not None:
            head.append(developer)
        return head + drop_earlier_reasoning(items_to_messages(request.items))

    def render(self, request: PromptRequest) -> list[int]:
        """What harmony's render_conversation_for_completion gives (analysis kept: we drop it ourselves), in
        bounded native calls, so that a long run of one character cannot hold the GIL for seconds."""
        return self._renderer.conversation_for_completion(self.messages(request))

    def render_natively(self, request: PromptRequest) -> list[int]:
        """The reference: harmony's own rendering, in one native call (tests compare render() with it)."""
        convo = Conversation.from_messages(self.messages(request))
        return list(self.encoding.render_conversation_for_completion(convo, Role.ASSISTANT, _KEEP_ANALYSIS))

    def stop_token_ids(self) -> frozenset[int]:
        return self._stop  # <|return|>, <|call|>

    def new_parser(self) -> HarmonyOutputParser:
        return HarmonyOutputParser(self.encoding)

    def new_constraint(self) -> HarmonyHeaderConstraint:
        return HarmonyHeaderConstraint(self._vocab, ())

    def token_text(self, token_id: int) -> str:
        return str(self.encoding.decode([token_id]))

    def encode_text(self, text: str) -> list[int]:
        return self._renderer.encode_text(text)  # in bounded pieces (see bounded_encode)

    def count_tokens(self, text: str) -> int:
        return len(self.encode_text(text))

    def server_tool_result_tokens(self, namespace: str, name: str, text: str) -> list[int]:
        """The tool's message (author `namespace.name`, or `python`), then `<|start|>assistant` (harmony_tools)."""
        return tool_result_tokens(self.encoding, tool_author(namespace, name), text)

    def approved_call_prompt(self, request: PromptRequest, prompt_ids: list[int]) -> list[int] | None:
        """The rendered prompt ends at the approved call's `<|call|>` (its completion suffix `<|start|>assistant`
        removed); None when it does not end with a call."""
        suffix = list(self.encoding.encode("<|call|><|start|>assistant", allowed_special="all"))
        if prompt_ids[-len(suffix) :] != suffix:
            return None
        return prompt_ids[: -len(suffix) + 1]
