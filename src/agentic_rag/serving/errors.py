"""The errors the chat server answers with, in OpenAI's shape.

Every failure of a request is an :class:`APIError` carrying the HTTP status, a reason and the offending parameter
when there is one, answered as::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

Kept apart from :mod:`.schema` so that the modules that check parts of a request (:mod:`.messages`,
:mod:`.client_tools`) can raise them without importing the request model.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered to the client: status, reason, and the offending parameter when there is one."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {401: "authentication_error", 404: "invalid_request_error",
                             429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500
                                                          else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400: what is wrong with the request, and where."""
    return APIError(400, message, param=param)
