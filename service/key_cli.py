"""`python -m service keys create|list|revoke`, and the start-up decision about authentication."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import time

from service.config import Settings
from service.store import keys
from service.store.db import create_engine
from service.store.schema import DEFAULT_PROJECT


class KeysCommandError(Exception):
    """Printed as one `error:` line by the CLI."""


def run_keys_command(database_url: str, args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(database_url, args))
    except keys.KeyProblem as exc:
        raise KeysCommandError(str(exc)) from exc


async def _run(database_url: str, args: argparse.Namespace) -> int:
    db = create_engine(database_url)
    try:
        if args.keys_command == "create":
            project = args.project or DEFAULT_PROJECT
            async with db.begin() as connection:
                key = await keys.create_key(connection, args.name, project=project)
            print(f"created key {args.name!r} for project {project!r}; it is shown once, here:")
            print(key)
        elif args.keys_command == "list":
            async with db.connect() as connection:
                found = await keys.list_keys(connection)
            print(f"{'NAME':<24} {'PROJECT':<16} {'PREFIX':<16} {'CREATED':<20} {'LAST USED':<20} STATUS")
            for info in found:
                status = "revoked " + _when(info.revoked_at) if info.revoked_at else "active"
                print(
                    f"{info.name:<24} {info.project:<16} {info.prefix + '…':<16} {_when(info.created_at):<20} "
                    f"{_when(info.last_used_at):<20} {status}"
                )
        else:
            async with db.begin() as connection:
                await keys.revoke_key(connection, args.name)
            print(f"revoked key {args.name!r}")
        return 0
    finally:
        await db.dispose()


def _when(at: float | None) -> str:
    return "never" if at is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def authentication_mode(settings: Settings, *, host: str, allow_unauthenticated: bool) -> str:
    """How the server will authenticate, as a start-up log line; KeysCommandError where it must not start:
    no key configured and a non-loopback address without `--allow-unauthenticated`."""
    db = create_engine(settings.database_url)

    async def stored_keys() -> bool:
        try:
            async with db.connect() as connection:
                return await keys.any_key(connection)
        finally:
            await db.dispose()

    has_keys = asyncio.run(stored_keys())
    if settings.api_key or has_keys:
        sources = [name for name, present in (("SERVICE_API_KEY", settings.api_key), ("api_keys", has_keys)) if present]
        return f"authentication: bearer keys required on /v1 (from {' and '.join(sources)})"
    if is_loopback(host):
        return "unauthenticated: no API key is configured; listening on loopback only"
    if not allow_unauthenticated:
        raise KeysCommandError(
            f"no API key is configured, so the server will not listen on {host} (only on loopback); "
            "set SERVICE_API_KEY, create one with `python -m service keys create NAME`, "
            "or pass --allow-unauthenticated"
        )
    return f"unauthenticated: no API key is configured and --allow-unauthenticated lets anyone reaching {host} in"
