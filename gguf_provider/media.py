"""Images and audio in chat messages on their way to llama-server: one place for every adapter and the magics.

The adapters translate their frameworks' image blocks into OpenAI ``image_url`` parts (and audio into
``input_audio`` parts); :meth:`Engine.prepare <gguf_provider.engine.Engine.prepare>` hands every payload to
:func:`prepare` (sync) or :func:`aprepare` (async) before the request is sent:

* A part that needs a modality the server's model lacks (``/props`` → ``modalities``: ``vision``, ``audio``)
  raises :class:`~gguf_provider.errors.UnsupportedInputError` before the request. Without this check llama-server
  answers HTTP 500 "image input is not supported - hint: if this is unexpected, you may need to provide the
  mmproj".
* ``http://`` and ``https://`` image URLs are fetched here (httpx: at most :data:`MAX_REDIRECTS` redirects,
  :data:`MAX_IMAGE_BYTES`, :data:`FETCH_TIMEOUT` seconds in all, an ``image/*`` content type) and inlined as
  base64 ``data:`` URIs; any failure is a :class:`~gguf_provider.errors.MediaFetchError` naming the URL. Why here:
  our llama-server build fetches a plain ``http://`` URL itself but answers an ``https://`` one with HTTP 500
  "HTTPS is not supported. Please rebuild with one of: -DLLAMA_BUILD_BORINGSSL=ON ..." (it is built without TLS),
  a server we attach to need not reach the URLs its caller can, and the server would fetch any address.
  ``data:`` URIs pass through unchanged; no other URL reaches the server.
* Where a URL may point (:class:`FetchPolicy`, the option ``media_allow_hosts``): by default only public
  addresses. The host is resolved, every address checked (loopback, private, link-local, multicast, reserved are
  refused with :class:`~gguf_provider.errors.MediaURLRefusedError`), and the connection made to the checked
  address (the name in Host and SNI), so a second DNS answer cannot differ; each redirect is checked the same
  way. ``file://`` URLs are read only when the policy lists ``file:``; other schemes are refused.
* :func:`text_only` drops the media parts for prompt counting (apply-template + tokenize): llama-server puts a
  random marker string where an image goes, and an image's own tokens are known only to the server (its usage).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ._io import collect, gather, in_caller, off_loop
from .errors import MediaFetchError, MediaURLRefusedError, UnsupportedInputError
from .lazy import LazyModule

if TYPE_CHECKING:
    import httpx
else:
    httpx = LazyModule("httpx")  # imported at first use (bench P3)

MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image fetched from a URL (bytes, before base64)."""
FETCH_TIMEOUT = 30.0
"""Seconds a URL fetch may take in all (connect, redirects and body)."""
MAX_REDIRECTS = 5
ALLOW_HOSTS_ENV = "GGUF_PROVIDER_MEDIA_ALLOW_HOSTS"
"""The default of ``media_allow_hosts``: comma-separated hosts, addresses or networks, ``*``, ``file:``, or ``none``
(no URL fetched)."""
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


def remote_urls(messages: Any, policy: FetchPolicy | None = None) -> list[str]:
    """The distinct image URLs in ``messages`` that are not ``data:`` URIs, in order: ``http(s)``, and ``file:``
    when the policy allows local files. Any other scheme is :class:`MediaURLRefusedError`, so no URL reaches
    llama-server unchecked (it would fetch an ``http://`` URL itself)."""
    policy = policy or FetchPolicy.from_env()
    files = policy.files
    urls: list[str] = []
    for part in _parts(messages):
        url = _url_of(part)
        if url is None or url.startswith("data:"):
            continue
        policy.check_on(url)
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "file" and not files:
            raise MediaURLRefusedError(
                f"image URL {_short(url)} is a local file, and local files are read only when asked for: add "
                f"'file:' to media_allow_hosts (or ${ALLOW_HOSTS_ENV}), or pass the image's bytes", url, "file")
        if scheme not in ("http", "https", "file"):
            raise MediaURLRefusedError(
                f"image URL {_short(url)} is neither http(s) nor a data: URI: give an http(s) URL, a "
                f"data:image/...;base64 URI, or the image's bytes (e.g. LangChain's {{'type': 'image', 'base64': "
                f"..., 'mime_type': ...}}, LlamaIndex's ImageBlock(path=...))", url, "scheme")
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
    return MediaFetchError(f"could not fetch the image {_short(url)}: {type(exc).__name__}: {exc}", url)


