"""Images and audio in chat messages on their way to llama-server: one place for every adapter and the magics.

The adapters translate their frameworks' image blocks into OpenAI ``image_url`` parts (and audio into
``input_audio`` parts); :meth:`Engine.prepare <gguf_provider.engine.Engine.prepare>` hands every payload to
:func:`prepare` (sync) or :func:`aprepare` (async) before the request is sent:

* A part that needs a modality the server's model lacks (``/props`` → ``modalities``: ``vision``, ``audio``)
  raises :class:`~gguf_provider.errors.UnsupportedInputError` before the request. Without this check llama-server
  answers HTTP 500 "image input is not supported - hint: if this is unexpected, you may need to provide the
  mmproj".
* ``http://`` and ``https://`` image URLs are fetched here (httpx: redirects followed, at most
  :data:`MAX_IMAGE_BYTES`, :data:`FETCH_TIMEOUT` seconds in all, an ``image/*`` content type) and inlined as
  base64 ``data:`` URIs; any failure is a :class:`~gguf_provider.errors.MediaFetchError` naming the URL. Why here:
  our llama-server build fetches a plain ``http://`` URL itself but answers an ``https://`` one with HTTP 500
  "HTTPS is not supported. Please rebuild with one of: -DLLAMA_BUILD_BORINGSSL=ON ..." (it is built without TLS),
  and a server we attach to need not reach the URLs its caller can. ``data:`` URIs pass through unchanged.
* :func:`text_only` drops the media parts for prompt counting (apply-template + tokenize): llama-server puts a
  random marker string where an image goes, and an image's own tokens are known only to the server (its usage).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from .errors import MediaFetchError, UnsupportedInputError

MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image fetched from a URL (bytes, before base64)."""
FETCH_TIMEOUT = 30.0
"""Seconds a URL fetch may take in all (connect, redirects and body)."""
MAX_REDIRECTS = 5
MEDIA_PART_BOUND = 4096
"""Tokens one media part may stand for in the engine's cheap "surely fits" bound (an image is 16 to a few thousand
tokens, depending on the projector and the image size)."""

# OpenAI content part type → the llama-server modality it needs.
PART_MODALITY = {"image_url": "vision", "input_audio": "audio"}
_USER_AGENT = "gguf-provider (image fetch)"
_OCTET = ("", "application/octet-stream", "binary/octet-stream")
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
          (b"GIF89a", "image/gif"), (b"BM", "image/bmp"))

# --- what the server can take ------------------------------------------------------------------------------------


def modalities(props: Mapping[str, Any]) -> dict[str, bool]:
    """The input modalities a llama-server's ``/props`` reports (``{"vision": True, "audio": False, ...}``); empty
    for a build too old to say, which also predates its multimodal support."""
    raw = props.get("modalities")
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): bool(v) for k, v in raw.items()}


def _parts(messages: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(messages, Sequence):
        return
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            yield from (p for p in content if isinstance(p, dict))


def media_parts(messages: Any) -> int:
    """How many image and audio parts the OpenAI-format ``messages`` hold."""
    return sum(1 for p in _parts(messages) if p.get("type") in PART_MODALITY)


def check(messages: Any, available: Mapping[str, bool], *, model: str) -> None:
    """Raise :class:`UnsupportedInputError` for the first part whose modality the server lacks."""
    for part in _parts(messages):
        need = PART_MODALITY.get(str(part.get("type")))
        if need is None or available.get(need):
            continue
        have = ", ".join(k for k, v in available.items() if v) or "text only"
        if need == "vision":
            hint = ("load it with vision=True (the mmproj file beside the model or in its Hugging Face repo) or "
                    "mmproj='path/to/mmproj.gguf', or use a vision model such as ggml-org/gemma-3-4b-it-GGUF with "
                    "vision=True (an attached server needs --mmproj)")
            what = "an image"
        else:
            hint = ("load a model that takes audio with its audio mmproj (vision=True or mmproj=...; an attached "
                    "server needs --mmproj)")
            what = "audio"
        raise UnsupportedInputError(
            f"the message has {what} but {model} was loaded without a projector for it (llama-server's "
            f"modalities: {have}): {hint}", need)


# --- URLs --------------------------------------------------------------------------------------------------------


def _url_of(part: Mapping[str, Any]) -> str | None:
    if part.get("type") != "image_url":
        return None
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, Mapping) else value
    return url if isinstance(url, str) else None


