"""Table definitions. The names are a user interface (people query them with sqlite3/psql):
keep them stable and documented in docs/operations.md, "SQL inspection".

- `events`: exactly the client-visible stream events, `data` = the event JSON as sent (token deltas in
  a compact form that `event_codec` turns back into exactly that JSON).
- `run_facts`: what else a run needs to be rebuilt or resumed (request, prompt token ids,
  sampled token ids in chunks, cancel requests; a compacted stream's `token_record`). Never sent to clients.
- `runs`: operational state of a run: owner and lease (not a projection; leases are not facts).
- `responses`, `conversation_items`: projections, rebuildable from the two logs.
- `api_keys`: named keys (SHA-256 hashes only) and the project each belongs to. `responses.project`
  and `runs.project` name the owner; every read, cancel and delete filters on it in its SQL.
- `compactions`: the kept context of each compaction (not a projection; retention purges it by age).
  `server_keys`: random keys created once, used when SERVICE_SECRET_KEY is unset.
- `containers`: the code interpreter's containers, each owned by a project (not a projection).
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# The project of SERVICE_API_KEY, of unauthenticated loopback use, and of rows older than ownership.
DEFAULT_PROJECT = "default"

# BigInteger autoincrement is not rowid on SQLite; the variant keeps one definition for both.
Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "events",
    metadata,
    sa.Column("position", Position, primary_key=True, autoincrement=True),
    sa.Column("response_id", sa.String(64), nullable=False),
    sa.Column("sequence_number", sa.Integer, nullable=False),
    sa.Column("type", sa.String(80), nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("response_id", "sequence_number", name="uq_events_response_sequence"),
)

run_facts = sa.Table(
    "run_facts",
    metadata,
    sa.Column("position", Position, primary_key=True, autoincrement=True),
    sa.Column("response_id", sa.String(64), nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("background", sa.Boolean, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False, default=False),
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("lease_expires_at", sa.Float, nullable=True),  # unix seconds
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("claims", sa.Integer, nullable=False, default=0),
    sa.Column("enqueued_at", sa.Float, nullable=False),
    sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT),  # the owner
    sa.Index("ix_runs_claimable", "done", "enqueued_at"),
    sa.Index("ix_runs_project_done", "project", "done"),
)

responses = sa.Table(
    "responses",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("completed_at", sa.Float, nullable=True),
    sa.Column("previous_response_id", sa.String(64), nullable=True, index=True),
    sa.Column("background", sa.Boolean, nullable=False),
    sa.Column("store", sa.Boolean, nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=True),
    sa.Column("output_tokens", sa.Integer, nullable=True),
    sa.Column("response", sa.Text, nullable=False),  # the projected Response JSON
    sa.Column("last_position", sa.BigInteger, nullable=False),  # events.position folded so far
    sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT),  # the owner
)

# Keys: only the SHA-256 of each key is stored; `prefix` is its first characters, to recognise it.
api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("prefix", sa.String(32), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_used_at", sa.Float, nullable=True),
    sa.Column("revoked_at", sa.Float, nullable=True),
)

conversation_items = sa.Table(
    "conversation_items",
    metadata,
    sa.Column("response_id", sa.String(64), primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),  # inputs first, then outputs, in order
    sa.Column("source", sa.String(8), nullable=False),  # 'input' | 'output'
    sa.Column("item_id", sa.String(64), nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("role", sa.String(16), nullable=True),
    sa.Column("text", sa.Text, nullable=True),
    sa.Column("data", sa.Text, nullable=False),
)

# Conversations (`/v1/conversations`) are streams in the same `events` log, keyed by their `conv_…` id in
# `events.response_id`; these two tables are their projections (see service/conversations/).
conversations = sa.Table(
    "conversations",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),  # JSON object
    sa.Column("project", sa.String(128), nullable=False, server_default=DEFAULT_PROJECT),  # the owner
    sa.Column("updated_at", sa.Float, nullable=False),  # unix seconds of its last event (retention counts from it)
    sa.Column("last_position", sa.BigInteger, nullable=False),  # events.position folded so far
    # One past the highest item ordinal ever used, deleted items included (an append reads it instead of the log).
    sa.Column("next_ordinal", sa.Integer, nullable=False, server_default="0"),
)

conversation_entries = sa.Table(
    "conversation_entries",
    metadata,
    sa.Column("conversation_id", sa.String(64), primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),  # append order; gaps where items were deleted
    sa.Column("item_id", sa.String(64), nullable=False),
    sa.Column("response_id", sa.String(64), nullable=True),  # the response that appended it (NULL: the client)
    sa.Column("source", sa.String(8), nullable=False),  # 'client' | 'input' | 'output'
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("role", sa.String(16), nullable=True),
    sa.Column("text", sa.Text, nullable=True),
    sa.Column("data", sa.Text, nullable=False),
    sa.Index("ix_conversation_entries_item", "conversation_id", "item_id"),
)

# What a compaction kept (service/store/compaction_state.py): `data` = {"summary": [...], "dropped": [...]}.
# A `compaction` item's encrypted_content is an HMAC'd reference to (id, project); retention purges by age.
compactions = sa.Table(
    "compactions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # cmp_…
    sa.Column("project", sa.String(128), nullable=False),  # the owner
    sa.Column("created_at", sa.Float, nullable=False),  # unix seconds
    sa.Column("data", sa.Text, nullable=False),
    sa.Index("ix_compactions_created_at", "created_at"),
)

# Code-interpreter containers (service/containers.py): ids minted by the server (`cntr_…`), owned by a project;
# an `auto` one belongs to the response that made it (`response_id`). The work directory of each lives under
# SERVICE_SANDBOX_DIR; retention removes expired rows (last_active_at + expires_after_minutes) and their files.
containers = sa.Table(
    "containers",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # cntr_…
    sa.Column("project", sa.String(128), nullable=False),  # the owner
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),  # unix seconds
    sa.Column("last_active_at", sa.Float, nullable=False),  # unix seconds; each code run moves it
    sa.Column("expires_after_minutes", sa.Integer, nullable=False),  # idle minutes after last_active_at
    sa.Column("response_id", sa.String(64), nullable=True, index=True),  # the response of an `auto` container
    sa.Column("status", sa.String(16), nullable=False),  # 'running'
    sa.Index("ix_containers_project_created", "project", "created_at"),
)

# Random keys created once (migration 0004) and shared by every replica: used when SERVICE_SECRET_KEY is unset.
server_keys = sa.Table(
    "server_keys",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(128), nullable=False),  # hex
    sa.Column("created_at", sa.Float, nullable=False),
)

# A chain of responses linked by previous_response_id, one row per (response, ancestor-or-self).
RESPONSE_CHAIN_VIEW = """
CREATE VIEW response_chain AS
WITH RECURSIVE chain(response_id, ancestor_id, depth) AS (
    SELECT id, id, 0 FROM responses
    UNION ALL
    SELECT chain.response_id, r.previous_response_id, chain.depth + 1
    FROM chain JOIN responses r ON r.id = chain.ancestor_id
    WHERE r.previous_response_id IS NOT NULL
)
SELECT response_id, ancestor_id, depth FROM chain
"""

# Revision 0001's view: chains only (kept so that migration stays what it was).
CONVERSATION_MESSAGES_VIEW_0001 = """
CREATE VIEW conversation_messages AS
SELECT c.response_id AS conversation_id,
       (SELECT MAX(c2.depth) FROM response_chain c2 WHERE c2.response_id = c.response_id) - c.depth AS turn,
       i.response_id, i.ordinal, i.source, i.type, i.role, i.text, i.item_id
