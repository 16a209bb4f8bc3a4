"""The pure fold of a conversation's events (no I/O).

A conversation's stream in `events` (keyed by its `conv_…` id) holds:
- `conversation.created`: `conversation` (the object), `entries` (the items it was created with) and
  `project` (the owner; absent in logs older than ownership: the default project);
- `conversation.updated`: the new `metadata`;
- `conversation.items.added`: `entries`, appended by a client or by a response that ended;
- `conversation.item.deleted`: the `ordinal` of the entry removed.
Every event carries `at` (unix seconds; the conversation's `updated_at` is its last event's).
An entry is `{"ordinal", "source", "response_id", "item"}`; ordinals only grow, so deleting an item
never renumbers the others.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from service.store.schema import DEFAULT_PROJECT

Entry = dict[str, Any]


@dataclass
class ConversationState:
    conversation: dict[str, Any]
    updated_at: float
    entries: dict[int, Entry] = field(default_factory=dict)
    next_ordinal: int = 0  # one past the highest ordinal ever used (deleted ones included)
    project: str = DEFAULT_PROJECT  # the owner

    def add(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.entries[entry["ordinal"]] = copy.deepcopy(entry)
            self.next_ordinal = max(self.next_ordinal, entry["ordinal"] + 1)


def fold(events: Iterable[dict[str, Any]]) -> ConversationState:
    state: ConversationState | None = None
    for event in events:
        state = apply(state, event)
    if state is None:
        raise ValueError("a conversation's log starts with conversation.created")
    return state


def apply(state: ConversationState | None, event: dict[str, Any]) -> ConversationState:
    kind = event["type"]
    if kind == "conversation.created":
        state = ConversationState(
            copy.deepcopy(event["conversation"]), float(event["at"]), project=event.get("project", DEFAULT_PROJECT)
        )
        state.add(event["entries"])
        return state
    if state is None:
        raise ValueError(f"event {kind} before conversation.created")
    state.updated_at = float(event["at"])
    if kind == "conversation.updated":
        state.conversation["metadata"] = dict(event["metadata"])
    elif kind == "conversation.items.added":
        state.add(event["entries"])
    elif kind == "conversation.item.deleted":
        state.entries.pop(event["ordinal"], None)
    else:
        raise ValueError(f"unknown conversation event {kind}")
    return state


def entries_for(
    items: list[dict[str, Any]], *, first_ordinal: int, source: str, response_id: str | None
) -> list[Entry]:
    return [
        {"ordinal": first_ordinal + offset, "source": source, "response_id": response_id, "item": item}
        for offset, item in enumerate(items)
    ]