# --- where a URL may point --------------------------------------------------------------------------------------


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver); tests put a hosts-style table here."""
    try:
        return [str(ipaddress.ip_address(host))]  # an address is itself
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def not_public(address: str) -> str | None:
    """Why ``address`` is no public internet address (``"loopback"``, ``"private"``, ...), or None when it is."""
    ip: _Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for attr, why in (("is_loopback", "loopback"), ("is_unspecified", "unspecified"),
                      ("is_link_local", "link-local (where cloud metadata services answer)"),
                      ("is_multicast", "multicast"), ("is_private", "private"), ("is_reserved", "reserved")):
        if getattr(ip, attr):
            return why
    return None if ip.is_global else "non-public (special-purpose)"


@dataclass(frozen=True)
class FetchPolicy:
    """Which image URLs may be fetched. By default only public addresses: every address a host resolves to, and
    every redirect's, must be public. ``hosts`` (names, lower case), ``networks`` (addresses and CIDR ranges) and
    ``any_host`` (``*``) allow non-public ones; ``files`` (``file:``) lets ``file://`` URLs be read; ``off``
    (``none``) refuses every URL, whatever else is listed."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[_Network, ...] = ()
    any_host: bool = False
    files: bool = False
    off: bool = False
    setting: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, setting: str | Sequence[str] | None) -> FetchPolicy:
        """The policy of ``media_allow_hosts`` (a list, or one comma-separated string); None reads
        ``$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS``. An entry that parses as an address or network is one; any other
        is a host name; empty entries are skipped."""
        if setting is None:
            setting = os.environ.get(ALLOW_HOSTS_ENV, "")
        items = setting.split(",") if isinstance(setting, str) else list(setting)
        entries = tuple(str(e).strip() for e in items if str(e).strip())
        hosts: set[str] = set()
        networks: list[_Network] = []
        for entry in entries:
            if entry in ("file:", "file://"):
                continue
            try:
                networks.append(ipaddress.ip_network(entry.removeprefix("[").removesuffix("]"), strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts - {"*", "none"}), tuple(networks), "*" in hosts,
                   any(e in ("file:", "file://") for e in entries), "none" in hosts, entries)

    @classmethod
    def from_env(cls) -> FetchPolicy:
        return cls.parse(None)

    def check_on(self, url: str) -> None:
        """:class:`MediaURLRefusedError` (``.reason`` ``"off"``) for any URL when fetching is off (``none``)."""
        if self.off:
            raise MediaURLRefusedError(
                f"image URL {_short(url)} was not fetched: URL fetching is off (media_allow_hosts='none' or "
                f"${ALLOW_HOSTS_ENV}=none); pass the image's bytes or a data: URI", url, "off")

    def pin(self, url: str, original: str) -> str:
        """The address to connect to for ``url`` (one it resolves to), after checking every one of them;
        :class:`MediaURLRefusedError` for a non-public one this policy does not allow. ``original`` is the URL the
        message gave (``url`` may be a redirect's target)."""
        via = "" if url == original else f" (redirected to {_short(url)})"
        try:
            parts = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise MediaFetchError(f"image URL {_short(original)}{via} is not a valid URL: {exc}", original) from exc
        if parts.scheme not in ("http", "https"):
            raise MediaURLRefusedError(f"image URL {_short(original)}{via} was not fetched: only http(s) URLs are "
                                       f"fetched (a redirect too)", original, "scheme")
        host = parts.host.lower().rstrip(".")
        if not host:
            raise MediaFetchError(f"image URL {_short(original)}{via} names no host", original)
        try:
            addresses = resolve(host, parts.port or (443 if parts.scheme == "https" else 80))
        except (OSError, UnicodeError) as exc:
            raise MediaFetchError(f"could not fetch the image {_short(original)}{via}: the host {host!r} does not "
                                  f"resolve ({exc})", original) from exc
        if not addresses:
            raise MediaFetchError(f"could not fetch the image {_short(original)}{via}: {host!r} has no address",
                                  original)
        if self.any_host or host in self.hosts:
            return addresses[0]
        for address in addresses:
            why = not_public(address)
            if why is None or any(ipaddress.ip_address(address) in n for n in self.networks):
                continue
            shown = host if host == address else f"{host} ({address})"
            raise MediaURLRefusedError(
                f"image URL {_short(original)}{via} was not fetched: {shown} is a {why} address, and only public "
                f"addresses are fetched by default (a message could otherwise make this machine fetch internal "
                f"URLs). To allow it, list the host in media_allow_hosts=[{host!r}] or "
                f"${ALLOW_HOSTS_ENV}={host} ('*' allows every host; docs/security.md), or pass the image as "
                f"base64 data", original, why.split(" ", 1)[0])
        return addresses[0]