FROM response_chain c JOIN conversation_items i ON i.response_id = c.ancestor_id
"""

# Revision 0002's view: chains, with the owner's project.
CONVERSATION_MESSAGES_VIEW_0002 = """
CREATE VIEW conversation_messages AS
SELECT c.response_id AS conversation_id,
       (SELECT MAX(c2.depth) FROM response_chain c2 WHERE c2.response_id = c.response_id) - c.depth AS turn,
       i.response_id, i.ordinal, i.source, i.type, i.role, i.text, i.item_id, r.project
FROM response_chain c JOIN conversation_items i ON i.response_id = c.ancestor_id
JOIN responses r ON r.id = i.response_id
"""

# The whole conversation behind a response chain ('resp_…') or a Conversation ('conv_…') as plain rows,
# with the owner's project:
#   SELECT role, text FROM conversation_messages WHERE conversation_id = 'resp_…' ORDER BY turn, ordinal;
# For a Conversation, turn is 0 and ordinal is the item's place in it.
CONVERSATION_MESSAGES_VIEW = """
CREATE VIEW conversation_messages AS
SELECT c.response_id AS conversation_id,
       (SELECT MAX(c2.depth) FROM response_chain c2 WHERE c2.response_id = c.response_id) - c.depth AS turn,
       i.response_id, i.ordinal, i.source, i.type, i.role, i.text, i.item_id, r.project
FROM response_chain c JOIN conversation_items i ON i.response_id = c.ancestor_id
JOIN responses r ON r.id = i.response_id
UNION ALL
SELECT e.conversation_id, 0 AS turn, e.response_id, e.ordinal, e.source, e.type, e.role, e.text, e.item_id,
       v.project
FROM conversation_entries e JOIN conversations v ON v.id = e.conversation_id
"""
