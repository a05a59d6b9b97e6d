"""The overseer page's routes (Starlette): one server-rendered page, a JSON API, an SSE stream.

Every route is behind ``Guard`` (auth.py): the Host check and the access token on every
request, the CSRF token and Origin check on every state-changing one. Text is escaped by the
templates (Jinja2 autoescape) and by the page's script (which only ever sets ``textContent``),
so nothing an agent writes is ever run as markup or script.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from crossintercom.client import Marks
from crossintercom.errors import Code, CrossintercomError, UsageError
from crossintercom.models import PRIORITIES
from crossintercom.search_model import SearchQuery, search_terms
from crossintercom.timeparse import parse_since
from crossintercom.web.auth import CSRF_HEADER, Guard
from crossintercom.web.feedstore import KINDS, STATES, Filters
from crossintercom.web.overseer import FIRST_PAGE, Overseer

HERE = Path(__file__).parent
SAFE_METHODS = frozenset({"GET", "HEAD"})
FILTERS = ("host", "session", "thread", "state", "kind")
# Security headers on every answer: no framing, no sniffing, scripts only from this server.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

_templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


log = logging.getLogger(__name__)


class GuardMiddleware(BaseHTTPMiddleware):
    def __init__(self, app: Any, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        try:
            response = await self._check(request, call_next)
        except Exception:
            # Whatever a request could still break answers as every refusal does: JSON, with
            # the page's headers, the details in the log only.
            log.exception("request failed", extra={"path": request.url.path[:200]})
            response = _refuse(500, Code.INTERNAL, "the request failed; see the page's log")
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _check(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard = self.guard
        if not guard.host_ok(request.headers.get("host")):
            return _refuse(421, Code.UNKNOWN_HOST, "this server does not answer to that host name")
        if request.url.path == "/healthz":
            return PlainTextResponse("ok")  # for monitors: says nothing but that it runs
        given = request.query_params.get("token")
        if given is not None and request.method in SAFE_METHODS:
            if not guard.token_ok(given):
                return _refuse(401, Code.BAD_TOKEN, "wrong access token")
            # Trade the URL's token for a cookie and drop it from the address bar and history.
            back = RedirectResponse(request.url.remove_query_params("token"), status_code=303)
            back.set_cookie(guard.cookie, guard.token, httponly=True, samesite="strict", path="/")
            return back
        bearer = request.headers.get("authorization", "")
        cookie = request.cookies.get(guard.cookie)
        token = bearer[7:] if bearer.lower().startswith("bearer ") else cookie
        if not guard.token_ok(token):
            return _refuse(401, Code.BAD_TOKEN, "an access token is needed (printed at start)")
        if request.method not in SAFE_METHODS and not (
            guard.csrf_ok(request.headers.get(CSRF_HEADER))
            and guard.origin_ok(request.headers.get("origin"))
        ):
            return _refuse(403, Code.CSRF, "cross-site request refused")
        return await call_next(request)


def _refuse(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class BodyTooLarge(UsageError):
    """A request body over ``MAX_BODY_BYTES``: refused before it is read whole."""

    code = Code.TOO_LARGE


# A compose form holds one message (at most the store's 1 MiB by default, the broker's frame
# at most 8 MiB): anything longer is refused before it fills the page's memory.
MAX_BODY_BYTES = 9 * 1024 * 1024


def _error(exc: CrossintercomError) -> Response:
    status = 413 if isinstance(exc, BodyTooLarge) else 400 if isinstance(exc, UsageError) else 502
    body = {"error": {"code": exc.code, "message": exc.message}}
    return JSONResponse(body, status_code=status)


def build_app(overseer: Overseer, guard: Guard, *, manage_lifecycle: bool = True) -> Starlette:
    Handler = Callable[[Request], Awaitable[Response]]

    def api(fn: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await fn(request)
            except CrossintercomError as exc:
                return _error(exc)

        return run

    async def page(request: Request) -> Response:
        first = overseer.page(None, FIRST_PAGE, Filters())
        boot = {
            "feed": first["messages"],
            "before": first["before"],
            "roster": overseer.roster,
            "attention": overseer.attention,
        }
        html = _templates.get_template("index.html").render(
            me=overseer.name,
            host=overseer.settings.host_id,
            csrf=guard.csrf,
            roster=overseer.roster,
            archive=overseer.archive_on,
            states=STATES,
            kinds=KINDS,
            data=json.dumps(boot),
        )
        return HTMLResponse(html)

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            async for kind, data in overseer.subscribe():
                if await request.is_disconnected():
                    return
                yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        """200 while the page works; 503 while its own inbox fails (it recovers by itself)."""
        warnings = overseer.roster.get("warnings", [])
        error = overseer.inbox_trouble()
        if error is None:
            return JSONResponse({"ok": True, "warnings": warnings})
        body = {"error": {"code": error.code, "message": error.message}, "warnings": warnings}
        return JSONResponse(body, status_code=503)

    @api
    async def roster(request: Request) -> Response:
        return JSONResponse(overseer.roster)

    @api
    async def feed(request: Request) -> Response:
        """A page of the feed, newest first, older than ``before`` (a cursor from the last
        page), filtered by host, session, thread, state, kind."""
        args = request.query_params
        try:
            limit = min(max(int(args.get("limit") or FIRST_PAGE), 1), 500)
        except ValueError:
            raise UsageError("limit must be a number") from None
        filters = Filters(**{k: args.get(k) or None for k in FILTERS})
        return JSONResponse(overseer.page(args.get("before") or None, limit, filters))

    async def message_page(request: Request) -> Response:
        """One message on its own page: text, attachments, flags, every receipt."""
        m = overseer.message(request.path_params["message_id"])
        if m is None:
            return _refuse(404, Code.NOT_FOUND, "this page does not hold that message")
        return HTMLResponse(_templates.get_template("message.html").render(m=m))

    @api
    async def attention(request: Request) -> Response:
        return JSONResponse(overseer.attention)

    @api
    async def thread(request: Request) -> Response:
        return JSONResponse(await overseer.thread(request.path_params["thread_id"]))

    @api
    async def pending(request: Request) -> Response:
        return JSONResponse(await overseer.pending())

    @api
    async def dead(request: Request) -> Response:
        return JSONResponse(await overseer.dead_letters())

    @api
    async def inbound(request: Request) -> Response:
        return JSONResponse(await overseer.inbound())

    @api
    async def reserved(request: Request) -> Response:
        return JSONResponse(await overseer.reservations())

    @api
    async def search(request: Request) -> Response:
        return JSONResponse(await overseer.search(_search_query(request)))

    @api
    async def compose(request: Request) -> Response:
        form = await _json_body(request)
        mode = form.get("mode", "send")
        if mode not in ("send", "ask", "reply"):
            raise UsageError("mode must be send, ask or reply")
        try:
            timeout = float(form.get("timeout") or 60)
        except (TypeError, ValueError):
            raise UsageError("timeout must be a number of seconds") from None
        result = await overseer.compose(
            mode,
            _text(form, "message") or "",
            to=_text(form, "to"),
            subject=_text(form, "subject"),
            thread_id=_text(form, "thread_id"),
            reply_to=_text(form, "reply_to"),
            timeout=timeout,
            **marks_of(form),
        )
        return JSONResponse(result)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if manage_lifecycle:
            await overseer.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await overseer.stop()

    routes = [
        Route("/", page),
        Route("/events", events),
        Route("/api/roster", roster),
        Route("/api/feed", feed),
        Route("/api/thread/{thread_id:path}", thread),
        Route("/api/attention", attention),
        Route("/message/{message_id:path}", message_page),
        Route("/api/pending", pending),
        Route("/api/dead-letters", dead),
        Route("/api/inbound", inbound),
        Route("/api/reservations", reserved),
        Route("/api/search", search),
        Route("/api/compose", compose, methods=["POST"]),
        Route("/api/health", health),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes, middleware=[Middleware(GuardMiddleware, guard=guard)], lifespan=lifespan
    )


async def _json_body(request: Request) -> dict[str, Any]:
    if not request.headers.get("content-type", "").startswith("application/json"):
        raise UsageError("send the form as application/json")
    too_large = BodyTooLarge(f"the request body is over {MAX_BODY_BYTES} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_large
    try:
        body = json.loads(raw)
        # A lone surrogate ("\ud800") parses, and no frame can carry it.
        json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, RecursionError):
        raise UsageError("the request body is not JSON (nested too deep, or not Unicode)") from None
    if not isinstance(body, dict):
        raise UsageError("the request body must be a JSON object")
    return body


def marks_of(form: dict[str, Any]) -> Marks:
    """The compose form's priority and acknowledgement request (docs/delivery.md#priority)."""
    priority = _text(form, "priority") or "normal"
    for p in PRIORITIES:
        if p == priority:
            return Marks(priority=p, ack_required=form.get("ack_required") in (True, "1", "on"))
    raise UsageError(f"priority must be one of {', '.join(PRIORITIES)}")


def _text(form: dict[str, Any], key: str) -> str | None:
    value = form.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UsageError(f"{key} must be a string")
    return value


def _search_query(request: Request) -> SearchQuery:
    args = request.query_params
    text = args.get("q", "")
    if not search_terms(text):
        raise UsageError("the query has no words to search for")
    since: datetime | None = None
    if args.get("since"):
        try:
            since = parse_since(args["since"])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return SearchQuery(
        text,
        sender=args.get("from") or None,
        recipient=args.get("to") or None,
        host=args.get("host") or None,
        thread=args.get("thread") or None,
        since=since,
        limit=50,
    )
