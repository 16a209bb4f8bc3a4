"""Store faults on demand, for tests and the chaos script: a TCP proxy that cuts every connection
to PostgreSQL, another process holding SQLite's write lock, and `python -m service doctor`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import ROOT, free_port


class FaultProxy:
    """A TCP proxy in its own thread and event loop: `cut(seconds)` is a network outage."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._down_until = 0.0
        self.cuts = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def cut(self, seconds: float) -> None:
        """Close every open connection now and refuse new ones for `seconds`."""
        self.cuts += 1
        self._down_until = time.monotonic() + seconds
        self._loop.call_soon_threadsafe(self._close_all)

    def restore(self) -> None:
        """End the outage now (new connections are let through again)."""
        self._down_until = 0.0

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def _close_all(self) -> None:
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                transport = writer.transport
                transport.abort()  # RST, like a network cut or a crashed server
        self._writers.clear()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._close_all()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    if self.down:
                        break
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


class SQLiteLocker:
    """Another process holding the SQLite file's write lock (`BEGIN EXCLUSIVE`), like a backup
    or a person in `sqlite3` with an open transaction."""

    def __init__(self, path: Path, seconds: float) -> None:
        """Returns once the lock is held; it is released after `seconds`."""
        self.released = path.parent / f"released-{time.monotonic_ns()}"
        script = (
            "import sqlite3, sys, time, pathlib\n"
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None, timeout=30)\n"
            "c.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            f"time.sleep({seconds})\n"
            "c.execute('COMMIT')\n"
            f"pathlib.Path({str(self.released)!r}).write_text('released')\n"
        )
        self.process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "locked"

    def wait(self) -> None:
        self.process.wait(60)


def assert_doctor_clean_and_projections_rebuild(database_url: str) -> None:
    """`doctor` passes, and `rebuild-projections` gives back the same response and item tables."""
    from tests.api_helpers import sql_rows

    report = doctor(database_url)
    assert report.returncode == 0, report.stdout + report.stderr
    tables = ("SELECT * FROM responses ORDER BY id", "SELECT * FROM conversation_items ORDER BY response_id, ordinal")
    before = [sql_rows(database_url, sql) for sql in tables]
    subprocess.run(
        [sys.executable, "-m", "service", "rebuild-projections"],
        cwd=ROOT,
        check=True,
        env={"SERVICE_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"},
    )
    assert [sql_rows(database_url, sql) for sql in tables] == before


def doctor(database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVICE_DATABASE_URL": database_url}
    return subprocess.run(
        [sys.executable, "-m", "service", "doctor"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
