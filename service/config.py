"""Settings, read once from the environment (prefix SERVICE_)."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from pydantic import BaseModel, Field

from service.engine.base import DEFAULT_MASK_DEADLINE_S
from service.engine.prefill_pacer import DEFAULT_STALL_RATIO

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./service.db"


class Settings(BaseModel):
    database_url: str = DEFAULT_DATABASE_URL
    # A model directory; None = the built-in test model, built on first use.
    model: Path | None = None
    model_cache: Path | None = None
    intra_op_threads: int | None = None
    # Runs generating at once follow from memory: as many KV caches (each at its longest) as fit
    # kv_cache_budget_bytes (None = a quarter of the machine's memory), at most max_active_runs if set.
    kv_cache_budget_bytes: int | None = Field(default=None, ge=1)
    max_active_runs: int | None = Field(default=None, ge=1)
    # KV rows of finished runs kept so that a next turn starting with their tokens prefills only the rest
    # (LRU, bounded in bytes; 0 = off).
    prefix_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    # An idle engine prefills a finished conversation's next turn into the prefix cache. With this, a continued
    # conversation's next turn is also prefilled as its current turn decodes (runs.WARM_EVERY_TOKENS), so a
    # client that answers at once (a tool loop) waits only for what it adds. Off by default: on a CPU the
    # engine's threads are busy while decoding, so this moves the prefill's compute from the next turn's
    # time to first token into this turn's decoding (measured: -16% decode tok/s on those turns, docs/performance.md).
    warm_while_decoding: bool = False
    # Prompt tokens one engine step prefills (for runs just admitted) before it decodes the running ones:
    # bounds how long a newcomer's prompt holds up every running stream's next token.
    prefill_chunk_tokens: int = Field(default=256, ge=2)
    # While other runs decode, a step's prefill also takes at most about this many decode steps' time (measured
    # as it runs), so a running stream's longest token gap stays near (1 + this) times its usual one; a
    # newcomer then takes a few more steps to its first token. 0 = the token budget alone.
    prefill_stall_ratio: float = Field(default=DEFAULT_STALL_RATIO, ge=0)
    # A constrained run whose next token mask is not computed this long after it was asked for fails alone
    # (response.failed), while the batch goes on without it (engine/onnx_engine.py; create-time checks refuse the
    # grammars known to be that slow).
    mask_deadline_seconds: float = Field(default=DEFAULT_MASK_DEADLINE_S, gt=0)
    # A step's group commit starts no sooner than this after the previous one started. With a fast model
    # (a few milliseconds a step) committing every step alone costs the event loop and the writer CPU the
    # engine's threads then lack; steps committed together also have their deltas folded (one event per
    # content, runs._advance). A client waits at most this much longer for a token. Slower steps are
    # committed one by one, and what must see the log whole (admission, an idle loop) commits at once.
    commit_interval_seconds: float = Field(default=0.010, ge=0)
    lease_seconds: float = Field(default=10.0, gt=0)
    # How often an idle worker looks for runs whose lease expired.
    claim_interval_seconds: float = Field(default=1.0, gt=0)
    # SSE tailing falls back to polling the log this often when no notification arrives.
    poll_interval_seconds: float = Field(default=0.5, gt=0)
    max_body_bytes: int = 4 * 1024 * 1024
    # Tools this server does not run (web_search, file_search, …; protocol/tools.py UNOFFERED_TOOL_TYPES) are
    # accepted and not offered to the model; true makes them a 400 instead.
    refuse_unsupported_tools: bool = False
    # A cap on output tokens when a request sets none; None = what remains of the context window.
    max_output_tokens_default: int | None = Field(default=None, ge=1)
    # A store outage longer than this fails foreground runs (background runs wait it out).
    store_outage_seconds: float = Field(default=30.0, gt=0)
    # Reasoning budget: analysis (and commentary preamble) tokens a completion may write before the
    # decoder closes them and opens the final channel (or a permitted tool call), by reasoning.effort.
    reasoning_tokens_low: int = Field(default=512, ge=0)
    reasoning_tokens_medium: int = Field(default=2048, ge=0)
    reasoning_tokens_high: int = Field(default=8192, ge=0)
    # Largest JSON schema / Lark grammar / regex (bytes) accepted in text.format or a tool.
    max_grammar_bytes: int = Field(default=64 * 1024, ge=1)
    # Responses and conversations are deleted this many days after they were created (a conversation:
    # after its last change), like OpenAI's 30; 0 keeps everything. Fractions are allowed (tests).
    retention_days: float = Field(default=30.0, ge=0)
    retention_sweep_seconds: float = Field(default=300.0, gt=0)
    retention_batch_size: int = Field(default=100, ge=1)
    # A finished run's per-step `tokens` facts are folded into one this long after it was created.
    log_compaction_grace_seconds: float = Field(default=60.0, ge=0)
    # After this long a finished response's events are compacted into one token record (service/stream_record.py).
    replay_window_seconds: float = Field(default=86400.0, ge=0)
    api_key: str | None = None
    # Server-side tools. Comma-separated hosts MCP server_urls may name (`*.example.com` for subdomains), trusted
    # wherever they resolve (loopback and private addresses included); no other host is allowed. Empty = any host
    # except link-local/metadata/multicast/reserved addresses and, once an API key is configured or the server
    # listens beyond loopback, loopback/private/non-public ones (service/tools/mcp.py McpAddressPolicy).
    mcp_allowed_hosts: str = ""
    # The address `serve --host` listens on (set by the CLI; None = loopback): beyond loopback, MCP tools may not
    # reach loopback or private addresses even without an API key.
    listen_host: str | None = None
    # Fernet key (urlsafe base64 of 32 bytes) sealing what background runs with MCP secrets need to resume.
    secret_key: str | None = None
    tool_timeout_seconds: float = Field(default=30.0, gt=0)
    tool_output_bytes: int = Field(default=64 * 1024, ge=1)
    # Code interpreter sandbox: work directories live here; limits per execution.
    sandbox_dir: Path = Path("/tmp/service-sandbox")
    sandbox_wall_seconds: float = Field(default=10.0, gt=0)
    sandbox_cpu_seconds: int = Field(default=5, ge=1)
    sandbox_memory_bytes: int = Field(default=512 * 1024 * 1024, ge=16 * 1024 * 1024)
    sandbox_processes: int = Field(default=32, ge=1)
    # Per container: its work directory's bytes and files (a tmpfs when root, else measured while code runs);
    # per execution: /dev/shm and /tmp sizes. Executions at once, all projects and per project (beyond: they wait).
    sandbox_disk_bytes: int = Field(default=128 * 1024 * 1024, ge=1024 * 1024)
    sandbox_disk_files: int = Field(default=16384, ge=16)
    sandbox_shm_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    sandbox_tmp_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    sandbox_max_concurrent: int = Field(default=8, ge=1)
    sandbox_max_per_project: int = Field(default=2, ge=1)
    # The longest code a code_interpreter call may hold (the decoder closes the call there); None: no bound.
    code_interpreter_max_code_chars: int | None = Field(default=None, ge=1)
    # Limits (see service/limits.py). Requests per minute per key (0 = no limit; unauthenticated
    # loopback use is not rate-limited), runs queued or generating per project, runs queued or
    # generating in all (503 beyond), open event streams on one response.
    rate_limit_requests_per_minute: int = Field(default=600, ge=0)
    max_runs_per_project: int = Field(default=64, ge=1)
    max_queued_runs: int = Field(default=1024, ge=1)
    max_sse_subscribers_per_response: int = Field(default=32, ge=1)
    # Webhooks (service/webhooks/): hosts endpoint URLs may name although they are loopback or private (comma-
    # separated, `*.example.com` for subdomains; the MCP URL policy otherwise); one POST's whole timeout; how long
    # after its event a delivery is retried (OpenAI: 72 hours); the first retry's delay (doubling, with jitter);
    # POSTs in flight per endpoint on one replica; how often the worker looks for due deliveries.
    webhook_allowed_hosts: str = ""
    webhook_timeout_seconds: float = Field(default=10.0, gt=0)
    webhook_retry_window_seconds: float = Field(default=72 * 3600.0, ge=0)
    webhook_backoff_base_seconds: float = Field(default=5.0, gt=0)
    webhook_concurrency_per_endpoint: int = Field(default=4, ge=1)
    webhook_poll_seconds: float = Field(default=1.0, gt=0)
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def reasoning_budget(self, effort: str) -> int:
        return {"low": self.reasoning_tokens_low, "high": self.reasoning_tokens_high}.get(
            effort, self.reasoning_tokens_medium
        )

    def mcp_hosts(self) -> list[str]:
        return [host.strip() for host in self.mcp_allowed_hosts.split(",") if host.strip()]

    def webhook_hosts(self) -> list[str]:
        return [host.strip() for host in self.webhook_allowed_hosts.split(",") if host.strip()]

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"SERVICE_{name.upper()}")
            if raw is not None and raw != "":
                values[name] = raw
        values.update(overrides)
        return cls.model_validate(values)
