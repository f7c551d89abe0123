"""Reading a request body: its size capped, JSON parsed and validated off the event loop, lone surrogates
refused.

A body over the cap (``serve --max-request-bytes``, :data:`DEFAULT_MAX_REQUEST_BYTES` = 1 MiB, about 8× the
text of a full 32k-token context; vLLM and llama-server leave it to their HTTP layer) is a 413
naming the limit. Its bytes are read to the end but not kept, so the kept-alive connection stays usable.

JSON may carry a lone UTF-16 surrogate (``"\\ud800"``): valid JSON, but not a Unicode string any tokenizer
or UTF-8 encoder accepts. :func:`parse_body` refuses it with a 400 naming the field (``messages.0.content``),
before anything else reads the body. Parsing and validation run in a worker thread, so a large body does
not stall other clients (``/health`` included).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from .args import DEFAULT_MAX_REQUEST_BYTES
from .errors import APIError

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "lone_surrogate_path", "parse_body", "read_body"]

M = TypeVar("M", bound=BaseModel)


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate_path(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The path (keys and list indices) of the first string in a parsed JSON value that holds a lone
    surrogate (a dict key counts as its value's place); None if there is none."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            if _has_surrogate(v):
                return p
        elif isinstance(v, dict):
            for k, x in reversed(list(v.items())):
                if _has_surrogate(k):
                    return (*p, k.encode("utf-8", "backslashreplace").decode("ascii"))
                stack.append((x, (*p, k)))
        elif isinstance(v, list):
            stack.extend((x, (*p, str(i))) for i, x in reversed(list(enumerate(v))))
    return None


def _parse(raw: bytes, model: type[M]) -> M:
    try:
        obj = json.loads(raw)
    except ValueError as e:  # not JSON, or not UTF-8
        raise APIError(400, f"the request body is not valid JSON: {e}", None, "invalid_json") from e
    where = lone_surrogate_path(obj)
    if where is not None:
        param = ".".join(where) or None
        raise APIError(400, f"{param or 'request body'}: contains a lone UTF-16 surrogate (\\ud800-\\udfff "
                            "without its pair), which is not a Unicode character; send valid UTF-16 pairs",
                       param, "invalid_unicode")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from e


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes (a larger one is drained and refused with a 413)."""
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0
    too_big = size > limit
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        too_big = too_big or received > limit
        if not too_big:
            chunks.append(chunk)
    if too_big:
        raise APIError(413, f"request body: {max(size, received)} bytes is over this server's limit of {limit} "
                            "bytes (--max-request-bytes); send a smaller body", None, "request_too_large")
    return b"".join(chunks)


async def parse_body(request: Request, model: type[M], limit: int) -> M:
    """The request's JSON body (at most ``limit`` bytes) validated as ``model``, parsed in a worker thread.

    Raises
    ------
    APIError
        413: over ``limit``. 400: not JSON, or a lone surrogate (``param``: where).
    RequestValidationError
        The body does not fit ``model`` (answered as a 400 naming the field, see :mod:`.errors`).
    """
    raw = await read_body(request, limit)
    return await asyncio.to_thread(_parse, raw, model)
