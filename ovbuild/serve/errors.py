"""Every error the server answers, in OpenAI's shape {"error": {"message", "type", "param", "code"}}: a refused
field (400), an unknown model or path (404), a wrong method (405), a full server (503 with Retry-After), and any
failure of the server itself (500), which never closes the client's keep-alive connection."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ovbuild.errors import ImageError, OverloadedError, RequestError
from ovbuild.serve.protocol import error_body

log = logging.getLogger("ovbuild.serve")

# Seconds a 503 asks a client to wait before it retries: a running batch frees its slots within a few steps.
RETRY_AFTER_S = 1

# Starlette's HTTP errors as OpenAI names their types.
_HTTP_TYPES = {404: "not_found_error", 405: "invalid_request_error"}


class ModelNotFoundError(RequestError):
    """A request names a model this server does not serve (a 404 `model_not_found`, as OpenAI and vLLM answer)."""


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers and the middleware that keeps a failure a 500 body on an open connection."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return error_response(400, *validation_message(exc.errors()), "invalid_request_error")

    @app.exception_handler(ModelNotFoundError)
    async def unknown_model(request: Request, exc: ModelNotFoundError):
        return error_response(404, str(exc), exc.param, "invalid_request_error", "model_not_found")

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError):
        return error_response(400, str(exc), exc.param, "invalid_request_error")

    @app.exception_handler(ImageError)
    async def bad_image(request: Request, exc: ImageError):  # an image a request sent: the request's fault
        return error_response(400, str(exc), "messages", "invalid_request_error")

    @app.exception_handler(OverloadedError)
    async def overloaded(request: Request, exc: OverloadedError):
        answer = error_response(503, str(exc), None, "service_unavailable_error", "overloaded")
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
        return answer

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        message = f"{request.method} {request.url.path}: {exc.detail}"
        answer = error_response(exc.status_code, message, None, _HTTP_TYPES.get(exc.status_code, "server_error"))
        for name, value in (exc.headers or {}).items():  # a 405's Allow
            answer.headers[name] = value
        return answer

    app.add_middleware(_ServerErrors)


def error_response(status: int, message: str, param: str | None, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """(message, param) of a request body pydantic refused: the first error's field and reason; a body that is not
    JSON says so, with the position of the fault."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "invalid JSON")
        return f"the request body is not valid JSON ({reason} at character {loc[0] if loc else '?'})", None
    return f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}", loc[0] if loc else None


class _ServerErrors:
    """ASGI middleware: an exception no handler took becomes a 500 in OpenAI's shape. Starlette's own last resort
    re-raises after its 500, and uvicorn then closes the connection: a keep-alive client's next request would fail
    with 'connection reset'. After the response has started (a stream) the exception is only logged."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as e:
            log.exception("request failed: %s %s", scope.get("method"), scope.get("path"))
            if not started:
                answer = error_response(500, f"internal server error ({type(e).__name__}: {e})", None, "server_error")
                await answer(scope, receive, send)
