"""`recorder.landed` for tool facts: after a commit whose outcome was lost (a store outage), a write holding
a tool fact is judged by the fact itself (its kind and call index), not by the token count it does not move."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.agent import calls
from service.store import event_log, recorder

RID = "resp_toolfactlanded0001"


async def log(db: AsyncEngine, kind: str, data: dict[str, Any]) -> None:
    async with db.begin() as connection:
        await event_log.append_fact(connection, RID, kind, data)


def started(index: int) -> dict[str, Any]:
    key = f"{RID}:tool:{index}"
    return {"index": index, "namespace": "counter", "name": "pick", "arguments": "{}", "idempotency_key": key}


def test_the_store_knows_the_agent_loops_fact_kinds() -> None:
    assert event_log.TOOL_FACT_KINDS == (calls.STARTED, calls.RESULT)


async def test_a_tool_fact_landed_only_when_it_is_in_the_log(db: AsyncEngine) -> None:
    await log(db, "tokens", {"ids": [1]})
    start = recorder.RunWrite(RID, facts=[(calls.STARTED, started(0))], token_facts_before=1)
    # No events and no tokens: before, such a write counted as landed whatever happened.
    assert await recorder.landed(db, [start]) == set()
    await log(db, calls.STARTED, started(0))
    assert await recorder.landed(db, [start]) == {RID}
    result = recorder.RunWrite(
        RID,
        facts=[(calls.RESULT, {"index": 0, "output": "ok", "error": None})],
        events=[{"type": "response.mcp_call.completed", "sequence_number": 7}],
        token_facts_before=1,
    )
    assert await recorder.landed(db, [result]) == set(), "the started fact of the same call is not its result"
    await log(db, calls.RESULT, {"index": 0, "output": "ok", "error": None})
    assert await recorder.landed(db, [result]) == {RID}
    # The next call's start (index 1) is judged by itself, not by the first call's facts.
    assert await recorder.landed(db, [recorder.RunWrite(RID, facts=[(calls.STARTED, started(1))])]) == set()