def _request(client: httpx.Client | httpx.AsyncClient, url: str, address: str, pinned: bool) -> httpx.Request:
    """A GET of ``url`` sent to ``address``, the one we checked (no second DNS lookup that could answer otherwise):
    the name stays in the Host header and, for https, in SNI and the certificate check."""
    if not pinned:  # a transport given by the caller decides where it connects (tests)
        return client.build_request("GET", url)
    parts = httpx.URL(url)
    extensions = {"sni_hostname": parts.host} if parts.scheme == "https" else {}
    return client.build_request("GET", parts.copy_with(host=address), headers={"Host": parts.netloc.decode()},
                                extensions=extensions)


def _redirect(r: httpx.Response, url: str) -> str | None:
    location = r.headers.get("location")
    if r.status_code not in (301, 302, 303, 307, 308) or not location:
        return None
    return str(httpx.URL(url).join(location))


def _client_kwargs(timeout: float) -> dict[str, Any]:
    # Redirects are followed by hand, each hop checked; HTTP(S)_PROXY is not used (a proxy would resolve the name
    # itself), so the connection goes to the checked address.
    return {"follow_redirects": False, "timeout": timeout,
            "headers": {"User-Agent": _USER_AGENT, "Accept": "image/*"}}


def _too_many(url: str) -> MediaFetchError:
    return MediaFetchError(f"fetching the image {_short(url)}: more than {MAX_REDIRECTS} redirects", url)


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


def read_file(url: str, *, max_bytes: int | None = None) -> str:
    """A ``file://`` image as a data URI (its type from its bytes); only when the policy allows ``file:``."""
    max_bytes = max_bytes or MAX_IMAGE_BYTES
    path = Path(unquote(urlsplit(url).path))
    try:
        with open(path, "rb") as f:
            body = f.read(max_bytes + 1)
    except OSError as exc:
        raise MediaFetchError(f"could not read the image {_short(url)}: {exc.strerror or exc}", url) from exc
    if len(body) > max_bytes:
        raise _too_large(url, max_bytes)
    return _data_uri(url, "", body)


# --- the payload -------------------------------------------------------------------------------------------------


# The fetches, written once, async; the sync functions are generated from it (scripts/gen_sync.py).

# unasync: async source
async def afetch(url: str, *, transport: httpx.AsyncBaseTransport | None = None, max_bytes: int | None = None,
                 timeout: float | None = None, policy: FetchPolicy | None = None) -> str:
    """The image at ``url`` as a base64 data URI; :class:`MediaFetchError` naming the URL on any failure, and
    :class:`MediaURLRefusedError` before any connection when the URL (or a redirect) points where ``policy``
    (default: ``$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS``, public addresses only) does not allow. The limits default to
    :data:`MAX_IMAGE_BYTES` and :data:`FETCH_TIMEOUT` (read at each call)."""
    policy = policy or FetchPolicy.from_env()
    policy.check_on(url)
    if url.lower().startswith("file:") and policy.files:
        return await off_loop(read_file, url, max_bytes=max_bytes)
    max_bytes, timeout = max_bytes or MAX_IMAGE_BYTES, timeout or FETCH_TIMEOUT
    deadline = time.monotonic() + timeout
    current = url
    try:
        async with httpx.AsyncClient(transport=transport or httpx.AsyncHTTPTransport(),
                                     **_client_kwargs(timeout)) as client:
            for _ in range(MAX_REDIRECTS + 1):
                address = await off_loop(policy.pin, current, url)  # a DNS lookup
                r = await client.send(_request(client, current, address, transport is None), stream=True)
                try:
                    target = _redirect(r, current)
                    if target is not None:
                        current = target
                        continue
                    mime = _content_type(url, r, max_bytes)
                    body = _Body(url, max_bytes, deadline)
                    async for chunk in r.aiter_bytes():
                        body.add(chunk)
                finally:
                    await r.aclose()
                return _data_uri(url, mime, bytes(body.data))
    except httpx.HTTPError as exc:
        raise _failure(url, exc) from exc
    raise _too_many(url)


