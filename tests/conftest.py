"""Shared fixtures: databases (SQLite files and the running PostgreSQL), the models (the random one
servers run by default, the trained built-in one), and real server processes started with
`python -m service serve` on loopback ports."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

# Suites that start servers and kill, restart or replicate them: the README's test command (and CI) runs
# them with the rest; `-m "not slow"` leaves them out for a quicker run while working (about a third less).
SLOW_MODULES = frozenset(
    {
        "test_durability",
        "test_chaos",
        "test_compaction",
        "test_conversations",
        "test_server_tools",
        "test_chat_template_server_tools",
    }
)


# The files that take longest (`--durations`, one worker, 2-core EPYC), started first: pytest-xdist
# (`--dist loadfile`) hands files to workers in collection order, so the long ones would otherwise be
# left for the end with one worker busy and the other idle. Files not listed follow in their own order.
LONGEST_FIRST = (
    "test_durability", "test_chaos", "test_server_tools", "test_constrained_api", "test_store_faults",
    "test_conversations", "test_model_dirs", "test_compaction", "test_cli", "test_chat_template_server_tools",
    "test_keys", "test_openapi", "test_isolation", "test_store_hygiene", "test_hostile_input",
)  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    rank = {stem: i for i, stem in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a file's tests stay in order


ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_DSN = os.environ.get("TEST_POSTGRES_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_URL_TEMPLATE = os.environ.get("TEST_POSTGRES_URL_TEMPLATE", "postgresql+asyncpg://postgres@127.0.0.1:5432/{db}")
MODEL_CACHE = Path(os.environ.get("SERVICE_MODEL_CACHE", ROOT / ".cache" / "models"))


def _postgres_reachable() -> str | None:
    import asyncpg

    async def probe() -> None:
        connection = await asyncpg.connect(PG_ADMIN_DSN, timeout=3)
        await connection.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL not reachable at {PG_ADMIN_DSN}: {exc}"
    return None


_PG_SKIP_REASON = _postgres_reachable()


def _admin(sql: str) -> None:
    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(run())


def create_postgres_database() -> tuple[str, str]:
    """A fresh, empty database; returns (its SQLAlchemy URL, its name)."""
    name = f"svc_test_{secrets.token_hex(6)}"
    _admin(f'CREATE DATABASE "{name}"')
    return PG_URL_TEMPLATE.format(db=name), name


def drop_postgres_database(name: str) -> None:
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One empty database per test, on each backend."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'service.db'}"
        return
    if _PG_SKIP_REASON:
        pytest.skip(_PG_SKIP_REASON)
    url, name = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated database of `database_url` and an engine on it."""
    from service.store.db import create_engine, migrate

    await migrate(database_url)
    engine = create_engine(database_url)
    yield engine
    await engine.dispose()


def random_model() -> Path:
    """The seeded random-weight Harmony model: it never stops by itself, which the tests of
    cancellation, durability and chaos need. Servers run it unless a test names another model."""
    from service.engine.model_dir import ensure_random_model

    return ensure_random_model(MODEL_CACHE, progress=False)


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    return random_model()


@pytest.fixture(scope="session")
def builtin_model_dir() -> Path:
    """The trained built-in model (stops, reasons, calls tools): pass SERVICE_MODEL=str(it) to a server."""
    from service.engine.model_dir import ensure_builtin_model

    return ensure_builtin_model(MODEL_CACHE, progress=False)


# Ports for servers the tests start: each xdist worker draws from its own range, below the kernel's
# ephemeral ports (32768+). A port the kernel hands out (bind to 0) could be handed to another worker too
# between this check and the server's bind, and that worker's server would then answer our health check.
# Two test runs at once (a CI clone beside a checkout) would share every range, so a run's ranges start at
# a place drawn from its own id (xdist's PYTEST_XDIST_TESTRUNUID, shared by its workers; else this process).
_PORT_BLOCK = 500
_PORT_BLOCKS = 24  # 20000-31999
_RUN_SLOT = zlib.crc32(os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid())).encode())
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_PORT_BASE = 20_000 + _PORT_BLOCK * ((_RUN_SLOT + _WORKER) % _PORT_BLOCKS)
_next_port = itertools.cycle(range(_PORT_BASE, _PORT_BASE + _PORT_BLOCK))


