"""MCP `headers` / `authorization`: kept out of everything stored, or sealed with the server's key.

A request's tool specs are logged without their secrets (`redact`); a background run, which must be able
to call the MCP server again after a crash, stores them sealed (`seal`) with SERVICE_SECRET_KEY
(Fernet: AES-128-CBC + HMAC-SHA256). Without a key such a request is refused (`SecretsNeedKey`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

SECRET_FIELDS = ("headers", "authorization")


class SecretsNeedKey(ValueError):
    """A background request carries MCP secrets, and this server has no SERVICE_SECRET_KEY to keep them."""


class SecretsUnreadable(ValueError):
    """Sealed secrets could not be opened (the key changed, or the data was altered)."""


def has_secrets(tool: Mapping[str, Any]) -> bool:
    return any(tool.get(name) for name in SECRET_FIELDS)


def redact(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool spec as it may be stored and shown: secrets removed."""
    return {key: value for key, value in tool.items() if key not in SECRET_FIELDS}


def request_headers(tool: Mapping[str, Any]) -> dict[str, str]:
    """The HTTP headers an MCP call sends: `headers`, plus `authorization` as a bearer token."""
    headers = {str(k): str(v) for k, v in (tool.get("headers") or {}).items()}
    token = tool.get("authorization")
    if token:
        headers["Authorization"] = token if token.lower().startswith(("bearer ", "basic ")) else f"Bearer {token}"
    return headers


REDACTED = "[redacted]"
_SCHEMES = ("bearer ", "basic ", "token ")
MIN_REDACTED_CHARS = 3  # shorter values are not secrets worth garbling every message for


def secret_variants(value: str) -> set[str]:
    """The forms a header value can take inside an error text: as sent, stripped, without its auth scheme,
    and escaped as Python (str or bytes repr), JSON or percent-encoding would print it."""
    from urllib.parse import quote

    forms = {value, value.strip()}
    for form in list(forms):
        if form.lower().startswith(_SCHEMES):
            forms.add(form.split(" ", 1)[1].strip())
    for form in list(forms):
        forms.update(
            {
                repr(form)[1:-1],
                repr(form.encode("utf-8", "replace"))[2:-1],
                json.dumps(form)[1:-1],
                quote(form, safe=""),
            }
        )
    return {form for form in forms if len(form) >= MIN_REDACTED_CHARS}


def redact_text(text: str, values: Iterable[str]) -> str:
    """`text` with every form (`secret_variants`) of the given secret values replaced by `[redacted]`, the
    longest first so that a part of a secret never survives beside its replacement."""
    forms = sorted({form for value in values for form in secret_variants(str(value))}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, REDACTED)
    return text


def new_key() -> str:
    return Fernet.generate_key().decode("ascii")


def seal(key: str | None, tool: Mapping[str, Any]) -> str:
    """Encrypt a tool's secrets for storage; raises SecretsNeedKey without a key."""
    if not key:
        raise SecretsNeedKey(
            "This MCP tool carries 'headers' or 'authorization', which a background response must keep to "
            "resume after a restart, and this server has no SERVICE_SECRET_KEY to keep them encrypted. "
            "Use background=false, or ask the operator to set SERVICE_SECRET_KEY."
        )
    plain = json.dumps({name: tool.get(name) for name in SECRET_FIELDS if tool.get(name)})
    return _fernet(key).encrypt(plain.encode()).decode("ascii")


def unseal(key: str | None, sealed: str) -> dict[str, Any]:
    if not key:
        raise SecretsUnreadable("SERVICE_SECRET_KEY is not set; sealed MCP secrets cannot be opened.")
    try:
        opened: dict[str, Any] = json.loads(_fernet(key).decrypt(sealed.encode("ascii")))
    except (InvalidToken, ValueError) as exc:
        raise SecretsUnreadable("Sealed MCP secrets could not be opened with SERVICE_SECRET_KEY.") from exc
    return opened


def _fernet(key: str) -> Fernet:
    try:
        return Fernet(key.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise SecretsUnreadable(
            "SERVICE_SECRET_KEY must be a Fernet key: 32 bytes in urlsafe base64 "
            "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')."
        ) from exc
