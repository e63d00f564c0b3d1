"""The gateway's ASGI app (Starlette, served by uvicorn): the routes of the three protocols, and the guard in front
of them (the Host header, the Origin, the API key, the body size)."""

from __future__ import annotations

import errno
import hmac
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..runtime import default as runtime
from . import anthropic, ollama, openai, responses
from .common import Refused, report
from .lifeline import Lifeline
from .state import DEFAULT_PORT, Gateway, Settings, is_loopback

log = logging.getLogger(__name__)
Handler = Callable[["Gateway", Request], Awaitable[Response]]


def _protocol(path: str) -> Callable[[BaseException], Response]:
    if path.startswith("/api/"):
        return ollama.error
    if path.startswith("/v1/messages"):
        return anthropic.error
    if path.startswith("/v1/responses"):
        return responses.error
    return openai.error


def _stream_error(scope: Scope, exc: BaseException) -> bytes:
    path = scope["path"]
    if path.startswith("/api/"):
        return ollama.stream_error(exc)
    if path.startswith("/v1/messages"):
        return anthropic.stream_error(exc)
    if path.startswith("/v1/responses"):  # numbered after the stream's last event
        out = scope.get(responses.SCOPE_KEY)
        return responses.stream_error(exc, out.seq if out is not None else 0)
    return openai.stream_error(exc)


class Guard:
    """In front of every route: a Host the gateway is not (DNS rebinding), an Origin not allowed (a web page),
    a missing or wrong API key, a body over ``max_body`` bytes are refused, in the protocol's error shape."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        port = settings.port
        loopback = ("127.0.0.1", "localhost", "[::1]")
        names = loopback if is_loopback(settings.host) else (settings.host if ":" not in settings.host else
                                                              f"[{settings.host}]", *loopback)
        self.hosts = None if settings.host in ("0.0.0.0", "::") else \
            {h.encode() for n in names for h in (n, f"{n}:{port}")}
        self.key = settings.api_key.encode() if settings.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            receive = self._check(scope, receive)
        except Refused as exc:
            await _protocol(scope["path"])(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope, receive: Receive) -> Receive:
        headers = dict(scope["headers"])
        if self.hosts is not None and headers.get(b"host") not in self.hosts:
            raise Refused(403, f"the Host {headers.get(b'host', b'').decode(errors='replace')!r} is not this "
                          "gateway's address (a DNS-rebinding page?); use the address it printed")
        origin = headers.get(b"origin")
        if origin is not None and origin.decode(errors="replace") not in self.settings.allow_origins \
                and "*" not in self.settings.allow_origins and scope["method"] != "OPTIONS":
            raise Refused(403, f"requests from the web page {origin.decode(errors='replace')!r} are refused: start "
                          "the gateway with --allow-origin ORIGIN to answer it")
        if self.key is not None:
            auth = headers.get(b"authorization", b"")
            given = auth[7:] if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
            if not hmac.compare_digest(given.strip(), self.key):
                raise Refused(401, "a missing or wrong API key: send it as `Authorization: Bearer KEY` or "
                              "`x-api-key: KEY` (the key is in the file given to --api-key-file)")
        length = headers.get(b"content-length")
        limit = self.settings.max_body
        if length is not None and length.isdigit() and int(length) > limit:
            raise Refused(413, f"the body is {int(length)} bytes; this gateway takes at most {limit} "
                          "(--max-body)")
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise Refused(413, f"the body is over {limit} bytes (--max-body)")
            return message

        return bounded


def _route(gw: Gateway, path: str, handler: Handler, error: Callable[[BaseException], Response],
           methods: tuple[str, ...] = ("POST",)) -> Route:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(gw, request)
        except Exception as exc:  # a bug is logged at ERROR with its traceback, and answered 500
            report(exc, f"{request.method} {path}")
            return error(exc)

    return Route(path, endpoint, methods=list(methods))


async def _root(gw: Gateway, request: Request) -> Response:
    return PlainTextResponse("gguf-provider gateway is running")


def create_app(settings: Settings) -> Starlette:
    """The gateway's ASGI app."""
    gw = Gateway(settings)
    o, a, ol, r = openai.error, anthropic.error, ollama.error, responses.error
    routes = [
        _route(gw, "/", _root, o, ("GET", "HEAD")),
        _route(gw, "/v1/chat/completions", openai.chat_completions, o),
        _route(gw, "/v1/completions", openai.completions, o),
        _route(gw, "/v1/embeddings", openai.embeddings, o),
        _route(gw, "/v1/rerank", openai.rerank, o),
        _route(gw, "/v1/models", openai.models, o, ("GET",)),
        _route(gw, "/v1/responses", responses.create, r),
        _route(gw, "/v1/responses/{id}", responses.retrieve, r, ("GET",)),
        _route(gw, "/v1/responses/{id}/input_items", responses.list_input_items, r, ("GET",)),
        _route(gw, "/v1/responses/{id}", responses.delete, r, ("DELETE",)),
        _route(gw, "/v1/messages", anthropic.create, a),
        _route(gw, "/v1/messages/count_tokens", anthropic.count_tokens, a),
        _route(gw, "/api/chat", ollama.chat_, ol),
        _route(gw, "/api/generate", ollama.generate, ol),
        _route(gw, "/api/embed", ollama.embed, ol),
        _route(gw, "/api/embeddings", ollama.embed, ol),
        _route(gw, "/api/tags", ollama.tags, ol, ("GET",)),
        _route(gw, "/api/show", ollama.show, ol),
        _route(gw, "/api/ps", ollama.ps, ol, ("GET",)),
        _route(gw, "/api/version", ollama.version, ol, ("GET",)),
        _route(gw, "/api/pull", ollama.pull, ol),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await gw.pool.close()

    middleware = [Middleware(Guard, settings=settings)]
    if settings.allow_origins:
        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=list(settings.allow_origins),
                                        allow_methods=["GET", "POST", "DELETE", "OPTIONS"], allow_headers=["*"]))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.gateway = gw
    return app


