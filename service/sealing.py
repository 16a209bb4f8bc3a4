"""Authenticated encryption of reasoning for stateless clients (`include: ["reasoning.encrypted_content"]`).

A reasoning item's `encrypted_content` is `base64url(version | key id | nonce | AES-GCM(plaintext))`:
- the key is derived with HKDF-SHA256 from SERVICE_SECRET_KEY when set, else from the random key stored once
  in the database (`server_keys`, the same material compaction uses), under its own purpose label;
- the key id (4 bytes of a hash of the derived key) lets a blob sealed under a rotated key be refused
  as such instead of as a forgery;
- the project is the associated data: another project's blob does not open;
- the plaintext is JSON `{"id", "text": [reasoning_text parts]}`, enough to rebuild the item.
The nonce is random, so the same item seals differently each time: sealing happens at the HTTP edge
(service/http/include_view.py), never in logged events, which replay byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from service.errors import InvalidRequest

VERSION = 1
PURPOSE = b"responses-service reasoning.encrypted_content v1"
_KEY_ID_BYTES = 4
_NONCE_BYTES = 12
_HEADER = 1 + _KEY_ID_BYTES


class Sealer:
    """Seals and opens reasoning items under one derived key."""

    def __init__(self, material: bytes) -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE).derive(material)
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"key-id\0" + key).digest()[:_KEY_ID_BYTES]

    @classmethod
    def from_settings(cls, secret_key: str | None, stored: bytes) -> Sealer:
        """SERVICE_SECRET_KEY when set, else the database's stored random key."""
        return cls(secret_key.encode() if secret_key else stored)

    def _aad(self, project: str) -> bytes:
        return bytes([VERSION]) + self.key_id + b"\0" + project.encode()

    def seal(self, item: dict[str, Any], *, project: str) -> str:
        """The `encrypted_content` of a reasoning item, bound to `project`."""
        texts = [part.get("text", "") for part in item.get("content") or [] if isinstance(part, dict)]
        plaintext = json.dumps({"id": item.get("id"), "text": texts}, separators=(",", ":")).encode()
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, plaintext, self._aad(project))
        blob = bytes([VERSION]) + self.key_id + nonce + sealed
        return base64.urlsafe_b64encode(blob).decode("ascii").rstrip("=")

    def open(self, blob: object, *, project: str, param: str) -> dict[str, Any]:
        """`{"id", "text"}` of a sealed reasoning item; a forged, altered, other project's or rotated-key
        blob is a 400 `invalid_encrypted_content` naming `param`."""
        if not isinstance(blob, str) or not blob.isascii():
            raise _invalid(param, "it must be the string this server returned.")
        try:
            raw = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
        except (binascii.Error, ValueError):
            raise _invalid(param, "it is not base64url text this server produced.") from None
        if len(raw) < _HEADER + _NONCE_BYTES + 16 or raw[0] != VERSION:
            raise _invalid(param, "it was not produced by this server (unknown format or version).")
        if raw[1:_HEADER] != self.key_id:
            raise _invalid(param, "it was sealed under a server key this server no longer has (the key was rotated).")
        nonce, sealed = raw[_HEADER : _HEADER + _NONCE_BYTES], raw[_HEADER + _NONCE_BYTES :]
        try:
            payload = json.loads(self._aead.decrypt(nonce, sealed, self._aad(project)))
        except (InvalidTag, ValueError):
            raise _invalid(param, "it was altered, or was sealed for another project.") from None
        texts = payload.get("text") if isinstance(payload, dict) else None
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise _invalid(param, "its content is not a reasoning item.")
        item_id = payload.get("id")
        return {"id": item_id if isinstance(item_id, str) else None, "text": texts}


def _invalid(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"The reasoning item's encrypted_content cannot be opened: {why}", param=param, code="invalid_encrypted_content"
    )


def open_input(body: object, sealer: Sealer, *, project: str) -> object:
    """The request body with each reasoning input item's `encrypted_content` opened into its `content`
    (the sealed text wins over any `content` sent beside it), so the prompt shows the model's own earlier
    reasoning exactly as a stored chain would; bodies without such items are returned as they are."""
    if not isinstance(body, dict) or not isinstance(body.get("input"), list):
        return body
    if not any(is_sealed_reasoning(item) for item in body["input"]):
        return body
    opened: list[Any] = []
    for index, item in enumerate(body["input"]):
        if not is_sealed_reasoning(item):
            opened.append(item)
            continue
        plain = sealer.open(item["encrypted_content"], project=project, param=f"input[{index}].encrypted_content")
        item = {key: value for key, value in item.items() if key != "encrypted_content"}
        item["content"] = [{"type": "reasoning_text", "text": text} for text in plain["text"]]
        if item.get("id") is None and plain["id"] is not None:
            item["id"] = plain["id"]
        opened.append(item)
    return {**body, "input": opened}


def is_sealed_reasoning(item: object) -> bool:
    """A reasoning input item carrying `encrypted_content`."""
    return isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content") is not None
