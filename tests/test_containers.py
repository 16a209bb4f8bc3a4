"""Code-interpreter containers through the real server and the official client: owned by a project (another
project's or a made-up id is a 404), created and listed with `client.containers.*`, and their files removed
when the container, its response, or its expiry ends it (retention, also after a crash left a directory)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from tests.api_helpers import client_for, sql_rows
from tests.cli_helpers import run_cli
from tests.conftest import ServerProcess, new_sandbox_root

ServerFactory = Callable[..., ServerProcess]
BUDGET = {"SERVICE_REASONING_TOKENS_LOW": "6", "SERVICE_REASONING_TOKENS_MEDIUM": "6"}


def _sandbox_dir() -> Path:
    return new_sandbox_root() / "c"


def _env(sandbox_dir: Path, **more: str) -> dict[str, str]:
    return {**BUDGET, "SERVICE_CODE_INTERPRETER_MAX_CODE_CHARS": "40", "SERVICE_SANDBOX_DIR": str(sandbox_dir), **more}


def _key(database_url: str, name: str, project: str) -> str:
    result = run_cli("keys", "create", name, "--project", project, SERVICE_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _client(url: str, key: str) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _run_code(client: OpenAI, container: Any) -> Any:
    """A response whose random model makes one code call (tool_choice='required', short code)."""
    return client.responses.create(
        input="compute something",
        tools=[{"type": "code_interpreter", "container": container}],
        tool_choice="required",
        max_tool_calls=1,
        max_output_tokens=120,
        extra_body={"seed": 3},
    )


def _code_call(response: Any) -> Any:
    calls = [item for item in response.output if item.type == "code_interpreter_call"]
    assert len(calls) == 1, response.output
    return calls[0]


def _until(condition: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_containers_crud_through_the_sdk(database_url: str, app_factory: ServerFactory) -> None:
    sandbox_dir = _sandbox_dir()
    server = app_factory(database_url, **_env(sandbox_dir)).start()
    client = client_for(server.url)
    expiry: Any = {"anchor": "last_active_at", "minutes": 5}
    created = [client.containers.create(name=f"box {n}", expires_after=expiry) for n in range(3)]
    first = created[0]
    assert first.id.startswith("cntr_") and first.object == "container" and first.name == "box 0"
    assert first.status == "running" and first.expires_after is not None and first.expires_after.minutes == 5
    assert len({c.id for c in created}) == 3
    assert client.containers.retrieve(first.id).id == first.id
    # Paginated by the SDK (limit 1 a page), newest first by default, and in ascending order on request.
    assert [c.id for c in client.containers.list(limit=1)] == [c.id for c in reversed(created)]
    assert [c.id for c in client.containers.list(limit=2, order="asc")] == [c.id for c in created]
    page = client.containers.list(limit=2)
    assert page.has_more and len(page.data) == 2
    assert [c.id for c in client.containers.list(name="box 1")] == [created[1].id]
    default = client.containers.create(name="defaults")
    # Ids this server could not have made are a 404 before any query (PostgreSQL refuses NUL in text).
    for method, path in (
        ("GET", "/v1/containers/a%00b"),
        ("DELETE", "/v1/containers/a%00b"),
        ("GET", "/v1/containers?after=a%00b"),
    ):
        assert httpx.request(method, server.url + path).status_code == 404
    assert httpx.post(server.url + "/v1/containers", json={"name": "a\x00b"}).status_code == 400
    assert httpx.get(server.url + "/v1/containers", params={"name": "a\x00b"}).status_code == 400
    assert default.expires_after is not None and default.expires_after.minutes == 20

    # Code runs in a named container, in its directory; deleting the container removes it.
    call = _code_call(_run_code(client, first.id))
    assert call.container_id == first.id
    assert (sandbox_dir / first.id).is_dir()
    columns = "project, name, response_id, status"
    rows = sql_rows(database_url, f"SELECT {columns} FROM containers WHERE id = :id", id=first.id)
    assert rows == [("default", "box 0", None, "running")]
    client.containers.delete(first.id)
    assert not (sandbox_dir / first.id).exists(), "DELETE /v1/containers removes the files"
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.containers.delete(first.id)
    with pytest.raises(openai.NotFoundError) as refused:
        _run_code(client, first.id)
    assert refused.value.body["param"] == "tools[0].container"  # type: ignore[index]


def test_another_project_cannot_name_a_container(database_url: str, app_factory: ServerFactory) -> None:
    assert run_cli("migrate", SERVICE_DATABASE_URL=database_url).returncode == 0
    key_a, key_b = _key(database_url, "a", "project-a"), _key(database_url, "b", "project-b")
    sandbox_dir = _sandbox_dir()
    server = app_factory(database_url, **_env(sandbox_dir)).start()
    client_a, client_b = _client(server.url, key_a), _client(server.url, key_b)
    mine = client_a.containers.create(name="a's")
    _code_call(_run_code(client_a, mine.id))
    secret = sandbox_dir / mine.id / "secret.txt"
    secret.write_text("project a's data")  # a file A's code would have written

    for container in (mine.id, "cntr_made_up", "shared-name"):
        with pytest.raises(openai.NotFoundError) as refused:
            _run_code(client_b, container)
        body: Any = refused.value.body
        assert body["param"] == "tools[0].container" and body["code"] == "not_found", body
    with pytest.raises(openai.NotFoundError):
        client_b.containers.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        client_b.containers.delete(mine.id)
    assert [c.id for c in client_b.containers.list()] == []
    assert [c.id for c in client_a.containers.list()] == [mine.id]
    assert secret.read_text() == "project a's data"
    assert sorted(p.name for p in sandbox_dir.iterdir() if p.name != "probe") == [mine.id]

    # An `auto` container is its response's project's too.
    auto = _code_call(_run_code(client_a, {"type": "auto"})).container_id
    with pytest.raises(openai.NotFoundError):
        _run_code(client_b, auto)
    assert sql_rows(database_url, "SELECT project FROM containers WHERE id = :id", id=auto) == [("project-a",)]


def test_deleting_a_response_removes_its_auto_container(database_url: str, app_factory: ServerFactory) -> None:
    sandbox_dir = _sandbox_dir()
    server = app_factory(database_url, **_env(sandbox_dir)).start()
    client = client_for(server.url)
    response = _run_code(client, {"type": "auto"})
    container = _code_call(response).container_id
    assert (sandbox_dir / container).is_dir()
    assert sql_rows(database_url, "SELECT response_id FROM containers WHERE id = :id", id=container) == [(response.id,)]
    assert client.containers.retrieve(container).id == container  # usable by id, like OpenAI's
    client.responses.delete(response.id)
    assert not (sandbox_dir / container).exists(), "deleting a response removes its auto container's files"
    assert sql_rows(database_url, "SELECT id FROM containers WHERE id = :id", id=container) == []


def test_retention_removes_expired_containers_and_leftover_directories(
    database_url: str, app_factory: ServerFactory
) -> None:
    sandbox_dir = _sandbox_dir()
    # First a server whose sweeper waits an hour between sweeps: an expired container is refused meanwhile.
    server = app_factory(database_url, **_env(sandbox_dir, SERVICE_RETENTION_SWEEP_SECONDS="3600")).start()
    client = client_for(server.url)
    old, fresh = client.containers.create(name="old"), client.containers.create(name="fresh")
    for container in (old, fresh):
        (sandbox_dir / container.id).mkdir(parents=True)  # as its first code run makes it
        (sandbox_dir / container.id / "out.csv").write_text("1,2\n")
    sql_rows(
        database_url,
        "UPDATE containers SET last_active_at = last_active_at - 3600 WHERE id = :id",  # idle past its 20 minutes
        id=old.id,
    )
    assert client.containers.retrieve(old.id).status == "expired"
    with pytest.raises(openai.NotFoundError) as refused:
        _run_code(client, old.id)
    assert "expired" in refused.value.message
    # A directory left by a crash between a delete's commit and its file removal.
    (sandbox_dir / "cntr_left_behind").mkdir()
    # A response's `auto` container, whose response retention will purge.
    purged = _run_code(client, {"type": "auto"})
    auto = _code_call(purged).container_id
    assert (sandbox_dir / auto).is_dir()
    server.stop()

    horizon = {"SERVICE_RETENTION_DAYS": str(1 / 86_400), "SERVICE_RETENTION_SWEEP_SECONDS": "0.3"}
    server = app_factory(database_url, **_env(sandbox_dir, **horizon)).start()
    client = client_for(server.url)
    assert _until(lambda: not (sandbox_dir / auto).exists()), "a purged response's auto container goes with it"
    assert sql_rows(database_url, "SELECT id FROM containers WHERE id = :id", id=auto) == []
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(purged.id)
    assert _until(lambda: not (sandbox_dir / old.id).exists()), "the expired container's files are removed"
    assert _until(lambda: not (sandbox_dir / "cntr_left_behind").exists()), "a leftover directory is removed"
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(old.id)
    assert (sandbox_dir / fresh.id / "out.csv").read_text() == "1,2\n"
    assert client.containers.retrieve(fresh.id).status == "running"


async def test_code_runs_only_in_a_container_still_its_projects(db: Any, tmp_path: Path) -> None:
    """Checked again when code runs: deleted, foreign or expired since the request was accepted is refused."""
    from service.containers import Containers
    from service.store import containers as store
    from service.tools.sandbox import Sandbox

    boxes = Containers(db, Sandbox(tmp_path / "sandbox"))
    mine = await boxes.create(project="a", name="mine", expires_after_minutes=1)
    assert await boxes.open_for_run(mine["id"], project="a", response_id="resp_x") is None
    assert "not found" in str(await boxes.open_for_run(mine["id"], project="b", response_id="resp_x"))
    async with db.begin() as connection:
        await store.touch(connection, mine["id"], time.time() - 120)
    assert "expired" in str(await boxes.open_for_run(mine["id"], project="a", response_id="resp_x"))
    await boxes.delete(mine["id"], project="a")
    assert "not found" in str(await boxes.open_for_run(mine["id"], project="a", response_id="resp_x"))
