"""Shared fixtures: databases (SQLite files and the running PostgreSQL), the models (the random one
servers run by default, the trained built-in one), and the servers the API tests talk to on loopback ports:
the real app served in this process (InProcessServer: `app_on_backend`, `app_factory`) where nothing is killed,
and `python -m service serve` in a subprocess (ServerProcess: `server_on_backend`, `server_factory`) where a
test kills, restarts or replicates the server, starts it from the CLI or measures the server process alone."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.process_fork import ForkedProcess, Forker

if TYPE_CHECKING:
    from service.config import Settings

# Bytecode caches, even where PYTHONDONTWRITEBYTECODE is set (as on the machines CI runs on): without them each of
# the workers, and every interpreter the suite starts (the forkers, `python -m service` subprocesses, schemathesis'
# hooks, the MCP test server), compiles the service package and the test helpers anew, and pytest rewrites every
# test module's asserts again in each worker (collection: 27 CPU-s a worker without the caches, 11 with them).
# The caches go to the gitignored __pycache__/ folders; the test modules are imported after this.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Suites that start server processes and kill, restart or replicate them: the README's test command (and CI) runs
# them with the rest; `-m "not slow"` leaves them out for a quicker run while working.
SLOW_MODULES = frozenset({"test_durability", "test_chaos", "test_server_tools", "test_chat_template_server_tools"})


# The files that take longest (summed test wall time, 2-core EPYC), started first: pytest-xdist
# (`--dist loadfile`) hands files to workers in collection order, so the long ones would otherwise be
# left for the end with one worker busy and the others idle. Files not listed follow in their own order.
LONGEST_FIRST = (
    "test_durability", "test_webhooks", "test_openapi", "test_constrained_api", "test_model_dirs",
    "test_store_faults", "test_server_tools", "test_runs", "test_chat_template_server_tools", "test_chaos",
    "test_conversations", "test_store_contract_postgres", "test_compaction", "test_cli", "test_training",
    "test_store_hygiene", "test_sandbox", "test_api", "test_client_tools", "test_containers", "test_tools_mcp",
    "test_retention",
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    # xdist (3.6+) reorders `--dist loadfile`'s files by their number of tests, largest first, unless told not
    # to: LONGEST_FIRST's order is the one wanted (many quick tests are not a long file).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # The controller compiles the package and the helpers once, before its workers all import them at once.
        import compileall

        for package in ("service", "tests"):
            compileall.compile_dir(ROOT / package, quiet=1, workers=os.cpu_count() or 1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: two workers a core. A third of the suite's time is waiting (leases lapsing after a kill -9,
    webhook back-off, outages, PostgreSQL), which a second worker on the core fills."""
    return 2 * (os.cpu_count() or 1)


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
    """`python -m service serve` in a process of its own, as a user would run it: forked from this worker's warm
    parent (tests/process_fork.py: the same `main`, without the seconds of imports), or, where the environment
    holds more than SERVICE_* settings, a fresh interpreter."""

    def __init__(self, database_url: str, log_path: Path, *, log_level: str = "warning", **env: str) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.log_level = log_level
        self.env = env
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | ForkedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def settings_env(self) -> dict[str, str]:
        """The SERVICE_* variables the server runs with: the tests' defaults, then the test's own."""
        return {
            "SERVICE_DATABASE_URL": self.database_url,
            "SERVICE_MODEL_CACHE": str(MODEL_CACHE),
            "SERVICE_INTRA_OP_THREADS": "1",
            "SERVICE_LEASE_SECONDS": "3",
            "SERVICE_CLAIM_INTERVAL_SECONDS": "0.3",
            "SERVICE_POLL_INTERVAL_SECONDS": "0.2",
            "SERVICE_MODEL": str(random_model()),
            **self.env,
        }

    def start(self, timeout: float = 90) -> ServerProcess:
        env = {**os.environ, **self.settings_env()}
        argv = ["serve", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", self.log_level]
        forker = Forker.for_env(ROOT, env)
        if forker is not None:
            self.process = forker.spawn(argv, env=env, cwd=ROOT, stdout=self.log_path)
        else:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "service", *argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
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


class InProcessServer(ServerProcess):
    """The same server in this process: the real app (`service.app.create_app`, its lifespan run on start and stop)
    on the real database and model, served by uvicorn on a loopback port from a thread of its own (whose event loop
    is the app's). Tests reach it over HTTP as they reach a subprocess (`.url`: the sync openai client, httpx, SSE
    streams, websockets), without the seconds a process costs to start (interpreter, imports, model load). Its log
    lines are written to `log_path` as JSON, as the CLI writes them. Settings come from the SERVICE_* variables
    only: what a process would read from other variables (PROMETHEUS_MULTIPROC_DIR) needs a ServerProcess, and so
    does a test that kills, replicates or starts servers from the CLI. `stop` then `start` is a graceful restart on
    the same database: a new app, engine and model, as a new process would have (what modules cache is derived from
    code and model files, never from the database)."""

    def __init__(self, database_url: str, log_path: Path, *, log_level: str = "warning", **env: str) -> None:
        super().__init__(database_url, log_path, log_level=log_level, **env)
        self.app: Any = None
        self._server: _ThreadServer | None = None
        self._thread: threading.Thread | None = None
        self._log_handler: logging.Handler | None = None
        self._root_level = logging.WARNING

    def start(self, timeout: float = 90) -> InProcessServer:
        from service.config import Settings
        from service.observability import JsonFormatter

        assert self._thread is None, "already started"
        env = self.settings_env()
        named = {f"SERVICE_{field.upper()}" for field in Settings.model_fields}
        unknown = sorted(set(env) - named)
        if unknown:
            raise ValueError(f"{unknown} are not settings: a server that reads them runs as a ServerProcess")
        # As `python -m service serve --host 127.0.0.1`: the environment's settings, then the test's.
        settings = Settings.from_env(**{name[len("SERVICE_") :].lower(): value for name, value in env.items()})
        settings = settings.model_copy(update={"listen_host": "127.0.0.1"})
        handler = logging.FileHandler(self.log_path, encoding="utf-8")
        handler.setFormatter(JsonFormatter())
        handler.setLevel(self.log_level.upper())
        root = logging.getLogger()
        self._root_level = root.level
        root.addHandler(handler)
        root.setLevel(min(root.level, handler.level))
        self._log_handler = handler
        try:
            self._serve(settings, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, settings: Settings, timeout: float) -> None:
        from service.app import create_app
        from service.models import load_runtime

        self.app = create_app(settings, runtime=load_runtime(settings))
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level=self.log_level,
            timeout_graceful_shutdown=10,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        server = self._server = _ThreadServer(config)
        thread = self._thread = threading.Thread(target=server.run, name=f"server-{self.port}", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start; see {self.log_path}:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.02)

    def stop(self) -> None:
        """As SIGTERM stops `serve`: the app drains (SSE tails end, runs are handed back), then uvicorn shuts down
        and the lifespan ends (the supervisor, the notifier, the database)."""
        from service.app import begin_drain

        server, thread = self._server, self._thread
        if server is not None and thread is not None:
            if server.started and server.loop is not None and thread.is_alive():
                asyncio.run_coroutine_threadsafe(begin_drain(self.app), server.loop).result(timeout=60)
            server.should_exit = True
            thread.join(timeout=60)
            if thread.is_alive():
                raise RuntimeError(f"in-process server on port {self.port} did not stop; see {self.log_path}")
        self._server = self._thread = self.app = None
        if self._log_handler is not None:
            root = logging.getLogger()
            root.removeHandler(self._log_handler)
            root.setLevel(self._root_level)
            self._log_handler.close()
            self._log_handler = None

    def kill(self) -> None:
        raise TypeError("an in-process server cannot be killed: tests that kill a server start a ServerProcess")


class _ThreadServer(uvicorn.Server):
    """uvicorn's server, remembering its event loop (its thread's) so that `stop` can drain the app on it."""

    loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)


