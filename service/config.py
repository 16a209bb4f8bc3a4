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
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description=(
            "SQLAlchemy URL with an async driver; `postgresql+asyncpg://user@host/db` for PostgreSQL (the "
            "database must exist)"
        ),
    )
    model: Path | None = Field(
        default=None,
        json_schema_extra={"shown_default": "the built-in model (`builtin-harmony-tiny`)"},
        description='a model directory (see "Model directories" below)',
    )
    model_cache: Path | None = Field(
        default=None,
        json_schema_extra={"shown_default": "`~/.cache/responses-service/models`"},
        description="where the built-in model is expanded (and `build-random` models cached)",
    )
    intra_op_threads: int | None = Field(
        default=None, json_schema_extra={"shown_default": "all cores"}, description="ONNX Runtime threads"
    )
    kv_cache_budget_bytes: int | None = Field(
        default=None,
        ge=1,
        json_schema_extra={"shown_default": "a quarter of the machine's memory (or cgroup limit)"},
        description=(
            "memory for KV caches: runs generating at once = this ÷ one run's KV cache at full context (at "
            "least 1); more wait in the durable queue"
        ),
    )
    max_active_runs: int | None = Field(
        default=None, ge=1, description="an upper bound on runs generating at once, on top of the memory budget"
    )
    prefix_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description=(
            "KV rows of finished runs' prompts kept (LRU, bounded in bytes) so that a next turn starting with"
            " the same tokens prefills only the rest; an idle worker also prefills each finished "
            "conversation's next-turn start (its answer as the next turn renders it) into it, so that turn "
            "prefills only its new message; 0 = off; never changes a sampled token. "
            "`service_prefix_cache_hits`, `_reused_tokens` and `_warmed_tokens` on `/metrics`"
        ),
    )
    warm_while_decoding: bool = Field(
        default=False,
        description=(
            "also prefill a continued conversation's next turn (its prompt holds an earlier model turn) into "
            "the prefix cache as its current turn decodes (16 tokens beside an engine step, every 16 tokens),"
            " so that a client answering at once (a tool loop) waits only for the prefill of what it adds. A "
            "trade, so off: on a CPU it moves that prefill's compute into this turn's decoding (Qwen shape, "
            "AVX2: turn 5's time to first token back to back 1.39× turn 1's instead of 2.16×, those turns "
            "decode at 26.9 instead of 32.1 tok/s; Intel Xeon AMX, 2026-12-05: 1.18–1.39× instead of "
            "1.61–1.73×, 25.1 instead of 27.7 tok/s); never changes a sampled token"
        ),
    )
    prefill_chunk_tokens: int = Field(
        default=256,
        ge=2,
        description=(
            "prompt tokens one engine step prefills for newly admitted runs (first come first served) before "
            "it decodes the running ones: bounds how long a newcomer's prompt holds up every running stream's"
            " next token; never changes a sampled token"
        ),
    )
    prefill_stall_ratio: float = Field(
        default=DEFAULT_STALL_RATIO,
        ge=0,
        json_schema_extra={"shown_default": "0 (off)"},
        description=(
            "while other runs are decoding, a step's prefill also takes at most about this many decode steps'"
            " time (measured as the engine runs; at least 32 tokens a step), so a running stream's token gap "
            "stays near (1 + this) times its usual one even when a newcomer's whole prompt fits the token "
            "budget; a newcomer alone still gets the whole budget. A trade, so off: Qwen shape on an AVX2 "
            "CPU, closed loop, 4 streaming clients: ITL p99 0.52–0.55 s instead of 0.91–1.00 s, longest gap "
            "0.70–0.78 s instead of 1.01–1.21 s, median time to first token 1.57–1.74 s instead of 1.29–1.45 "
            "s; at 16 clients, where newcomers keep waiting, every step carries prefill and fewer runs decode"
            " together (ratio 4: 20.8 against 34.7 tok/s, ITL p99 5.1 against 0.75 s; ratio 2, another run: "
            "37.7 against 40.1 tok/s, ITL p99 1.6 against 0.62 s, longest gap 2.2 against 5.4 s). On an Intel"
            " Xeon with AVX512-VNNI, where prefill is much quicker, ratio 2 against 0 (two runs each, "
            "alternated, closed loop): 4 clients ITL p99 128–132 against 153–156 ms, TTFT p50 406–408 against"
            " 334–350 ms; 16 clients ITL p99 275–286 against 290–299 ms, TTFT p50 968–1000 against 712–739 "
            "ms, 211.5–211.9 against 216.5–216.7 tok/s. Never changes a sampled token. "
            "`service_prefill_paced_steps` on `/metrics` counts the steps it held back"
        ),
    )
    mask_deadline_seconds: float = Field(
        default=DEFAULT_MASK_DEADLINE_S,
        gt=0,
        description=(
            "a constrained run whose next token mask is not ready this long after it was asked for fails "
            "alone (`response.failed`, code `model_error`); the other runs never wait for it beyond a 2 ms "
            "grace (it sits steps out meanwhile). Grammars known to be that slow are refused at create "
            "(`grammar_too_complex`, see [Security](security.md))"
        ),
    )
    commit_interval_seconds: float = Field(
        default=0.010,
        ge=0,
        description=(
            "a group commit starts no sooner than this after the previous one: a model faster than this has a"
            " few steps committed (and their deltas folded into one event per content) together, which saves "
            "the CPU its engine needs; a client waits at most this much longer for a token, never for its "
            "first one (a step holding a run's first delta is committed at once); 0 sets no minimum (steps "
            "still share a commit while the one before is in flight)"
        ),
    )
    lease_seconds: float = Field(
        default=10.0, gt=0, description="run lease; a crashed owner's runs are resumed after it expires"
    )
    claim_interval_seconds: float = Field(
        default=1.0, gt=0, description="how often an idle worker looks for queued runs and runs whose lease expired"
    )
    poll_interval_seconds: float = Field(
        default=0.5, gt=0, description="an SSE tail re-reads the log this often when no notification arrives"
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        description="largest request body accepted, compressed and once decompressed (larger: 413)",
    )
    refuse_unsupported_tools: bool = Field(
        default=False,
        description=(
            "`true`: tools this server does not run (`web_search`, `file_search`, …) are a 400 instead of "
            "accepted and not offered"
        ),
    )
    max_output_tokens_default: int | None = Field(
        default=None,
        ge=1,
        description=(
            "caps output tokens for requests without `max_output_tokens` (unset: what remains of the context window)"
        ),
    )
    default_seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        json_schema_extra={"shown_default": "a random seed per request"},
        description=(
            "the sampling seed of requests without `seed` (clients such as Codex CLI send none): set, a "
            "request that repeats gives the same tokens, as with a `seed` of its own"
        ),
    )
    store_outage_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "how long the database may be unreachable before foreground runs are failed (background runs wait"
            " it out); also how long `serve` waits at start for a database it cannot reach yet, and SQLite's "
            "busy timeout"
        ),
    )
    reasoning_tokens_low: int = Field(
        default=512,
        ge=0,
        description="reasoning budget for `reasoning.effort: low`: analysis tokens before the final answer is forced",
    )
    reasoning_tokens_medium: int = Field(default=2048, ge=0, description="the same for `medium` (the default effort)")
    reasoning_tokens_high: int = Field(default=8192, ge=0, description="the same for `high`")
    max_grammar_bytes: int = Field(
        default=64 * 1024, ge=1, description="largest JSON schema, Lark grammar or regex accepted"
    )
    retention_days: float = Field(
        default=30.0,
        ge=0,
        description=(
            "responses are deleted this long after creation (once their run has ended), conversations this "
            "long after their last change, compaction state this long after it was made; `0` keeps "
            "everything; fractions allowed"
        ),
    )
    retention_sweep_seconds: float = Field(
        default=300.0, gt=0, description="how often the sweeper runs (retention, then log compaction)"
    )
    retention_batch_size: int = Field(
        default=100,
        ge=1,
        description="responses or conversations deleted per transaction (writers wait at most one batch)",
    )
    log_compaction_grace_seconds: float = Field(
        default=60.0,
        ge=0,
        description="a finished run's `tokens` facts are folded into one this long after it was created",
    )
    replay_window_seconds: float = Field(
        default=86400.0,
        ge=0,
        description=(
            "after this long a finished response's stream is compacted into a token record and regenerated on read"
        ),
    )
    api_key: str | None = Field(
        default=None,
        description=(
            "one key of the `default` project; with it (or any key in `api_keys`) `Authorization: Bearer "
            "<key>` is required on `/v1/`"
        ),
    )
    mcp_allowed_hosts: str = Field(
        default="",
        description=(
            "comma-separated hosts MCP `server_url`s may name (`*.example.com`), trusted wherever they "
            "resolve; unset: any public host (loopback/private too on a keyless loopback server), never "
            "link-local/metadata/reserved"
        ),
    )
    listen_host: str | None = Field(
        default=None,
        json_schema_extra={"shown_default": "what `serve --host` listens on"},
        description=(
            "set by the CLI, not by hand: beyond loopback, MCP tools may not reach loopback or private "
            "addresses even without an API key"
        ),
    )
    secret_key: str | None = Field(
        default=None,
        description=(
            "Fernet key sealing MCP secrets that background runs keep; also keys (derived) the HMAC of "
            "compaction items and the AES-GCM of `reasoning.encrypted_content` (unset: a random key stored "
            "once in `server_keys`; changing it makes earlier blobs a 400)"
        ),
    )
    tool_timeout_seconds: float = Field(default=30.0, gt=0, description="per tool call: time limit")
    tool_output_bytes: int = Field(default=64 * 1024, ge=1, description="per tool call: output cap")
    sandbox_dir: Path = Field(
        default=Path("/tmp/service-sandbox"), description="code interpreter work directories (one per container)"
    )
    sandbox_wall_seconds: float = Field(default=10.0, gt=0, description="sandbox: wall-clock limit per execution")
    sandbox_cpu_seconds: int = Field(default=5, ge=1, description="sandbox: CPU seconds per execution")
    sandbox_memory_bytes: int = Field(
        default=512 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        description=(
            "sandbox: memory of one execution, all its processes together (cgroup; also each process's address space)"
        ),
    )
    sandbox_processes: int = Field(
        default=32, ge=1, description="sandbox: processes of one execution (cgroup `pids.max`)"
    )
    sandbox_disk_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=1024 * 1024,
        description="sandbox: bytes of one container's work directory, all files together",
    )
    sandbox_disk_files: int = Field(
        default=16384,
        ge=16,
        description="sandbox: files and directories of one container's work directory (tmpfs inodes; root only)",
    )
    sandbox_shm_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024 * 1024, description="sandbox: `/dev/shm` size per execution"
    )
    sandbox_tmp_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024 * 1024, description="sandbox: `/tmp` size per execution"
    )
    sandbox_max_concurrent: int = Field(
        default=8, ge=1, description="sandbox: executions at once, all projects (more wait)"
    )
    sandbox_max_per_project: int = Field(
        default=2, ge=1, description="sandbox: executions at once per project (more wait)"
    )
    code_interpreter_max_code_chars: int | None = Field(
        default=None,
        ge=1,
        description=(
            "longest code one `code_interpreter` call may hold (the decoder closes the call there); unset: no bound"
        ),
    )
    rate_limit_requests_per_minute: int = Field(
        default=600,
        ge=0,
        description="requests per minute per key (0: no limit; unauthenticated loopback use is never limited)",
    )
    max_runs_per_project: int = Field(
        default=64, ge=1, description="runs queued or generating per project (beyond: 429 `too_many_concurrent_runs`)"
    )
    max_queued_runs: int = Field(
        default=1024,
        ge=1,
        description=(
            "runs queued or generating in all (beyond: 503 `server_overloaded`). Both limits are counted in "
            "the create's own transaction, under the append lock, so requests arriving together (on any "
            "replica) never overshoot them"
        ),
    )
    max_sse_subscribers_per_response: int = Field(
        default=32,
        ge=1,
        description="open event streams on one response, per replica (beyond: 429 `too_many_subscribers`)",
    )
    webhook_allowed_hosts: str = Field(
        default="",
        description=(
            "comma-separated hosts webhook URLs may name although they are loopback or private "
            "(`*.example.com`); unset: public hosts only (the MCP URL policy, private targets always refused)"
        ),
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, description="one webhook POST, whole (a delivery's lease is twice this plus 5 s)"
    )
    webhook_retry_window_seconds: float = Field(
        default=72 * 3600.0,
        ge=0,
        description="a failing webhook is retried this long after its event (OpenAI: 72 hours), then marked `failed`",
    )
    webhook_backoff_base_seconds: float = Field(
        default=5.0, gt=0, description="the first retry's delay; each next one doubles, with jitter (50–100%)"
    )
    webhook_concurrency_per_endpoint: int = Field(
        default=4, ge=1, description="webhook POSTs in flight per endpoint on one replica"
    )
    webhook_poll_seconds: float = Field(
        default=1.0, gt=0, description="how often each replica's webhook worker looks for due deliveries"
    )
    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        json_schema_extra={"shown_default": "`<host>-<pid>-<random>`"},
        description="this process's name as a lease owner (`runs.owner`)",
    )

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
