"""Command line: serve, migrate, model …, inspect, rebuild-projections."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from service.config import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info")

    commands.add_parser("migrate", help="apply database migrations and exit")
    commands.add_parser("rebuild-projections", help="drop and rebuild the responses/conversation tables from the log")
    commands.add_parser("doctor", help="check the log's invariants and the projections; exit 1 on any problem")
    inspect = commands.add_parser("inspect", help="print a response and its events as JSON")
    inspect.add_argument("response_id")

    from service.engine.cli import add_model_commands

    add_model_commands(commands)
    args = parser.parse_args(argv)
    settings = Settings.from_env()

    if args.command == "serve":
        import uvicorn

        from service.app import begin_drain, create_app

        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        app = create_app(settings)

        class DrainingServer(uvicorn.Server):
            def handle_exit(self, sig: int, frame: object) -> None:
                asyncio.get_event_loop().create_task(begin_drain(app))
                super().handle_exit(sig, frame)  # type: ignore[arg-type]

        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10
        )
        DrainingServer(config).run()
        return 0
    if args.command == "migrate":
        from service.store.db import migrate_sync

        migrate_sync(settings.database_url)
        return 0
    if args.command == "rebuild-projections":
        from service.store.rebuild import rebuild_projections

        count = asyncio.run(rebuild_projections(settings.database_url))
        print(f"rebuilt {count} streams (responses and conversations)")
        return 0
    if args.command == "doctor":
        from service.store.doctor import check_database

        report = asyncio.run(check_database(settings.database_url))
        for problem in report.problems:
            print(f"{problem.response_id}: {problem.what}")
        verdict = "ok" if not report.problems else f"{len(report.problems)} problem(s)"
        counts = f"{report.responses} responses, {report.conversations} conversations, {report.events} events"
        print(f"{verdict}: {counts} checked")
        return 1 if report.problems else 0
    if args.command == "inspect":
        from service.store.rebuild import inspect_response

        print(json.dumps(asyncio.run(inspect_response(settings.database_url, args.response_id)), indent=2))
        return 0
    if args.command == "model":
        from service.engine.cli import run_model_command

        return run_model_command(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
