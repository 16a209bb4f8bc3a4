"""Standard Webhooks signatures, as OpenAI sends them and its SDKs verify (`client.webhooks.unwrap()`).

Headers: `webhook-id` (the delivery's id, the same on every retry), `webhook-timestamp` (unix seconds of this
attempt), `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`. The secret is `whsec_<base64>`
of 32 random bytes; the HMAC key is the decoded bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


def secret_hint(secret: str) -> str:
    """What `webhooks list` shows of a secret (OpenAI's `signing_secret_hint`)."""
    return secret[: len(SECRET_PREFIX) + 3] + "…" + secret[-4:]


def _key(secret: str) -> bytes:
    return base64.b64decode(secret[len(SECRET_PREFIX) :]) if secret.startswith(SECRET_PREFIX) else secret.encode()


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value."""
    mac = hmac.new(_key(secret), f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode("ascii")


def headers(secret: str, webhook_id: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    """Every header one attempt sends."""
    timestamp = int(time.time() if now is None else now)
    return {
        "content-type": "application/json",
        "user-agent": "responses-service-webhooks/1",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, webhook_id, timestamp, body),
    }