def _on_backend(kind: type[ServerProcess], backend: str, tmp: Path, env: dict[str, str]) -> Iterator[ServerProcess]:
    name = None
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'service.db'}"
    else:
        if _PG_SKIP_REASON:
            pytest.skip(_PG_SKIP_REASON)
        url, name = create_postgres_database()
    server = kind(url, tmp / "server.log", **env).start()
    try:
        yield server
    finally:
        server.stop()
        if name:
            drop_postgres_database(name)


def server_on_backend(backend: str, tmp: Path, **env: str) -> Iterator[ServerProcess]:
    """A started server process on a fresh "sqlite" or "postgresql" database, stopped (and the database dropped)
    afterwards: the body of the module-scoped `server` fixtures (`yield from server_on_backend(...)`) of the
    suites that kill, restart or replicate it."""
    yield from _on_backend(ServerProcess, backend, tmp, env)


def app_on_backend(backend: str, tmp: Path, **env: str) -> Iterator[ServerProcess]:
    """As server_on_backend, with the server in this process (InProcessServer): the module-scoped `server`
    fixtures of the suites where nothing is killed (`yield from app_on_backend(...)`)."""
    yield from _on_backend(InProcessServer, backend, tmp, env)


def _servers(kind: type[ServerProcess], tmp_path: Path, log_prefix: str) -> Iterator[type[ServerProcess] | object]:
    """`make(database_url, **env)`: a `kind` server, not started; every one made is stopped afterwards."""
    servers: list[ServerProcess] = []

    def make(database_url: str, **env: str) -> ServerProcess:
        server = kind(database_url, tmp_path / f"{log_prefix}-{len(servers)}.log", **env)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server_factory(tmp_path: Path, random_model_dir: Path) -> Iterator[type[ServerProcess] | object]:
    """`server_factory(database_url, **env)`: a ServerProcess, not started; stopped after the test."""
    yield from _servers(ServerProcess, tmp_path, "server")


@pytest.fixture
def app_factory(tmp_path: Path, random_model_dir: Path) -> Iterator[type[ServerProcess] | object]:
    """As server_factory, making InProcessServers."""
    yield from _servers(InProcessServer, tmp_path, "app")


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
