"""Code-interpreter containers: owned by a project, ids minted here, files removed when they go.

The `containers` rows (service/store/containers.py) are the truth; a container's files are its sandbox work
directory (service/tools/sandbox.py). Removing files is I/O outside the database, so it always happens after
the row's delete has committed, and is idempotent; `sweep` also removes any work directory without a row,
so a crash between the commit and the removal leaves nothing behind for longer than one sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.errors import InvalidRequest, NotFound
from service.store import containers as store
from service.tools.sandbox import Sandbox

log = logging.getLogger(__name__)

PROBE_DIR = "probe"  # the sandbox's start-up probe (service/tools/sandbox.py), not a container
_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")  # what the sandbox accepts as a container's directory


def not_found(container_id: str, *, param: str | None = None, expired: bool = False) -> NotFound:
    what = "has expired" if expired else "not found"
    return NotFound(f"Container with id '{container_id}' {what}.", param=param)


class Containers:
    def __init__(self, db: AsyncEngine, sandbox: Sandbox) -> None:
        self.db = db
        self.sandbox = sandbox

    # -- the Containers API ------------------------------------------------------------------------------

    async def create(self, *, project: str, name: str, expires_after_minutes: int) -> dict[str, Any]:
        if "\x00" in name:
            raise InvalidRequest("name must not contain NUL characters.", param="name")
        now = time.time()
        async with self.db.begin() as connection:
            container = await store.insert(
                connection,
                container_id=store.new_container_id(),
                project=project,
                name=name,
                expires_after_minutes=expires_after_minutes,
                now=now,
            )
        return container.as_object(now)

    async def get(self, container_id: str, *, project: str) -> dict[str, Any]:
        if not _NAME.match(container_id):  # not an id this server could have made (PostgreSQL refuses NUL)
            raise not_found(container_id, param="container_id")
        async with self.db.connect() as connection:
            container = await store.get(connection, container_id, project=project)
        if container is None:
            raise not_found(container_id, param="container_id")
        return container.as_object(time.time())

    async def list_page(
        self, *, project: str, after: str | None, limit: int, order: Literal["asc", "desc"], name: str | None
    ) -> dict[str, Any]:
        if after is not None and not _NAME.match(after):
            raise not_found(after, param="after")
        if name is not None and "\x00" in name:
            raise InvalidRequest("name must not contain NUL characters.", param="name")
        async with self.db.connect() as connection:
            found = await store.page(connection, project=project, after=after, limit=limit, order=order, name=name)
        if found is None:
            raise not_found(str(after), param="after")
        rows, has_more = found
        now = time.time()
        data = [row.as_object(now) for row in rows]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }

    async def delete(self, container_id: str, *, project: str) -> dict[str, Any]:
        if not _NAME.match(container_id):
            raise not_found(container_id, param="container_id")
        async with self.db.begin() as connection:
            if await store.get(connection, container_id, project=project) is None:
                raise not_found(container_id, param="container_id")
            await store.delete(connection, [container_id])
        await self.remove_files([container_id])  # after the commit
        return {"id": container_id, "object": "container.deleted", "deleted": True}

    # -- responses -------------------------------------------------------------------------------------------

    async def check(self, container_id: str, param: str, *, project: str) -> None:
        """A request's `container` must be a live container of its project (404 like any resource)."""
        async with self.db.connect() as connection:
            container = await store.get(connection, container_id, project=project)
        if container is None:
            raise not_found(container_id, param=param)
        if container.expired(time.time()):
            raise not_found(container_id, param=param, expired=True)

    async def open_for_run(self, container_id: str, *, project: str, response_id: str) -> str | None:
        """Checked again when code runs (the container may have been deleted or expired since the request):
        None and its expiry moved on, or why the call cannot run. A response's own `auto` container does not
        expire while its run goes on."""
        now = time.time()
        async with self.db.begin() as connection:
            container = await store.get(connection, container_id, project=project)
            if container is None:
                return f"Container with id '{container_id}' not found."
            if container.response_id != response_id and container.expired(now):
                return f"Container with id '{container_id}' has expired."
            await store.touch(connection, container_id, now)
        return None

    @staticmethod
    async def insert_auto(connection: AsyncConnection, response_id: str, *, container_id: str, project: str) -> None:
        """A response's `auto` container (its id derived from the response's: service/agent/items.py), written in
        the response's create transaction (so a resumed run, or another replica, finds it)."""
        await store.insert(
            connection,
            container_id=container_id,
            project=project,
            name=f"auto container of {response_id}",
            expires_after_minutes=store.DEFAULT_EXPIRY_MINUTES,
            now=time.time(),
            response_id=response_id,
        )

    async def delete_for_response(self, response_id: str) -> None:
        """A deleted response takes its `auto` container with it (rows, then files)."""
        async with self.db.begin() as connection:
            ids = await store.of_response(connection, response_id)
            await store.delete(connection, ids)
        await self.remove_files(ids)

    # -- files -----------------------------------------------------------------------------------------------

    async def remove_files(self, container_ids: list[str]) -> None:
        """Idempotent; a failure is logged and left to the next sweep (the row is already gone)."""
        for container_id in container_ids:
            try:
                await asyncio.to_thread(self.sandbox.remove, container_id)
            except (OSError, ValueError) as exc:
                log.warning("could not remove container %s's files: %s", container_id, exc)

    def _directories(self) -> list[str]:
        with contextlib.suppress(FileNotFoundError):
            return sorted(
                entry.name
                for entry in self.sandbox.root.iterdir()
                if entry.name != PROBE_DIR and _NAME.match(entry.name) and (entry.is_dir() or entry.is_symlink())
            )
        return []

    async def sweep(self, *, batch_size: int = 100, now: float | None = None) -> int:
        """Delete expired containers and those of responses that are gone, then their files; then remove any
        work directory without a row (left by a crash after a commit). Returns how many containers went."""
        gone = 0
        while True:
            async with self.db.begin() as connection:
                ids = await store.sweepable(connection, time.time() if now is None else now, limit=batch_size)
                await store.delete(connection, ids)
            await self.remove_files(ids)
            gone += len(ids)
            if len(ids) < batch_size:
                break
        # Directories listed first, rows read after: a row is committed before its directory is made, so a
        # directory seen here whose row is missing afterwards has no live container.
        directories = await asyncio.to_thread(self._directories)
        for start in range(0, len(directories), batch_size):
            chunk = directories[start : start + batch_size]
            async with self.db.connect() as connection:
                live = await store.existing(connection, chunk)
            await self.remove_files([name for name in chunk if name not in live])
        return gone
