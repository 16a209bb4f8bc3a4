"""Transactions that span the logs, the projections and the run table.

Each public function is one database transaction: a command (create, cancel, delete)
or one engine step of every run a worker owns (group commit).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import conversations as conversation_store
from service.store import event_codec, event_log, leases, read_models, token_facts
from service.store import webhook_outbox as outbox
from service.store.db import write_transaction
from service.store.schema import DEFAULT_PROJECT


@dataclass
class RunWrite:
    """What one run adds in one step."""

    response_id: str
    facts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (kind, data)
    events: list[dict[str, Any]] = field(default_factory=list)
    # The run's projected Response when the row should be refreshed, folded through `projection_through`,
    # one of `events` (the row is stored with that event's position; readers fold what follows it).
    projection: dict[str, Any] | None = None
    projection_through: dict[str, Any] | None = None
    output_ordinal_base: int = 0  # ordinal of output item 0 in conversation_items
    terminal: bool = False
    # Token ids the run had in the log (or queued before this write) when this write began:
    # after a commit whose outcome was never heard, the count in the log says whether it landed.
    token_facts_before: int = 0
    # While the write's last `tokens` fact is a group that later steps may join: where that group's events start
    # (see StreamBuilder.fold_into); None once anything else follows it.
    group_start: int | None = None

    _encoded: list[event_codec.EncodedEvent] = field(default_factory=list, repr=False)

    def encoded_events(self) -> list[event_codec.EncodedEvent]:
        """`events` serialized once, for the log and for live readers (events are only ever appended)."""
        for event in self.events[len(self._encoded) :]:
            self._encoded.append(event_codec.encode_event(self.response_id, event))
        return self._encoded

    def join_group(self, token_fact: dict[str, Any]) -> None:
        """Add one step's token ids to the open group (its events are folded in by the caller)."""
        assert self.group_start is not None and self.facts and self.facts[-1][0] == "tokens"
        self.facts[-1] = ("tokens", token_facts.join_last_group(self.facts[-1][1], token_fact))

    def merge(self, later: RunWrite) -> None:
        """Fold a later step of the same run into this one (the DB was slower than the engine)."""
        self.group_start = None if later.group_start is None else len(self.events) + later.group_start
        self.facts += later.facts
        self.events += later.events
        if later.projection is not None:
            self.projection, self.projection_through = later.projection, later.projection_through
        self.terminal = self.terminal or later.terminal


@dataclass(frozen=True)
class StepOutcome:
    cancel_requested: dict[str, bool]  # runs this worker still owns
    lost: set[str]  # runs whose writes were dropped: another owner, deleted, or a sequence conflict