_SANDBOX_ROOTS: list[Path] = []


def new_sandbox_root() -> Path:
    """A directory for a server's SERVICE_SANDBOX_DIR, reachable by the sandbox user (not under pytest's private
    tmp_path). Running as root, the sandbox mounts a tmpfs on each container's directory: this process unmounts
    what is left below its roots when it exits (a server killed by a test never removed its containers)."""
    root = Path(tempfile.mkdtemp(prefix="sbx-", dir="/tmp"))
    root.chmod(0o711)
    if not _SANDBOX_ROOTS:
        atexit.register(_remove_sandbox_roots)
    _SANDBOX_ROOTS.append(root)
    return root


def _remove_sandbox_roots() -> None:
    for root in _SANDBOX_ROOTS:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in mounts:
            if mount.startswith(f"{root}/"):
                subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def free_port() -> int:
    """A port no other server of this test run is on or will be given (see _PORT_BLOCK)."""
    for port in _next_port:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a server still shutting down, or another program)
            return port
    raise AssertionError("unreachable: itertools.cycle never ends")


class ServerProcess:
    """`python -m service serve` in a subprocess, as a user would run it."""

    def __init__(self, database_url: str, log_path: Path, *, log_level: str = "warning", **env: str) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.log_level = log_level
        self.env = env
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> ServerProcess:
        env = {
            **os.environ,
            "SERVICE_DATABASE_URL": self.database_url,
            "SERVICE_MODEL_CACHE": str(MODEL_CACHE),
            "SERVICE_INTRA_OP_THREADS": "1",
            "SERVICE_LEASE_SECONDS": "3",
            "SERVICE_CLAIM_INTERVAL_SECONDS": "0.3",
            "SERVICE_POLL_INTERVAL_SECONDS": "0.2",
            "SERVICE_MODEL": str(random_model()),
            **self.env,
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                self.log_level,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.process.returncode}; see {self.log_path}:\n"
                    + self.log_path.read_text()[-3000:]
                )
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not start in {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """kill -9: no shutdown hooks, leases stay held until they expire."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.process = None


def server_on_backend(backend: str, tmp: Path, **env: str) -> Iterator[ServerProcess]:
    """A started server on a fresh "sqlite" or "postgresql" database, stopped (and the database dropped)
    afterwards: the body of the module-scoped `server` fixtures (`yield from server_on_backend(...)`)."""
    name = None
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'service.db'}"
    else:
        if _PG_SKIP_REASON:
            pytest.skip(_PG_SKIP_REASON)
        url, name = create_postgres_database()
    process = ServerProcess(url, tmp / "server.log", **env).start()
    try:
        yield process
    finally:
        process.stop()
        if name:
            drop_postgres_database(name)


@pytest.fixture
def server_factory(tmp_path: Path, random_model_dir: Path) -> Iterator[type[ServerProcess] | object]:
    servers: list[ServerProcess] = []

    def make(database_url: str, **env: str) -> ServerProcess:
        server = ServerProcess(database_url, tmp_path / f"server-{len(servers)}.log", **env)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def proxied_postgres() -> Iterator[tuple[str, Any]]:
    """A fresh PostgreSQL database reached through a FaultProxy (tests/faults.py): (URL, proxy)."""
    from tests.faults import FaultProxy  # tests.faults imports this module

    if _PG_SKIP_REASON:
        pytest.skip(_PG_SKIP_REASON)
    url, name = create_postgres_database()
    proxy = FaultProxy("127.0.0.1", 5432).start()
    try:
        yield url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.stop()
        drop_postgres_database(name)