class App:
    """The gateway's app inside its :class:`~.lifeline.Lifeline`: ``stop()`` ends the requests in flight."""

    def __init__(self, settings: Settings) -> None:
        self.inner = create_app(settings)
        self.line = Lifeline(self.inner, lambda path, exc: _protocol(path)(exc), _stream_error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.line(scope, receive, send)

    def stop(self) -> None:
        self.line.stop()


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one), bound before anything is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say so, and with Nagle on each
    # streamed chunk waited for the client's delayed ACK (+40 ms to the first token, measured)
    if not 0 <= port <= 65535:
        raise ValueError(f"port={port}: pass a port from 0 to 65535 (0: a free one)")
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}"
                         + ("; a gateway may already run there (`gguf-provider ps` lists them), or pick another "
                            "port with port=N" if exc.errno == errno.EADDRINUSE else "")) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket, host: str) -> str:
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def read_key_file(path: str) -> str:
    """The API key in ``path`` (its first line), refusing a file others can read."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"the API key file {path}: {exc.strerror}; write the key in it (one line, chmod 600)") from None
    if st.st_mode & 0o077:
        raise ValueError(f"{path} can be read by others (mode {oct(st.st_mode & 0o777)}): chmod 600 {path}")
    with open(path) as f:
        key = f.readline().strip()
    if not key:
        raise ValueError(f"{path} holds no key")
    return key


def serve(settings: Settings, *, on_ready: Callable[[str], None] | None = None) -> None:
    """Run the gateway in the foreground until SIGINT, SIGTERM or SIGHUP; every lease it holds is given back."""
    import signal

    import uvicorn

    sock = bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    if settings.port == 0:
        settings = Settings(**{**settings.__dict__, "port": port})
    app = App(settings)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            app.stop()  # the requests in flight end now (each cancelled, answered in its protocol's shape)
            await super().shutdown(sockets)

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                            timeout_keep_alive=30)
    server = Server(config)
    signal.signal(signal.SIGHUP, lambda *_: server.handle_exit(signal.SIGTERM, None))

    def stopped(*_: object) -> None:
        raise _Stopped

    # uvicorn raises the signal it stopped for again once it has put the handlers back: with SIGTERM's default one
    # the process died there, before the record below was removed. Ours ends serve() after it is.
    signal.signal(signal.SIGTERM, stopped)
    address = url(sock, settings.host)
    n_ctx = settings.server_options.get("n_ctx")
    try:
        with runtime().gateway(address, key_file=settings.key_file, n_ctx=n_ctx if isinstance(n_ctx, int) else None):
            if on_ready is not None:
                on_ready(address)
            server.run(sockets=[sock])
    except _Stopped:
        pass


class _Stopped(Exception):
    """SIGTERM, raised again by uvicorn after its shutdown."""


__all__ = ["DEFAULT_PORT", "App", "Gateway", "Settings", "create_app", "read_key_file", "serve"]

