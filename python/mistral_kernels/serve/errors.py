"""OpenAI-format errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status.

Every failure a client can cause ends here as a JSON error; the server stays up. An unexpected exception is
logged and answered as a JSON 500 too (:class:`_CatchAll`): it never reaches uvicorn, which would close the
kept-alive connection under the client's next request. Validation errors of the
request body name the field (``param``), e.g. ``temperature``, ``messages.0.role`` or ``top_p``. Field types
are strict, as the OpenAI API's: ``"2"`` is not an integer, ``"yes"`` or ``1`` not a boolean, ``true`` not
an integer (an integer is a number, though: ``temperature: 1`` is fine). A field the server does not know is
refused, named (``extra_forbidden``; the accepted-and-ignored ones are listed in :mod:`.protocol`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["APIError", "error_body", "install_error_handlers"]

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable_error",
          500: "internal_server_error"}


class APIError(Exception):
    """An error answered to the client as-is."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


def _respond(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), status_code=e.status)


def _field(loc: Sequence[Any]) -> str | None:
    """("body", "messages", 0, "role") → "messages.0.role"; pydantic's union branch names are dropped."""
    parts = [str(p) for p in loc[1:] if not (isinstance(p, str) and ("[" in p or p in {"str", "int", "list"}))]
    return ".".join(parts) or None


def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return _respond(APIError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
                                 .rstrip(": "), None, "invalid_json"))
    param = _field(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        msg = "field required"
    elif first.get("type") == "extra_forbidden":
        msg = ("unknown field: this server does not support it, and refuses it rather than ignore it (see the "
               "README's accepted-fields table)")
    elif first.get("type") == "value_error":
        msg = msg.removeprefix("Value error, ")
    elif isinstance(first.get("input"), (bool, int, float, str)) and len(str(first.get("input"))) <= 40:
        msg += f" (got {json.dumps(first['input'])})"
    text = f"{param}: {msg}" if param else f"request body: {msg} (send a JSON object)"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem(s))"
    return _respond(APIError(400, text, param, first.get("type")))


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return _respond(APIError(exc.status_code, str(exc.detail)))


def _api(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return _respond(exc)


class _CatchAll:
    """ASGI middleware: an exception no handler took becomes a logged JSON 500 (if the response has not
    started; otherwise the response is cut where it was), and is not re-raised."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as e:  # noqa: BLE001 - every failure is answered, none closes the connection
            logging.getLogger("mistral_kernels.serve").exception("error serving %s", scope.get("path"))
            if not started:
                await _respond(APIError(500, f"internal error: {type(e).__name__}: {e}"))(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    app.add_middleware(_CatchAll)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(APIError, _api)
