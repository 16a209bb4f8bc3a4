"""Wire models, split by family: requests, items, tools, text format, the Response object.

Shapes follow the OpenAI Responses API as typed by the official `openai` package. Anything we
do not implement is rejected with a 400 naming the field, never ignored. Import from here.
"""

from service.protocol.ids import derived_id, is_response_id, new_response_id
from service.protocol.items import ConversationItem, InputItem, item_role, item_text
from service.protocol.normalize import normalize_input
from service.protocol.requests import CreateResponseRequest, parse_create_request, wants_logprobs
from service.protocol.response import TERMINAL_EVENT_TYPES, TERMINAL_STATUSES, initial_response

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_STATUSES",
    "ConversationItem",
    "CreateResponseRequest",
    "InputItem",
    "derived_id",
    "is_response_id",
    "initial_response",
    "item_role",
    "item_text",
    "new_response_id",
    "normalize_input",
    "parse_create_request",
    "wants_logprobs",
]
