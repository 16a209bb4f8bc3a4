"""The command line as a new user meets it: `python -m service ...` in a subprocess. Setup problems
end with one clear line on stderr and exit status 1 (never a traceback), Ctrl+C ends cleanly, and
an installed wheel (not the checkout) can migrate a database."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Callable
from pathlib import Path

import pytest

from service.engine.cpu import cpu_features
from service.store.db import head_revision
from tests.cli_helpers import assert_one_line_error, run_cli
from tests.conftest import _PG_SKIP_REASON, PG_URL_TEMPLATE, ROOT, ServerProcess, free_port

needs_postgres = pytest.mark.skipif(bool(_PG_SKIP_REASON), reason=_PG_SKIP_REASON or "")


def test_migrate_says_what_it_did(database_url: str) -> None:
    first = run_cli("migrate", SERVICE_DATABASE_URL=database_url)
    assert first.returncode == 0, first.stderr
    assert f"migrated from revision (empty database) to {head_revision()} (head)" in first.stdout
    again = run_cli("migrate", SERVICE_DATABASE_URL=database_url)
    assert again.returncode == 0 and f"already at revision {head_revision()} (head); nothing to do" in again.stdout
    database = database_url.rsplit("/", 1)[-1]
    assert database in first.stdout and database in again.stdout


@needs_postgres
def test_a_postgres_database_that_does_not_exist() -> None:
    url = PG_URL_TEMPLATE.format(db="svc_no_such_database")
    commands = (["migrate"], ["serve", "--log-level", "warning"], ["rebuild-projections"], ["inspect", "x"], ["doctor"])
    for command in commands:
        result = run_cli(*command, SERVICE_DATABASE_URL=url)
        assert_one_line_error(result, "svc_no_such_database", "does not exist", "createdb")


def test_unreachable_and_unusable_databases(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    refused = run_cli("migrate", SERVICE_DATABASE_URL=f"postgresql+asyncpg://postgres:secret@127.0.0.1:{port}/x")
    line = assert_one_line_error(refused, "cannot open the database", str(port))
    assert "secret" not in line  # the password is never printed
    no_dir = f"sqlite+aiosqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    assert_one_line_error(run_cli("migrate", SERVICE_DATABASE_URL=no_dir), "unable to open database file")
    sync_driver = f"sqlite:///{tmp_path / 'x.db'}"
    assert_one_line_error(run_cli("migrate", SERVICE_DATABASE_URL=sync_driver), "not usable", "async driver")


def test_serve_waits_for_an_unreachable_database_then_gives_up() -> None:
    """A refused connection may be a database still starting: `serve` tries again until
    SERVICE_STORE_OUTAGE_SECONDS have passed, saying so, then ends with the one-line error."""
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/x"
    started = time.monotonic()
    result = run_cli("serve", "--log-level", "warning", SERVICE_DATABASE_URL=url, SERVICE_STORE_OUTAGE_SECONDS="1.5")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: cannot open the database"), lines[-1]
    assert len(lines) >= 3 and all("trying again" in line for line in lines[:-1]), lines
    assert time.monotonic() - started >= 1.5  # the whole patience is used, the last wait cut to it


def test_a_sqlite_file_that_cannot_open_leaves_no_worker_behind(tmp_path: Path) -> None:
    """aiosqlite stops a failed connection's worker without waiting; if the loop closed first, the worker
    printed a traceback after the one-line error (seen under load). The failure path joins it."""
    import asyncio
    import threading

    from service.store.db import DatabaseUnavailable, current_revision

    url = f"sqlite+aiosqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    died: list[BaseException | None] = []
    previous, threading.excepthook = threading.excepthook, lambda args: died.append(args.exc_value)
    try:
        for _ in range(20):
            with pytest.raises(DatabaseUnavailable, match="unable to open database file"):
                asyncio.run(current_revision(url))
            assert not [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]
    finally:
        threading.excepthook = previous
    assert died == []


def test_commands_start_without_importing_what_they_do_not_use(random_model_dir: Path) -> None:
    """`import onnx` and the MCP SDK each cost about a second: the CLI imports onnx only in the commands
    that read or write graphs, and the server imports the SDK when an MCP session opens. Loading the
    model for `serve` neither imports onnx nor parses the graph; the model's description (GET /v1/models)
    does, on first use."""
    code = (
        "import contextlib, io, sys\n"
        "from service.__main__ import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "print(sorted(m for m in ('onnx', 'mcp', 'mcp_types') if m in sys.modules))\n"
        "import service.app\n"
        "from service.config import Settings\n"
        "from service.models import load_runtime\n"
        "runtime = load_runtime(Settings.from_env())\n"
        "print(sorted(m for m in ('onnx', 'mcp', 'mcp_types') if m in sys.modules))\n"
        "print(runtime.info()['int8_kernel'], 'onnx' in sys.modules, runtime.info() is runtime.info())\n"
    )
    env = {**os.environ, "SERVICE_MODEL": str(random_model_dir), "SERVICE_INTRA_OP_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[:2] == ["[]", "[]"]
    assert lines[2] == f"{cpu_features().int8_kernel} True True"


def test_bad_settings_name_the_variable() -> None:
    result = run_cli("migrate", SERVICE_MAX_ACTIVE_RUNS="abc", SERVICE_LEASE_SECONDS="-1")
    assert_one_line_error(result, "SERVICE_MAX_ACTIVE_RUNS='abc'", "valid integer", "SERVICE_LEASE_SECONDS='-1'")


def test_a_bad_service_model_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 's.db'}"
    missing = run_cli("serve", "--log-level", "warning", SERVICE_DATABASE_URL=url, SERVICE_MODEL=str(tmp_path / "no"))
    assert_one_line_error(missing, f"SERVICE_MODEL={tmp_path / 'no'}", "not a directory")
    not_a_model = run_cli("serve", "--log-level", "warning", SERVICE_DATABASE_URL=url, SERVICE_MODEL=str(tmp_path))
    assert_one_line_error(not_a_model, "is not a model directory", "config.json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"num_layers": 1}')
    assert_one_line_error(
        run_cli("serve", "--log-level", "warning", SERVICE_DATABASE_URL=url, SERVICE_MODEL=str(broken)),
        "config.json does not describe a decoder",
    )
    (broken / "config.json").write_text(
        '{"vocab_size": 10, "hidden_size": 8, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4,'
        ' "intermediate_size": 8, "max_position": 16, "chat_format": "harmony"}'
    )
    (broken / "model.onnx").write_bytes(b"\x00 not an onnx graph")
    assert_one_line_error(
        run_cli("serve", "--log-level", "warning", SERVICE_DATABASE_URL=url, SERVICE_MODEL=str(broken)),
        f"SERVICE_MODEL={broken} cannot be loaded",
    )


def test_inspect_an_unknown_id(database_url: str) -> None:
    for command in (["inspect", "resp_nothing"], ["doctor"]):
        never_migrated = run_cli(*command, SERVICE_DATABASE_URL=database_url)
        assert_one_line_error(never_migrated, "no tables yet", "migrate")
    assert run_cli("migrate", SERVICE_DATABASE_URL=database_url).returncode == 0
    unknown = run_cli("inspect", "resp_nothing", SERVICE_DATABASE_URL=database_url)
    assert_one_line_error(unknown, "response resp_nothing not found")


def _no_traceback(log: Path) -> str:
    text = log.read_text()
    assert "Traceback" not in text and "Error" not in text.replace("ERROR", ""), text[-3000:]
    return text


def test_ctrl_c_stops_a_running_server_cleanly(
    database_url: str, server_factory: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = server_factory(database_url).start()
    from tests.api_helpers import client_for

    client = client_for(server.url)
    background = client.responses.create(input="Keep going", background=True, max_output_tokens=2000)
    assert server.process is not None
    server.process.send_signal(signal.SIGINT)
    # uvicorn shuts down gracefully, then re-raises the signal: the conventional status of a Ctrl+C'd command.
    assert server.process.wait(timeout=30) == 130
    assert _no_traceback(server.log_path).strip().splitlines()[-1] == "interrupted"
    restarted = server_factory(database_url).start()  # the run was handed back, not lost
    assert client_for(restarted.url).responses.retrieve(background.id).id == background.id


def test_ctrl_c_while_the_model_is_being_built(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {
        **os.environ,
        "SERVICE_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
        "SERVICE_MODEL_CACHE": str(tmp_path / "cache"),  # empty: the built-in model is built first
        "SERVICE_INTRA_OP_THREADS": "1",
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(free_port()), "--log-level", "warning"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not list((tmp_path / "cache").glob(".builtin-*")):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        time.sleep(0.3)  # inside the build, past the creation of its work directory
        process.send_signal(signal.SIGINT)
        # 130, or (rarely, when the interpreter finishes by re-raising the signal) ended by SIGINT: a shell
        # reports both as 130.
        assert process.wait(timeout=60) in (130, -signal.SIGINT)
    text = log.read_text()
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert text.strip().splitlines()[-1] == "interrupted", text[-3000:]
    # No half-built model left behind (the build may have finished before the signal was acted on).
    assert not list((tmp_path / "cache").glob(".builtin-*"))


def test_an_installed_wheel_can_migrate(tmp_path: Path) -> None:
    """`pip wheel .`, installed into a fresh environment (not editable, no checkout on its path) that sees
    this environment's dependencies; `migrate` run from a directory outside the repository."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(wheels)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("responses_service-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The dependencies come from this environment, appended after the new one's own site-packages (a .pth
    # line is a plain path: this environment's editable install of the checkout is not activated by it).
    Path(site, "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run(
        [python, "-c", "import service; print(service.__file__)"], cwd=work, capture_output=True, text=True
    )
    assert where.stdout.strip().startswith(str(env_dir)), where
    env = {"SERVICE_DATABASE_URL": f"sqlite+aiosqlite:///{work / 'fresh.db'}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [python, "-m", "service", "migrate"], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"migrated from revision (empty database) to {head_revision()} (head)" in result.stdout
    assert (work / "fresh.db").exists() and not (ROOT / "fresh.db").exists()


def test_the_readme_documents_every_setting() -> None:
    # The settings table moved from the README to the docs site's configuration page (the test keeps its id);
    # the page is generated from Settings' descriptions, so it must equal what the generator writes now.
    from service.config import Settings
    from service.config_docs import render_configuration_page

    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render_configuration_page(), "regenerate: python -m service.config_docs > docs/configuration.md"
    documented = set(re.findall(r"^\| `(SERVICE_[A-Z_]+)` \|", page, flags=re.MULTILINE))
    assert {f"SERVICE_{name.upper()}" for name in Settings.model_fields} <= documented
    used = set(re.findall(r"SERVICE_[A-Z_]+[A-Z]", "".join(p.read_text() for p in (ROOT / "service").rglob("*.py"))))
    assert used <= documented, used - documented