def remote_urls(messages: Any) -> list[str]:
    """The distinct ``http(s)`` image URLs in ``messages``, in order. Any other scheme but ``data:`` is refused
    with :class:`MediaFetchError` (llama-server reads no local files)."""
    urls: list[str] = []
    for part in _parts(messages):
        url = _url_of(part)
        if url is None or url.startswith("data:"):
            continue
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme not in ("http", "https"):
            raise MediaFetchError(
                f"image URL {_short(url)} is neither http(s) nor a data: URI: give an http(s) URL, a "
                f"data:image/...;base64 URI, or the image's bytes (e.g. LangChain's {{'type': 'image', 'base64': "
                f"..., 'mime_type': ...}}, LlamaIndex's ImageBlock(path=...))", url)
        if url not in urls:
            urls.append(url)
    return urls


def inline(messages: list[dict[str, Any]], fetched: Mapping[str, str]) -> list[dict[str, Any]]:
    """``messages`` with each fetched URL replaced by its data URI (changed messages are copies)."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list) and any(_url_of(p) in fetched for p in content if isinstance(p, dict)):
            parts = []
            for p in content:
                url = _url_of(p) if isinstance(p, dict) else None
                if url is not None and url in fetched:
                    value = p["image_url"]
                    p = {**p, "image_url": {**value, "url": fetched[url]} if isinstance(value, Mapping)
                         else {"url": fetched[url]}}
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out


def _short(url: str) -> str:
    return url if len(url) <= 200 else url[:200] + "…"


def _content_type(url: str, r: httpx.Response, max_bytes: int) -> str:
    """The response's image MIME type ('' to sniff from the bytes); MediaFetchError for a bad status, a declared
    size over the limit, or a type that is not an image."""
    if r.status_code >= 400:
        raise MediaFetchError(f"fetching the image {_short(url)} failed: HTTP {r.status_code} "
                              f"{r.reason_phrase}".rstrip(), url, r.status_code)
    length = r.headers.get("content-length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise MediaFetchError(f"the image at {_short(url)} is {int(length)} bytes, over the {max_bytes}-byte limit: "
                              f"resize it, or pass it as base64 data", url, r.status_code)
    mime = str(r.headers.get("content-type", "")).split(";", 1)[0].strip().lower()
    if mime.startswith("image/"):
        return mime
    if mime in _OCTET:
        return ""
    raise MediaFetchError(f"{_short(url)} is not an image: its content type is {mime!r}", url, r.status_code)


def _too_large(url: str, max_bytes: int) -> MediaFetchError:
    return MediaFetchError(f"the image at {_short(url)} is over the {max_bytes}-byte limit: resize it, or pass it as "
                           f"base64 data", url)


def _data_uri(url: str, mime: str, body: bytes) -> str:
    if not mime:
        mime = next((m for magic, m in _MAGIC if body.startswith(magic)), "")
        if not mime and body[:4] == b"RIFF" and body[8:12] == b"WEBP":
            mime = "image/webp"
        if not mime:
            raise MediaFetchError(f"{_short(url)} is not an image: no image content type, and its bytes are no "
                                  f"PNG, JPEG, GIF, BMP or WebP", url)
    if not body:
        raise MediaFetchError(f"the image at {_short(url)} is empty", url)
    return f"data:{mime};base64,{base64.b64encode(body).decode('ascii')}"


def _failure(url: str, exc: httpx.HTTPError) -> MediaFetchError:
    if isinstance(exc, httpx.TimeoutException):
        return MediaFetchError(f"fetching the image {_short(url)} timed out", url)
    if isinstance(exc, httpx.TooManyRedirects):
        return MediaFetchError(f"fetching the image {_short(url)}: more than {MAX_REDIRECTS} redirects", url)
    return MediaFetchError(f"could not fetch the image {_short(url)}: {type(exc).__name__}: {exc}", url)


def _client_kwargs(timeout: float) -> dict[str, Any]:
    return {"follow_redirects": True, "max_redirects": MAX_REDIRECTS, "timeout": timeout,
            "headers": {"User-Agent": _USER_AGENT, "Accept": "image/*"}}


class _Body:
    """A download's bytes, refused past ``max_bytes`` or past the deadline (one total time, however it trickles)."""

    def __init__(self, url: str, max_bytes: int, deadline: float) -> None:
        self.url, self.max_bytes, self.deadline = url, max_bytes, deadline
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.max_bytes:
            raise _too_large(self.url, self.max_bytes)
        if time.monotonic() > self.deadline:
            raise httpx.ReadTimeout("total time exceeded")


