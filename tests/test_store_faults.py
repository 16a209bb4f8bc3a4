"""The store can stumble, the runs must not: real connection cuts between the server and
PostgreSQL (a TCP proxy in the test), during streaming foreground runs and background runs."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api_helpers import assert_well_formed_stream, client_for, raw_events, text_from_deltas, wait_until_terminal
from tests.conftest import ServerProcess
from tests.faults import FaultProxy, SQLiteLocker, doctor

ServerFactory = Callable[..., ServerProcess]
REQUEST = {"input": "Say something long", "max_output_tokens": 160, "temperature": 1.0, "seed": 11}


def _stream(url: str, body: dict[str, Any], out: list[dict[str, Any]], started: threading.Event) -> None:
    import json

    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[len("data: ") :]))
                if len(out) >= 8:
                    started.set()
    started.set()


def _run_streams(
    url: str, count: int, cut: Callable[[], None], body: dict[str, Any] = REQUEST
) -> list[list[dict[str, Any]]]:
    streams: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    started = [threading.Event() for _ in range(count)]
    threads = [
        threading.Thread(target=_stream, args=(url, body, streams[i], started[i]), daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(60)
    cut()
    for thread in threads:
        thread.join(180)
    return streams


def test_a_short_outage_is_waited_out(proxied_postgres: tuple[str, FaultProxy], server_factory: ServerFactory) -> None:
    url, proxy = proxied_postgres
    server = server_factory(url).start()
    # Long enough that the runs are still writing when the cut starts, even on a loaded machine.
    body = {**REQUEST, "max_output_tokens": 800}
    reference = raw_events(server.url, client_for(server.url).responses.create(**_sdk(body)).id)
    streams = _run_streams(server.url, 4, lambda: proxy.cut(3.0), body)
    assert proxy.cuts == 1
    for events in streams:
        assert_well_formed_stream(events)
        assert events[-1]["type"] == reference[-1]["type"] == "response.incomplete"
        # The same seed gives the same tokens: the outage changed nothing but the timing.
        assert text_from_deltas(events) == text_from_deltas(reference)
        stored = raw_events(server.url, events[0]["response"]["id"])
        assert stored == events
    log = server.log_path.read_text()
    assert "store unavailable" in log and "store back after" in log  # the cut hit a group commit


def test_a_long_outage_fails_foreground_runs_and_background_runs_wait(
    proxied_postgres: tuple[str, FaultProxy], server_factory: ServerFactory
) -> None:
    url, proxy = proxied_postgres
    server = server_factory(url, SERVICE_STORE_OUTAGE_SECONDS="1.5").start()
    client = client_for(server.url)
    background = client.responses.create(**_sdk({**REQUEST, "max_output_tokens": 300}), background=True)
    streams = _run_streams(server.url, 2, lambda: proxy.cut(6.0))
    for events in streams:
        assert_well_formed_stream(events)
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "store_unavailable"
    finished = wait_until_terminal(client, background.id)
    assert finished.status == "incomplete"  # ran to max_output_tokens: the outage only paused it
    assert finished.usage is not None and finished.usage.output_tokens == 300
    assert_well_formed_stream(raw_events(server.url, background.id))
    # The server is healthy again.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_server_started_during_an_outage_waits_for_its_database(
    proxied_postgres: tuple[str, FaultProxy], server_factory: ServerFactory
) -> None:
    """A server (re)started while its database is unreachable (restarted together, a network cut)
    waits for it, up to SERVICE_STORE_OUTAGE_SECONDS, instead of exiting."""
    url, proxy = proxied_postgres
    proxy.cut(25.0)  # ended below, once the server says it is waiting (however long its start takes)
    server = server_factory(url)
    with ThreadPoolExecutor(max_workers=1) as starting:
        started = starting.submit(server.start)
        deadline = time.monotonic() + 25
        while "trying again" not in _log(server.log_path) and time.monotonic() < deadline:
            assert not started.done(), "the server started while its database was unreachable"
            time.sleep(0.1)
        assert "cannot open the database" in _log(server.log_path) and "trying again" in _log(server.log_path)
        proxy.restore()
        started.result()
    reply = client_for(server.url).responses.create(input="Hello", max_output_tokens=8)
    assert reply.status in ("completed", "incomplete")


def _sdk(body: dict[str, Any]) -> dict[str, Any]:
    """REQUEST as keyword arguments of client.responses.create (seed is an extension)."""
    kwargs = {k: v for k, v in body.items() if k != "seed"}
    return {**kwargs, "extra_body": {"seed": body["seed"]}}


def test_sqlite_locked_by_another_process_is_waited_out(tmp_path: Path, server_factory: ServerFactory) -> None:
    path = tmp_path / "locked.db"
    server = server_factory(f"sqlite+aiosqlite:///{path}").start()
    client = client_for(server.url)
    reference_id = client.responses.create(**_sdk(REQUEST)).id
    reference = raw_events(server.url, reference_id)
    lockers: list[SQLiteLocker] = []
    read_while_locked: list[bool] = []

    def lock_and_read() -> None:
        lockers.append(SQLiteLocker(path, 4.0))
        # Readers never take the write lock: a GET answers while the other process still holds it.
        assert client.responses.retrieve(reference_id).status == "incomplete"
        read_while_locked.append(not lockers[0].released.exists())

    streams = _run_streams(server.url, 3, lock_and_read)
    lockers[0].wait()
    assert read_while_locked == [True]
    for events in streams:
        assert_well_formed_stream(events)
        assert text_from_deltas(events) == text_from_deltas(reference)
        assert raw_events(server.url, events[0]["response"]["id"]) == events


def test_sqlite_locked_for_long_fails_foreground_runs_and_background_runs_wait(
    tmp_path: Path, server_factory: ServerFactory
) -> None:
    path = tmp_path / "locked.db"
    server = server_factory(f"sqlite+aiosqlite:///{path}", SERVICE_STORE_OUTAGE_SECONDS="1.5").start()
    client = client_for(server.url)
    background = client.responses.create(**_sdk({**REQUEST, "max_output_tokens": 300}), background=True)
    lockers: list[SQLiteLocker] = []
    streams = _run_streams(server.url, 2, lambda: lockers.append(SQLiteLocker(path, 6.0)))
    lockers[0].wait()
    for events in streams:
        assert_well_formed_stream(events)
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "store_unavailable"
    finished = wait_until_terminal(client, background.id)
    assert finished.status == "incomplete" and finished.usage is not None and finished.usage.output_tokens == 300
    assert_well_formed_stream(raw_events(server.url, background.id))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs of its own, so the test can fill it (skips where mounting is not allowed)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    # Unbuffered: a buffered file would still hold bytes when the disk is full, and its close() would
    # raise ENOSPC trying to flush them.
    with filler.open("wb", buffering=0) as out:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                out.write(chunk)
        except OSError:
            pass
    return filler


def test_a_full_disk_pauses_runs_until_space_returns(small_disk: Path, server_factory: ServerFactory) -> None:
    url = f"sqlite+aiosqlite:///{small_disk / 'service.db'}"
    server = server_factory(url, SERVICE_STORE_OUTAGE_SECONDS="120").start()
    client = client_for(server.url)
    reference = raw_events(server.url, client.responses.create(**_sdk(REQUEST)).id)
    background = client.responses.create(**_sdk({**REQUEST, "max_output_tokens": 400}), background=True)
    fillers: list[Path] = []

    def fill_for_a_while() -> None:
        fillers.append(_fill(small_disk))
        threading.Timer(4.0, fillers[0].unlink).start()  # space returns

    streams = _run_streams(server.url, 2, fill_for_a_while)
    assert not fillers[0].exists()
    for events in streams:
        assert_well_formed_stream(events)
        assert text_from_deltas(events) == text_from_deltas(reference)
    finished = wait_until_terminal(client, background.id)
    assert finished.status == "incomplete" and finished.usage is not None and finished.usage.output_tokens == 400
    assert "store unavailable" in server.log_path.read_text()  # the disk really was full for a commit
    result = doctor(url)
    assert result.returncode == 0, result.stdout + result.stderr


def _log(path: Path) -> str:
    return path.read_text() if path.exists() else ""
