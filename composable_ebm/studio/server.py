"""Serving the page: only to the hosts and the origin it was started for, no uploads (`HostGuard`, `launch`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composable_ebm.errors import InvalidInputError
from composable_ebm.studio.layout import CSS, build_app


MAX_UPLOAD_BYTES = 1
"""Gradio's own bound on an uploaded file: the studio takes none (`HostGuard` refuses the upload route first)."""


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> frozenset[str]:
    """The host names the studio answers to: the one it serves on, the loopback names, and ``extra``."""
    names = {host.strip("[]").lower(), *LOOPBACK_NAMES, *(h.strip("[]").lower() for h in extra)}
    return frozenset(names - {"0.0.0.0", "::"})


def _hostname(value: str) -> str:
    """The host part of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL or origin, lower case (``http://Studio.lan:7860/x`` -> ``http://studio.lan:7860``);
    one line for anything that is not an http(s) origin."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(f"{url!r} is not an origin; write scheme://host[:port], e.g. http://studio.lan:7860")
    return f"{parts.scheme}://{parts.netloc.lower()}"


class HostGuard:
    """ASGI middleware that answers 403 to what a page elsewhere could send the studio:

    - a ``Host`` the studio was not started for (`allowed_hosts`): a page whose name resolves to 127.0.0.1 (DNS
      rebinding);
    - another origin: an ``Origin`` that is not the studio's own (the scheme, host and port the request was sent
      to) nor one allowed by name (``--allowed-origin``). ``Origin: null`` (sandboxed frames, ``data:`` and ``file:``
      pages) and a page on another port of the same host are other origins. A request without ``Origin`` whose
      ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site`` is refused too;
    - an upload (Gradio's upload route, or any ``multipart/form-data`` body): the studio takes no files.
    """

    def __init__(self, app: Any, allowed: frozenset[str], origins: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.allowed = allowed
        self.origins = origins

    def problem(self, scope: dict) -> str | None:
        """Why a request is refused, ``None`` to serve it."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if _hostname(host) not in self.allowed:
            return (f"Host {host!r} is not a host this studio was started for ({', '.join(sorted(self.allowed))});"
                    " start it with --allowed-host NAME to add one")
        origin = headers.get("origin")
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        own = f"{scheme}://{host.strip().lower()}"
        if origin is not None and origin.strip().lower() not in {own, *self.origins}:
            return (f"Origin {origin!r} is another origin than this studio's ({own}); start it with --allowed-origin"
                    " URL to allow one")
        site = headers.get("sec-fetch-site", "").lower()
        if origin is None and site in ("cross-site", "same-site"):
            return f"a {site} request (Sec-Fetch-Site) without an Origin the studio allows"
        path = scope.get("path", "")
        if path.rstrip("/").rsplit("/", 1)[-1].startswith("upload") or \
                headers.get("content-type", "").lower().startswith("multipart/"):
            return "an upload: the studio takes no files"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = self.problem(scope)
            if problem is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                body = f"forbidden: {problem}\n".encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def launch(host: str = "127.0.0.1", port: int | None = None, device: str = "cpu",
           allowed_host: Sequence[str] = (), allowed_origin: Sequence[str] = (),
           models_root: str | Path | None = None, **kwargs: Any) -> Any:
    """Serve the studio (blocking unless ``prevent_thread_lock=True``): analytics off, fonts from the app, one request
    at a time in a queue, only to the hosts it was started for (`allowed_hosts`; ``allowed_host`` adds names) and to
    pages of its own origin (``allowed_origin`` adds origins by name, `HostGuard`), no uploads, and only the models
    `studio_loader` serves (``models_root``: the folder whose model folders it may load)."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr
    from starlette.middleware import Middleware

    if models_root is not None and not Path(models_root).expanduser().is_dir():
        raise InvalidInputError(f"--models-root {models_root} is not a folder; name the folder whose model folders"
                                " the studio may load")
    origins = frozenset(origin_of(o) for o in allowed_origin)
    app = build_app(device, models_root=models_root)
    app.queue(default_concurrency_limit=1)
    guard = Middleware(HostGuard, allowed=allowed_hosts(host, allowed_host), origins=origins)
    block = not kwargs.pop("prevent_thread_lock", False)
    app.launch(server_name=host, server_port=port, theme=gr.themes.Default(), css=CSS, share=False,
               show_error=False, ssr_mode=False, max_file_size=MAX_UPLOAD_BYTES,
               app_kwargs={"middleware": [guard]}, prevent_thread_lock=True, **kwargs)
    _outermost(app.server_app, guard)
    if block:
        app.block_thread()
    return app


def _outermost(server: Any, guard: Any) -> None:
    """Put ``guard`` outside Gradio's own middleware, whose CORS layer would otherwise let a page on another
    localhost port read even the guard's refusals: the server rebuilds its stack on its next request."""
    server.user_middleware.remove(guard)
    server.user_middleware.insert(0, guard)
    server.middleware_stack = None