async def create_response(
    engine: AsyncEngine,
    *,
    request_fact: dict[str, Any],
    created_event: dict[str, Any],
    response: dict[str, Any],
    input_items: Sequence[dict[str, Any]],
    background: bool,
    lease_seconds: float,
    project: str = DEFAULT_PROJECT,
    admit: Callable[[int, int], None] | None = None,
    also: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """`admit(project_runs, all_runs)`: called with the runs queued or generating (the project's, every
    project's) inside the transaction, before anything is written; it raises to refuse the run. Counted
    under the append lock, so two creates cannot both take the last place, and in the same round trip.
    `also(connection)`: more rows written in the same transaction (a response's `auto` container)."""
    response_id = response["id"]

    async def create(connection: Any) -> None:
        await event_log.lock_for_append(connection)
        if admit is not None:
            admit(*await leases.unfinished_runs_of(connection, project))
        await event_log.append_fact(connection, response_id, "request", request_fact)
        position = await event_log.append_events(connection, response_id, [created_event])
        await read_models.insert_response(connection, response, position=position, project=project)
        await read_models.insert_items(connection, response_id, input_items, source="input", first_ordinal=0)
        await leases.enqueue(
            connection, response_id, background=background, owner=None, lease_seconds=lease_seconds, project=project
        )
        if also is not None:
            await also(connection)

    await write_transaction(engine, create)  # on SQLite: one thread hop


async def commit_step(
    engine: AsyncEngine,
    owner: str,
    writes: Sequence[RunWrite],
    *,
    lease_seconds: float,
    chunks: token_facts.TokenChunks | None = None,
) -> StepOutcome:
    """Append every run's step in one transaction; a run that lost its lease is skipped, and a
    sequence conflict (a rival owner got there first) drops only that run. `chunks`: the writer's
    memory of its runs' last token chunks (token_facts.TokenChunks)."""
    try:
        return await _commit(engine, owner, writes, lease_seconds, chunks)
    except event_log.SequenceConflict:
        pass
    # Isolate the conflicting run(s): commit each run alone.
    cancels: dict[str, bool] = {}
    lost: set[str] = set()
    for write in writes:
        try:
            outcome = await _commit(engine, owner, [write], lease_seconds, chunks)
        except event_log.SequenceConflict:
            lost.add(write.response_id)
            continue
        cancels.update(outcome.cancel_requested)
        lost |= outcome.lost
    return StepOutcome(cancels, lost)


async def _commit(
    engine: AsyncEngine,
    owner: str,
    writes: Sequence[RunWrite],
    lease_seconds: float,
    chunks: token_facts.TokenChunks | None,
) -> StepOutcome:
    async def transaction(connection: Any) -> tuple[dict[str, bool], set[str], list[RunWrite]]:
        await event_log.lock_for_append(connection)
        owned = await leases.fence(connection, owner, [w.response_id for w in writes], lease_seconds=lease_seconds)
        lost = {w.response_id for w in writes} - owned.keys()
        kept = [w for w in writes if w.response_id not in lost]
        # One statement per table for the whole group, not per run: a round trip each.
        await event_log.append_facts(
            connection, [(w.response_id, kind, data) for w in kept for kind, data in w.facts], chunks
        )
        positions = await event_log.append_encoded(connection, [e for w in kept for e in w.encoded_events()])
        for write in kept:
            await _apply_write(connection, write, positions)
        return owned, lost, kept

    try:
        owned, lost, kept = await write_transaction(engine, transaction)  # on SQLite: one thread hop
    except BaseException:
        if chunks is not None:
            chunks.forget(w.response_id for w in writes)  # rolled back, or landed unheard: read them next time
        raise
    if chunks is not None:
        chunks.forget([*lost, *(w.response_id for w in kept if w.terminal)])
    return StepOutcome(owned, lost)


async def _apply_write(connection: Any, write: RunWrite, positions: event_log.Positions) -> None:
    """The read models of a write whose facts and events are appended (`positions`: of every appended event)."""
    rid = write.response_id
    await read_models.insert_output_items(connection, rid, write.events, input_item_count=write.output_ordinal_base)
    if write.projection is not None and write.projection_through is not None:
        # The snapshot's own position, not the write's last: events after it (later steps merged into this
        # write) are not in the snapshot, and a reader folds the log after the row's position onto it.
        position = positions[(rid, write.projection_through["sequence_number"])]
        await read_models.update_response(connection, write.projection, position=position)
    if write.terminal:
        await leases.mark_done(connection, rid)
        await conversation_store.append_response_items(connection, rid)
        await outbox.enqueue_terminal(connection, rid, write.events)  # webhooks: in the terminal's transaction


async def landed(engine: AsyncEngine, writes: Sequence[RunWrite]) -> set[str]:
    """The runs whose write is already in the log (a commit cut off before its answer may
    have landed). Raises when the store cannot be read."""
    ids = [w.response_id for w in writes]
    tool_facts = {w.response_id: _tool_facts(w) for w in writes}
    async with engine.connect() as connection:
        token_counts = await event_log.count_tokens(connection, ids)
        last_sequence = await event_log.last_sequence_numbers(connection, ids)
        with_tools = [rid for rid, facts in tool_facts.items() if facts]
        logged_tools = await event_log.logged_tool_facts(connection, with_tools)
    found: set[str] = set()
    for write in writes:
        rid = write.response_id
        tokens = sum(len(data["ids"]) for kind, data in write.facts if kind == "tokens")
        if tool_facts[rid]:  # exact: the write's own tool facts (one transaction: all landed or none)
            if tool_facts[rid] <= logged_tools[rid]:
                found.add(rid)
        elif tokens:
            if token_counts[rid] >= write.token_facts_before + tokens:
                found.add(rid)
        elif write.events:
            if last_sequence[rid] >= write.events[-1]["sequence_number"]:
                found.add(rid)
        else:
            found.add(rid)  # nothing to write
    return found


def _tool_facts(write: RunWrite) -> set[tuple[str, int]]:
    return {(kind, int(data["index"])) for kind, data in write.facts if kind in event_log.TOOL_FACT_KINDS}


async def request_cancel(engine: AsyncEngine, response_id: str, *, project: str | None) -> bool:
    """Log a cancel request for a run of `project` that is still going. Ordered against DELETE and the
    run's own commits by the append lock, so a cancel racing a delete never leaves an orphan fact."""
    async with engine.begin() as connection:
        await event_log.lock_for_append(connection)
        run = await leases.get_run(connection, response_id, project=project)
        if run is None or run.done:
            return False
        await event_log.append_fact(connection, response_id, "cancel_requested", {})
        await leases.request_cancel(connection, response_id)
        return True


async def release(engine: AsyncEngine, owner: str, response_ids: Sequence[str]) -> None:
    async with engine.begin() as connection:
        await leases.release(connection, owner, response_ids)


async def delete_response(engine: AsyncEngine, response_id: str, *, project: str | None) -> bool:
    async with engine.begin() as connection:
        await event_log.lock_for_append(connection)
        if not await read_models.exists(connection, response_id, project=project):
            return False
        await _delete(connection, response_id)
        return True


async def delete_finished_unstored(engine: AsyncEngine) -> None:
    """store=false responses are kept only until their client has read the end; after a crash, sweep them."""
    async with engine.begin() as connection:
        await event_log.lock_for_append(connection)
        for response_id in await read_models.finished_unstored(connection):
            await _delete(connection, response_id)


async def delete_in(connection: Any, response_id: str) -> None:
    """Delete a response whole inside the caller's transaction (which holds the append lock)."""
    await _delete(connection, response_id)


async def _delete(connection: Any, response_id: str) -> None:
    await event_log.delete_log(connection, response_id)
    await read_models.delete_projections(connection, response_id)
    await leases.delete_run(connection, response_id)
    await outbox.delete_undelivered(connection, response_id)
