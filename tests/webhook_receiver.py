"""A loopback webhook receiver for tests: an http.server in a thread that records every request (headers, body,
when it arrived and when it was answered) and answers as `behave(webhook_id, nth_time_seen)` says."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    webhook_id: str
    headers: dict[str, str]
    body: bytes
    started: float
    ended: float = 0.0
    status: int = 0


# (status to answer, seconds to wait before answering)
Behaviour = Callable[[str, int], tuple[int, float]]


@dataclass
class Receiver:
    behave: Behaviour = lambda _id, _n: (200, 0.0)
    received: list[Received] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self, port: int = 0) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                webhook_id = self.headers.get("webhook-id", "")
                record = Received(webhook_id, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                with receiver.lock:
                    receiver.seen[webhook_id] += 1
                    nth = receiver.seen[webhook_id]
                    receiver.received.append(record)
                status, delay = receiver.behave(webhook_id, nth)
                time.sleep(delay)
                record.status = status
                try:
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up (timeout) or died
                record.ended = time.time()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                snapshot = list(self.received)
            if predicate(snapshot):
                return snapshot
            time.sleep(0.05)
        raise AssertionError(f"receiver: condition not met in {timeout}s; got {len(self.received)} requests")
