"""Errors raised inside the service; the HTTP edge maps them once to OpenAI's error shape."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


class InvalidRequest(ApiError):
    pass


class FailedDependency(ApiError):
    """An external service the request cannot go on without failed (OpenAI: an MCP server not listed)."""

    status_code = 424
    error_type = "external_connector_error"


class NotFound(ApiError):
    status_code = 404

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="not_found")


class PayloadTooLarge(ApiError):
    status_code = 413

    def __init__(self, message: str) -> None:
        super().__init__(message, code="payload_too_large")


class UnsupportedMediaType(ApiError):
    status_code = 415

    def __init__(self, message: str) -> None:
        super().__init__(message, code="unsupported_media_type")


class MethodNotAllowed(ApiError):
    status_code = 405

    def __init__(self, message: str, *, allow: list[str]) -> None:
        super().__init__(message, code="method_not_allowed")
        self.allow = allow


class Unauthorized(ApiError):
    status_code = 401
    error_type = "authentication_error"

    def __init__(self, message: str = "Invalid or missing API key.") -> None:
        super().__init__(message, code="invalid_api_key")


class ServerError(ApiError):
    status_code = 500
    error_type = "server_error"


class ShuttingDown(ApiError):
    status_code = 503
    error_type = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="shutting_down")


class StoreUnavailable(ApiError):
    status_code = 503
    error_type = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="store_unavailable")
