"""How `mt serve` answers what it will not or cannot translate: every 4xx and 5xx of both APIs is
`{"error": MESSAGE}`, one line that says what was wrong and what to do. FastAPI's and Starlette's own refusals
(`{"detail": ...}`: unknown endpoints and methods, bodies they cannot parse, validation) are rewritten to that
shape, and an unexpected exception is a 500 `{"error": "internal error"}` whose traceback goes to the server's log.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from mt.errors import ApiError


def answer(status: int, message: str, headers: dict | None = None) -> Response:
    # json.dumps' ASCII escapes: a message that quotes the request may hold a lone surrogate, which UTF-8 cannot carry
    return Response(json.dumps({"error": message}), status, headers, media_type="application/json")


def unreadable(error: Exception) -> ApiError:
    """The answer to a JSON body that json.loads could not read."""
    if isinstance(error, RecursionError):
        return ApiError(400, "the body is nested too deeply to read: send a JSON object of the documented fields")
    if isinstance(error, UnicodeDecodeError):
        return ApiError(400, f"the body is not valid UTF-8 ({error.reason} at byte {error.start}): send JSON "
                             f"encoded as UTF-8")
    if isinstance(error, json.JSONDecodeError):
        return ApiError(400, f"the body is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})")
    # what else json.loads raises: a number of more than 4300 digits
    return ApiError(400, f"the body is not valid JSON ({str(error).split(';')[0]})")


def is_json(request: Request) -> bool:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return answer(error.status, error.message, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        problems = error.errors()
        for problem in problems:
            if problem.get("type") == "json_invalid":
                return answer(400, f"the body is not valid JSON ({problem.get('ctx', {}).get('error', '?')})")
        if not is_json(request):  # FastAPI reads a body of another type as bytes, which then fail validation
            return answer(415, f"the body must be JSON: send Content-Type: application/json, not "
                               f"{request.headers.get('content-type') or 'none'}")
        where = "; ".join(f"{'.'.join(str(x) for x in p['loc'][1:]) or 'body'}: {p['msg']}" for p in problems)
        return answer(422, where)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, error: HTTPException):
        method, path = request.method, request.url.path
        if error.status_code == 404:
            return answer(404, f"no endpoint {path}: the endpoints are listed at /docs")
        if error.status_code == 405:
            allowed = (error.headers or {}).get("Allow", "")
            return answer(405, f"{path} does not take {method}; it takes {allowed}", error.headers)
        if isinstance(error.__cause__, ApiError):  # raised while FastAPI read the body (mt/serve/limits.py)
            return answer(error.__cause__.status, error.__cause__.message, error.__cause__.headers)
        if isinstance(error.__cause__, ClientDisconnect):
            return answer(499, "the client closed the connection")
        if error.status_code == 400 and isinstance(error.__cause__, Exception):  # FastAPI could not read the body
            return answer(400, unreadable(error.__cause__).message)
        return answer(error.status_code, str(error.detail), error.headers)

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, error: ClientDisconnect):
        return answer(499, "the client closed the connection")  # nobody reads this; the log does

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception):
        # Starlette raises the error again once this is sent, and uvicorn logs its traceback
        return answer(500, "internal error")
