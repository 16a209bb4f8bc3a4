"""Who is asking: the `Authorization: Bearer …` header resolved to a key and its project.

- `SERVICE_API_KEY`, when set, is one key of the default project (compared in constant time).
- Keys made with `python -m service keys create` are looked up by their SHA-256 in `api_keys`.
- With neither, the server is unauthenticated (refused off loopback unless `--allow-unauthenticated`):
  every request belongs to the default project and the header is ignored.

The resolved identity is put in the ASGI scope's state (`request.state.project`, `.key_name`);
routes pass the project down to every query. A header that is not UTF-8, not `Bearer`, or empty
is a 401 like a wrong key."""

from __future__ import annotations

import contextlib
import hmac
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import Unauthorized
from service.observability import project_var
from service.store import keys
from service.store.faults import is_transient
from service.store.schema import DEFAULT_PROJECT

ENV_KEY_NAME = "SERVICE_API_KEY"
TOUCH_INTERVAL_SECONDS = 60.0  # last_used_at is written at most this often per key
KEYS_RECHECK_SECONDS = 1.0  # while no key exists, how often a request looks for a new one


@dataclass(frozen=True)
class Identity:
    key_name: str | None  # None: unauthenticated (no key configured)
    project: str


ANONYMOUS = Identity(None, DEFAULT_PROJECT)


class AuthFailed(Exception):
    pass


def bearer_token(header: bytes | None) -> bytes:
    """The token of a `Bearer` header; AuthFailed for a missing, malformed or empty one."""
    if header is None:
        raise AuthFailed("Missing API key: send `Authorization: Bearer <key>`.")
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthFailed("The Authorization header is not valid UTF-8.") from None
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise AuthFailed("The Authorization header must use the Bearer scheme.")
    token = token.strip()
    if not token:
        raise AuthFailed("The Authorization header holds an empty key.")
    return token.encode()


class Authenticator:
    def __init__(self, db: AsyncEngine, env_key: str | None) -> None:
        self.db = db
        self.env_key = env_key.encode() if env_key else None
        self._touched: dict[str, float] = {}
        # Keys are never deleted (only revoked), so once any exists authentication stays on; until
        # then the table is looked at again at most every KEYS_RECHECK_SECONDS.
        self._keys_exist = False
        self._checked_at = -KEYS_RECHECK_SECONDS

    async def required(self) -> bool:
        if self.env_key is not None or self._keys_exist:
            return True
        now = time.monotonic()
        if now - self._checked_at < KEYS_RECHECK_SECONDS:
            return False
        try:
            async with self.db.connect() as connection:
                self._keys_exist = await keys.any_key(connection)
        except Exception as exc:
            if not is_transient(exc):
                raise
            return False  # the store is away: as it was when last seen (start-up reads it while it is up)
        self._checked_at = now
        return self._keys_exist

    async def identify(self, header: bytes | None) -> Identity:
        if not await self.required():
            return ANONYMOUS
        token = bearer_token(header)
        if self.env_key is not None and hmac.compare_digest(token, self.env_key):
            return Identity(ENV_KEY_NAME, DEFAULT_PROJECT)
        async with self.db.connect() as connection:
            owner = await keys.find_key(connection, token)
        if owner is None:
            raise AuthFailed("Invalid API key.")
        await self._touch(owner.name)
        return Identity(owner.name, owner.project)

    async def _touch(self, name: str) -> None:
        now = time.time()
        if now - self._touched.get(name, 0.0) < TOUCH_INTERVAL_SECONDS:
            return
        self._touched[name] = now
        with contextlib.suppress(Exception):  # best effort: a busy store must not refuse the request
            async with self.db.begin() as connection:
                await keys.touch(connection, name, at=now)


class AuthMiddleware:
    """Authenticates `/v1/…`; health, readiness, metrics and the API description are open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        authenticator: Authenticator | None = getattr(scope["app"].state, "authenticator", None)
        if authenticator is None:  # lifespan not run: nothing to check against
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization")
        try:
            identity = await authenticator.identify(header)
        except AuthFailed as exc:
            response = JSONResponse(Unauthorized(str(exc)).body(), status_code=401)
            await response(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["project"], state["key_name"] = identity.project, identity.key_name
        await self.app(scope, receive, send)


def project_of(state: object) -> str:
    """The project of a request (its `request.state`); the default one where no key is configured."""
    return str(getattr(state, "project", DEFAULT_PROJECT))


def request_project(request: Request) -> str:
    """The project of the request's key, for every query a route makes (see read_models.owned);
    also tagged on the request's log lines."""
    project = project_of(request.state)
    project_var.set(project)
    return project