async def aprepare(payload: dict[str, Any], available: Mapping[str, bool], *, model: str,
                   transport: httpx.AsyncBaseTransport | None = None,
                   policy: FetchPolicy | None = None) -> dict[str, Any]:
    """``payload`` checked against the server's modalities, its image URLs checked against ``policy`` and inlined
    as data URIs. A payload without media parts is returned as it is."""
    messages = payload.get("messages")
    if not media_parts(messages):
        return payload
    check(messages, available, model=model)
    policy = policy or FetchPolicy.from_env()
    urls = remote_urls(messages, policy)
    if not urls:
        return payload
    uris = await gather(afetch(url, transport=transport, policy=policy) for url in urls)  # at once / in turn
    return {**payload, "messages": inline(messages, dict(zip(urls, uris, strict=True)))}  # type: ignore[arg-type]


# unasync: generated from the async source above by scripts/gen_sync.py; do not edit
def fetch(url: str, *, transport: httpx.BaseTransport | None = None, max_bytes: int | None = None,
     timeout: float | None = None, policy: FetchPolicy | None = None) -> str:
    """The image at ``url`` as a base64 data URI; :class:`MediaFetchError` naming the URL on any failure, and
    :class:`MediaURLRefusedError` before any connection when the URL (or a redirect) points where ``policy``
    (default: ``$GGUF_PROVIDER_MEDIA_ALLOW_HOSTS``, public addresses only) does not allow. The limits default to
    :data:`MAX_IMAGE_BYTES` and :data:`FETCH_TIMEOUT` (read at each call)."""
    policy = policy or FetchPolicy.from_env()
    policy.check_on(url)
    if url.lower().startswith("file:") and policy.files:
        return in_caller(read_file, url, max_bytes=max_bytes)
    max_bytes, timeout = max_bytes or MAX_IMAGE_BYTES, timeout or FETCH_TIMEOUT
    deadline = time.monotonic() + timeout
    current = url
    try:
        with httpx.Client(transport=transport or httpx.HTTPTransport(),
                     **_client_kwargs(timeout)) as client:
            for _ in range(MAX_REDIRECTS + 1):
                address = in_caller(policy.pin, current, url)  # a DNS lookup
                r = client.send(_request(client, current, address, transport is None), stream=True)
                try:
                    target = _redirect(r, current)
                    if target is not None:
                        current = target
                        continue
                    mime = _content_type(url, r, max_bytes)
                    body = _Body(url, max_bytes, deadline)
                    for chunk in r.iter_bytes():
                        body.add(chunk)
                finally:
                    r.close()
                return _data_uri(url, mime, bytes(body.data))
    except httpx.HTTPError as exc:
        raise _failure(url, exc) from exc
    raise _too_many(url)


def prepare(payload: dict[str, Any], available: Mapping[str, bool], *, model: str,
            transport: httpx.BaseTransport | None = None,
            policy: FetchPolicy | None = None) -> dict[str, Any]:
    """``payload`` checked against the server's modalities, its image URLs checked against ``policy`` and inlined
    as data URIs. A payload without media parts is returned as it is."""
    messages = payload.get("messages")
    if not media_parts(messages):
        return payload
    check(messages, available, model=model)
    policy = policy or FetchPolicy.from_env()
    urls = remote_urls(messages, policy)
    if not urls:
        return payload
    uris = collect(fetch(url, transport=transport, policy=policy) for url in urls)  # at once / in turn
    return {**payload, "messages": inline(messages, dict(zip(urls, uris, strict=True)))}  # type: ignore[arg-type]


# unasync: end


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