def fetch(url: str, *, transport: httpx.BaseTransport | None = None, max_bytes: int | None = None,
          timeout: float | None = None) -> str:
    """The image at ``url`` as a base64 data URI; :class:`MediaFetchError` naming the URL on any failure. The limits
    default to :data:`MAX_IMAGE_BYTES` and :data:`FETCH_TIMEOUT` (read at each call)."""
    max_bytes, timeout = max_bytes or MAX_IMAGE_BYTES, timeout or FETCH_TIMEOUT
    deadline = time.monotonic() + timeout
    try:
        with httpx.Client(transport=transport, **_client_kwargs(timeout)) as client, \
                client.stream("GET", url) as r:
            mime = _content_type(url, r, max_bytes)
            body = _Body(url, max_bytes, deadline)
            for chunk in r.iter_bytes():
                body.add(chunk)
    except httpx.HTTPError as exc:
        raise _failure(url, exc) from exc
    return _data_uri(url, mime, bytes(body.data))


async def afetch(url: str, *, transport: httpx.AsyncBaseTransport | None = None, max_bytes: int | None = None,
                 timeout: float | None = None) -> str:
    max_bytes, timeout = max_bytes or MAX_IMAGE_BYTES, timeout or FETCH_TIMEOUT
    deadline = time.monotonic() + timeout
    try:
        async with httpx.AsyncClient(transport=transport, **_client_kwargs(timeout)) as client, \
                client.stream("GET", url) as r:
            mime = _content_type(url, r, max_bytes)
            body = _Body(url, max_bytes, deadline)
            async for chunk in r.aiter_bytes():
                body.add(chunk)
    except httpx.HTTPError as exc:
        raise _failure(url, exc) from exc
    return _data_uri(url, mime, bytes(body.data))


# --- the payload -------------------------------------------------------------------------------------------------


def prepare(payload: dict[str, Any], available: Mapping[str, bool], *, model: str,
            transport: httpx.BaseTransport | None = None) -> dict[str, Any]:
    """``payload`` checked against the server's modalities, its ``http(s)`` image URLs inlined as data URIs. A
    payload without media parts is returned as it is."""
    messages = payload.get("messages")
    if not media_parts(messages):
        return payload
    check(messages, available, model=model)
    urls = remote_urls(messages)
    if not urls:
        return payload
    fetched = {url: fetch(url, transport=transport) for url in urls}
    return {**payload, "messages": inline(messages, fetched)}  # type: ignore[arg-type]


async def aprepare(payload: dict[str, Any], available: Mapping[str, bool], *, model: str,
                   transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    messages = payload.get("messages")
    if not media_parts(messages):
        return payload
    check(messages, available, model=model)
    urls = remote_urls(messages)
    if not urls:
        return payload
    uris = await asyncio.gather(*(afetch(url, transport=transport) for url in urls))
    return {**payload, "messages": inline(messages, dict(zip(urls, uris, strict=True)))}  # type: ignore[arg-type]


def text_only(messages: Any) -> Any:
    """``messages`` without their image and audio parts (for counting the prompt's text tokens)."""
    if not media_parts(messages):
        return messages
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if isinstance(content, list):
            kept = [p for p in content if not (isinstance(p, dict) and p.get("type") in PART_MODALITY)]
            m = {**m, "content": kept or ""}
        out.append(m)
    return out


def size_bound(messages: Any) -> int:
    """The size of ``messages`` in the engine's cheap "surely fits" bound: the characters of their text, plus
    :data:`MEDIA_PART_BOUND` per image or audio part (never the length of its base64 data)."""
    return len(str(text_only(messages))) + MEDIA_PART_BOUND * media_parts(messages)
