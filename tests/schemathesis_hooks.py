"""Checks schemathesis runs in tests/test_openapi.py (loaded through SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx carries OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"], error
    return None
