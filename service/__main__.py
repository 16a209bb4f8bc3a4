"""Command line: serve, migrate, keys …, model …, inspect, rebuild-projections.

What goes wrong in the user's setup (a bad setting, a database that cannot be opened, a model
directory that cannot be served, a response that does not exist) ends the command with one line
on stderr and exit status 1; Ctrl+C with status 130. Tracebacks are for bugs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from service.config import Settings


class CommandError(Exception):
    """A failure the person running the command can fix; its message is printed as it is."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="listen beyond loopback although no API key is configured (anyone who reaches it may use it)",
    )

    keys = commands.add_parser("keys", help="manage API keys: create, list, revoke")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create_key = key_commands.add_parser("create", help="create a key; the key is printed alone on the last line")
    create_key.add_argument("name")
    create_key.add_argument("--project", default=None, help="the project that owns what the key creates")
    key_commands.add_parser("list", help="name, project, prefix, created and last-used times (never the key)")
    revoke_key = key_commands.add_parser("revoke", help="revoke a key: it is refused from then on")
    revoke_key.add_argument("name")

    commands.add_parser("migrate", help="apply database migrations and exit")
    commands.add_parser("rebuild-projections", help="drop and rebuild the responses/conversation tables from the log")
    commands.add_parser("doctor", help="check the log's invariants and the projections; exit 1 on any problem")
    inspect = commands.add_parser("inspect", help="print a response and its events as JSON")
    inspect.add_argument("response_id")

    from service.webhooks.cli import add_webhook_commands

    add_webhook_commands(commands)

    from service.model_cli import add_model_commands

    add_model_commands(commands)
    args = parser.parse_args(argv)
    from service.engine.model_files import ModelDirError
    from service.key_cli import KeysCommandError
    from service.store.db import DatabaseUnavailable

    try:
        with _remembering_ctrl_c():
            return _run(args)
    except (CommandError, DatabaseUnavailable, ModelDirError, KeysCommandError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def settings_from_env() -> Settings:
    try:
        return Settings.from_env()
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = "SERVICE_" + "_".join(str(part) for part in error["loc"]).upper()
            problems.append(f"{name}={error.get('input')!r}: {error['msg']}")
        raise CommandError("bad setting: " + "; ".join(problems)) from exc


def _run(args: argparse.Namespace) -> int:
    if args.command == "model":
        from service.model_cli import run_model_command

        return run_model_command(args)
    settings = settings_from_env()
    if args.command == "serve":
        return _serve(settings, args)
    if args.command == "keys":
        from service.key_cli import run_keys_command

        _require_migrated(settings.database_url)
        return run_keys_command(settings.database_url, args)
    if args.command == "webhooks":
        from service.webhooks.cli import run_webhooks_command

        _require_migrated(settings.database_url)
        return run_webhooks_command(settings, args)
    if args.command == "migrate":
        from service.store.db import migrate_sync

        print(migrate_sync(settings.database_url).describe())
        return 0
    if args.command == "rebuild-projections":
        from service.store.rebuild import rebuild_projections

        count = asyncio.run(rebuild_projections(settings.database_url))
        print(f"rebuilt {count} streams (responses and conversations)")
        return 0
    if args.command == "doctor":
        from service.store.doctor import check_database

        _require_migrated(settings.database_url)
        report = asyncio.run(check_database(settings.database_url))
        for problem in report.problems:
            print(f"{problem.response_id}: {problem.what}")
        verdict = "ok" if not report.problems else f"{len(report.problems)} problem(s)"
        counts = f"{report.responses} responses, {report.conversations} conversations, {report.events} events"
        print(f"{verdict}: {counts} checked")
        return 1 if report.problems else 0
    if args.command == "inspect":
        from service.store.rebuild import inspect_response

        _require_migrated(settings.database_url)
        record = asyncio.run(inspect_response(settings.database_url, args.response_id))
        if record["response"] is None and not record["events"]:
            raise CommandError(f"response {args.response_id} not found")
        print(json.dumps(record, indent=2))
        return 0
    raise CommandError(f"unknown command {args.command}")


def _require_migrated(database_url: str) -> None:
    """For the commands that only read: the database is reachable and has the service's tables."""
    from service.store.db import current_revision, describe_url

    if asyncio.run(current_revision(database_url)) is None:
        raise CommandError(f"{describe_url(database_url)} has no tables yet (run `python -m service migrate` first)")


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    """Open the database and load the model before the server starts, so that a setup problem is one
    line here instead of a traceback from inside the server's start-up."""
    import uvicorn

    from service.app import begin_drain, create_app
    from service.key_cli import authentication_mode
    from service.models import load_runtime
    from service.observability import configure_logging
    from service.store.db import DatabaseUnavailable, migrate_when_reachable

    configure_logging(args.log_level)
    log = logging.getLogger(__name__)

    def waiting(error: DatabaseUnavailable, delay: float) -> None:
        log.warning("%s; trying again in %.1fs", error, delay)

    with _remembering_ctrl_c():  # checked when start-up ends, before the server takes SIGINT over
        # A server started beside its database (or during a network blip) waits for it as long as
        # a running server would wait out an outage.
        migrated = migrate_when_reachable(settings.database_url, settings.store_outage_seconds, waiting)
        log.info("database %s", migrated.describe())
        mode = authentication_mode(settings, host=args.host, allow_unauthenticated=args.allow_unauthenticated)
        runtime = load_runtime(settings)
    log.log(logging.WARNING if mode.startswith("unauthenticated") else logging.INFO, mode)
    settings = settings.model_copy(update={"listen_host": args.host})  # MCP address policy
    app = create_app(settings, runtime=runtime)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            asyncio.get_event_loop().create_task(begin_drain(app))
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=10,
        log_config=None,  # uvicorn's loggers write through configure_logging's JSON handler
        access_log=False,  # service.access writes one JSON line per request instead
    )
    server = DrainingServer(config)
    server.run()
    return 0 if server.started else 1  # uvicorn logged why it could not start


@contextlib.contextmanager
def _remembering_ctrl_c() -> Iterator[None]:
    """Ctrl+C raises KeyboardInterrupt as usual, and is also remembered, so that it still ends the
    command when the exception is swallowed: raised inside a garbage-collection callback, Python
    reports it as "Exception ignored" and goes on (that report is silenced here). Checked when the
    block ends; uvicorn, which takes SIGINT over while it serves, re-raises it here when it stops."""
    pressed = False
    default_hook = sys.unraisablehook

    def on_sigint(_signum: int, _frame: object) -> None:
        nonlocal pressed
        pressed = True
        raise KeyboardInterrupt

    def quiet(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            default_hook(unraisable)

    previous = signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = quiet
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = default_hook
    if pressed:
        raise KeyboardInterrupt


def _exit_skipping_teardown(code: int) -> None:
    """End the process once everything is flushed, without the interpreter's teardown. After `serve` has
    shut down gracefully (runs handed back, the log committed, the database closed), tearing down native
    libraries and their threads adds nothing, and under load it sometimes crashed (SIGSEGV with no Python
    frame) or hung after "interrupted" (onnxruntime's and the executors' threads)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        _exit_skipping_teardown(exit_code)
    sys.exit(exit_code)
