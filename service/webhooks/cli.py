"""`python -m service webhooks add|list|remove|test|deliveries`."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import sqlalchemy as sa

from service.config import Settings
from service.store.db import create_engine
from service.store.schema import DEFAULT_PROJECT
from service.store.webhook_tables import webhook_deliveries
from service.webhooks import endpoints
from service.webhooks.delivery import send_test


def add_webhook_commands(commands: Any) -> None:
    webhooks = commands.add_parser("webhooks", help="manage webhook endpoints: add, list, remove, test, deliveries")
    sub = webhooks.add_subparsers(dest="webhooks_command", required=True)
    add = sub.add_parser("add", help="add an endpoint; its signing secret is printed alone on the last line")
    add.add_argument("url")
    add.add_argument(
        "--events", nargs="+", default=None, help=f"event types (default: all of {', '.join(endpoints.EVENT_TYPES)})"
    )
    add.add_argument("--project", default=None, help="the project whose responses it hears")
    add.add_argument("--all-responses", action="store_true", help="every response, not only background ones")
    sub.add_parser("list", help="endpoints with their deliveries by status (never the secret)")
    remove = sub.add_parser("remove", help="remove an endpoint and its undelivered deliveries")
    remove.add_argument("endpoint_id")
    test = sub.add_parser("test", help="POST one signed sample event to an endpoint now")
    test.add_argument("endpoint_id")
    deliveries = sub.add_parser("deliveries", help="recent deliveries (pending, delivered, failed)")
    deliveries.add_argument("--status", default=None)
    deliveries.add_argument("--limit", type=int, default=20)


def run_webhooks_command(settings: Settings, args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(settings, args))
    except endpoints.EndpointProblem as exc:
        from service.key_cli import KeysCommandError

        raise KeysCommandError(str(exc)) from exc  # printed as one `error:` line


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    db = create_engine(settings.database_url)
    try:
        command = args.webhooks_command
        if command == "add":
            endpoints.check_url(args.url, settings.webhook_hosts())
            types = endpoints.parse_event_types(args.events)
            box = await endpoints.SecretBox.load(db, settings.secret_key)
            project = args.project or DEFAULT_PROJECT
            async with db.begin() as connection:
                endpoint, secret = await endpoints.create(
                    connection, box, url=args.url, project=project, event_types=types, all_responses=args.all_responses
                )
            scope = "all responses" if endpoint.all_responses else "background responses"
            print(f"created webhook endpoint {endpoint.id} for project {project!r} ({', '.join(types)}; {scope})")
            print("its signing secret is shown once, here:")
            print(secret)
        elif command == "list":
            async with db.connect() as connection:
                found = await endpoints.list_all(connection)
                counts = await endpoints.delivery_counts(connection)
            print(f"{'ID':<28} {'PROJECT':<16} {'SCOPE':<10} {'PENDING':>7} {'DELIVERED':>9} {'FAILED':>6} URL")
            for e in found:
                scope = "all" if e.all_responses else "background"
                n = [counts.get((e.id, status), 0) for status in ("pending", "delivered", "failed")]
                print(f"{e.id:<28} {e.project:<16} {scope:<10} {n[0]:>7} {n[1]:>9} {n[2]:>6} {e.url}")
        elif command == "remove":
            async with db.begin() as connection:
                gone = await endpoints.remove(connection, args.endpoint_id)
            print(f"removed webhook endpoint {args.endpoint_id} ({gone} undelivered deliveries dropped)")
        elif command == "test":
            status, error, latency = await send_test(settings, db, args.endpoint_id)
            print(f"{args.endpoint_id}: {error or f'HTTP {status}'} in {latency * 1000:.0f} ms")
            return 0 if error is None else 1
        else:
            query = sa.select(
                webhook_deliveries.c.id,
                webhook_deliveries.c.endpoint_id,
                webhook_deliveries.c.response_id,
                webhook_deliveries.c.event_type,
                webhook_deliveries.c.status,
                webhook_deliveries.c.attempts,
                webhook_deliveries.c.created_at,
                webhook_deliveries.c.last_error,
            ).order_by(webhook_deliveries.c.created_at.desc())
            if args.status:
                query = query.where(webhook_deliveries.c.status == args.status)
            async with db.connect() as connection:
                rows = list(await connection.execute(query.limit(args.limit)))
            for did, eid, rid, etype, status, attempts, created, error in rows:
                when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(created))
                print(f"{did} {eid} {rid} {etype} {status} attempts={attempts} {when} {error or ''}".rstrip())
        return 0
    finally:
        await db.dispose()
