"""The pure fold of a conversation's events."""

from __future__ import annotations

from typing import Any

import pytest

from service.store.conversation_fold import entries_for, fold


def _item(n: int) -> dict[str, Any]:
    return {"id": f"msg_{n}", "type": "message", "role": "user", "content": [{"type": "input_text", "text": str(n)}]}


def _created(*items: dict[str, Any]) -> dict[str, Any]:
    conversation = {"id": "conv_a", "object": "conversation", "created_at": 1, "metadata": {}}
    entries = entries_for(list(items), first_ordinal=0, source="client", response_id=None)
    return {
        "type": "conversation.created",
        "sequence_number": 0,
        "at": 1.5,
        "conversation": conversation,
        "entries": entries,
    }


def test_fold_applies_updates_appends_and_deletes_in_order() -> None:
    added = entries_for([_item(2), _item(3)], first_ordinal=2, source="output", response_id="resp_x")
    state = fold(
        [
            _created(_item(0), _item(1)),
            {"type": "conversation.updated", "sequence_number": 1, "at": 2.0, "metadata": {"k": "v"}},
            {"type": "conversation.items.added", "sequence_number": 2, "at": 3.0, "entries": added},
            {"type": "conversation.item.deleted", "sequence_number": 3, "at": 4.0, "ordinal": 3},
        ]
    )
    assert state.conversation["metadata"] == {"k": "v"} and state.updated_at == 4.0
    assert [state.entries[o]["item"]["id"] for o in sorted(state.entries)] == ["msg_0", "msg_1", "msg_2"]
    assert state.entries[2]["response_id"] == "resp_x" and state.entries[2]["source"] == "output"
    # A deleted last item keeps its ordinal: the next append does not reuse it.
    assert state.next_ordinal == 4


def test_fold_refuses_a_log_that_does_not_start_with_created() -> None:
    with pytest.raises(ValueError):
        fold([])
    with pytest.raises(ValueError):
        fold([{"type": "conversation.updated", "sequence_number": 0, "at": 1.0, "metadata": {}}])
    with pytest.raises(ValueError):
        fold([_created(), {"type": "conversation.renamed", "sequence_number": 1, "at": 1.0}])
