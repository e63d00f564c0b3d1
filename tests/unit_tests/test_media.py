"""gguf_provider.media offline: the modality check, URL fetching through httpx.MockTransport, data URIs passed
through, and the engine's use of both over a replayed llama-server (no binary, no model, no network)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock

from gguf_provider import ChatGGUF, MediaFetchError, MediaURLRefusedError, UnsupportedInputError, media
from gguf_provider.limits import char_bound, template_payload
from gguf_provider.llama_index import GGUF
from tests.support.replay import BASE_URL, Replay, load_replay

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()
URL = "https://images.example/cat.png"


# A hosts table instead of DNS (unit tests resolve nothing): public-looking names, one of them pointing home.
HOSTS = {"images.example": ["93.184.216.34"], "cdn.example": ["93.184.216.35"],
         "innocent.example": ["127.0.0.1"], "mixed.example": ["93.184.216.36", "10.1.2.3"],
         "images.test": ["127.0.0.1"], "redirector.test": ["127.0.0.1"]}


@pytest.fixture(autouse=True)
def _hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    real = media.resolve
    monkeypatch.setattr(media, "resolve", lambda host, port: HOSTS[host] if host in HOSTS else real(host, port))
    monkeypatch.delenv(media.ALLOW_HOSTS_ENV, raising=False)


def _user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}]


def _image(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


# --- modalities and the check --------------------------------------------------------------------------------


def test_modalities_from_props() -> None:
    assert media.modalities({"modalities": {"vision": True, "audio": False}}) == {"vision": True, "audio": False}
    assert media.modalities({}) == {}  # a build too old to say (it predates multimodal support too)
    assert media.modalities({"modalities": "vision"}) == {}


@pytest.mark.parametrize("available", [{}, {"vision": False, "video": False, "audio": False}])
def test_image_without_vision_is_a_typed_error(available: dict[str, bool]) -> None:
    with pytest.raises(UnsupportedInputError, match="vision=True") as info:
        media.check(_user(_image(DATA_URI)), available, model="the model m")
    err = info.value
    assert err.modality == "vision" and err.status_code == 400
    assert "mmproj=" in str(err) and "the model m" in str(err) and "gemma-3-4b-it-GGUF" in str(err)


def test_audio_needs_audio() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
    media.check(_user(_image(DATA_URI)), {"vision": True}, model="m")
    with pytest.raises(UnsupportedInputError, match="audio") as info:
        media.check(_user(audio), {"vision": True, "audio": False}, model="m")
    assert info.value.modality == "audio"
    media.check(_user(audio), {"audio": True}, model="m")


def test_text_only_payload_is_untouched() -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}]}]}
    assert media.prepare(payload, {}, model="m") is payload


def test_data_uris_pass_through() -> None:
    payload = {"messages": _user(_image(DATA_URI))}
    assert media.prepare(payload, {"vision": True}, model="m") is payload


# --- fetching --------------------------------------------------------------------------------------------------


def _serve(routes: dict[str, Any]) -> httpx.MockTransport:
    """A MockTransport answering each URL from ``routes``: a Response, a callable, or an exception to raise."""

    def handler(request: httpx.Request) -> httpx.Response:
        answer = routes.get(str(request.url))
        if answer is None:
            return httpx.Response(404)
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer

    return httpx.MockTransport(handler)


def test_fetch_inlines_an_image() -> None:
    seen: list[httpx.Request] = []

    def png(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "image/png; charset=binary"}, content=PNG)

    assert media.fetch(URL, transport=_serve({URL: png})) == DATA_URI
    assert seen[0].headers["user-agent"] == media._USER_AGENT


def test_fetch_follows_redirects() -> None:
    routes = {URL: httpx.Response(302, headers={"location": "https://cdn.example/c.png"}),
              "https://cdn.example/c.png": httpx.Response(200, headers={"content-type": "image/png"}, content=PNG)}
    assert media.fetch(URL, transport=_serve(routes)) == DATA_URI


def test_too_many_redirects() -> None:
    loop = {URL: httpx.Response(302, headers={"location": URL})}
    with pytest.raises(MediaFetchError, match="redirects") as info:
        media.fetch(URL, transport=_serve(loop))
    assert info.value.url == URL


@pytest.mark.parametrize(("answer", "match", "status"), [
    (httpx.Response(404), "HTTP 404", 404),
    (httpx.Response(503, text="busy"), "HTTP 503", 503),
    (httpx.Response(200, headers={"content-type": "text/html"}, text="<html>"), "content type is 'text/html'", 200),
    (httpx.Response(200, headers={"content-type": "application/octet-stream"}, content=b"%PDF-1.4"),
     "bytes are no PNG", None),
    (httpx.Response(200, headers={"content-type": "image/png"}, content=b""), "is empty", None),
    (httpx.Response(200, headers={"content-type": "image/png", "content-length": str(10**9)}, content=b""),
     "1000000000 bytes, over the", 200),
    (httpx.ConnectError("connection refused"), "could not fetch the image .*ConnectError", None),
    (httpx.ReadTimeout("slow"), "timed out", None),
])
def test_fetch_failures_are_typed_and_name_the_url(answer: Any, match: str, status: int | None) -> None:
    with pytest.raises(MediaFetchError, match=match) as info:
        media.fetch(URL, transport=_serve({URL: answer}))
    assert info.value.url == URL and URL in str(info.value) and info.value.status_code == status


def test_size_limit_without_content_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "MAX_IMAGE_BYTES", 1000)

    def chunked(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "image/png"}, content=iter([b"x" * 600] * 3))

    with pytest.raises(MediaFetchError, match="over the 1000-byte limit"):
        media.fetch(URL, transport=_serve({URL: chunked}))


def test_untyped_image_is_sniffed() -> None:
    untyped = httpx.Response(200, headers={"content-type": "application/octet-stream"}, content=PNG)
    assert media.fetch(URL, transport=_serve({URL: untyped})) == DATA_URI
    jpeg = httpx.Response(200, content=b"\xff\xd8\xff\xe0rest")
    assert media.fetch(URL, transport=_serve({URL: jpeg})).startswith("data:image/jpeg;base64,")


def test_other_schemes_are_refused() -> None:
    for url in ("ftp://host/x.png", "cat.png", "gopher://127.0.0.1:70/"):
        with pytest.raises(MediaURLRefusedError, match="neither http") as info:
            media.prepare({"messages": _user(_image(url))}, {"vision": True}, model="m")
        assert info.value.reason == "scheme"
    with pytest.raises(MediaURLRefusedError, match="'file:' to media_allow_hosts") as info:
        media.prepare({"messages": _user(_image("file:///etc/passwd"))}, {"vision": True}, model="m")
    assert info.value.reason == "file"


def test_file_urls_are_read_when_asked_for(tmp_path: Any) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    (tmp_path / "notes.txt").write_text("not an image")
    policy = media.FetchPolicy.parse(["file:"])
    payload = {"messages": _user(_image((tmp_path / "a.png").as_uri()))}
    out = media.prepare(payload, {"vision": True}, model="m", policy=policy)
    assert out["messages"][0]["content"][1]["image_url"]["url"] == DATA_URI
    with pytest.raises(MediaFetchError, match="not an image"):
        media.fetch((tmp_path / "notes.txt").as_uri(), policy=policy)


async def test_afetch_and_aprepare() -> None:
    other = "http://images.example/dog.png"
    routes = {URL: httpx.Response(200, headers={"content-type": "image/png"}, content=PNG),
              other: httpx.Response(404)}
    assert await media.afetch(URL, transport=_serve(routes)) == DATA_URI
    with pytest.raises(MediaFetchError, match="HTTP 404"):
        await media.afetch(other, transport=_serve(routes))
    payload = {"messages": _user(_image(URL, detail="low"), _image(URL)), "max_tokens": 5}
    out = await media.aprepare(payload, {"vision": True}, model="m", transport=_serve(routes))
    assert [p["image_url"] for p in out["messages"][0]["content"][1:]] == [{"url": DATA_URI, "detail": "low"},
                                                                          {"url": DATA_URI}]
    assert payload["messages"][0]["content"][1]["image_url"]["url"] == URL  # the caller's messages are not changed


def test_prepare_fetches_each_url_once_and_keeps_the_rest() -> None:
    calls: list[str] = []

    def png(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(200, headers={"content-type": "image/png"}, content=PNG)

    messages = [{"role": "system", "content": "be brief"}, *_user(_image(URL), _image(DATA_URI)),
                {"role": "user", "content": [{"type": "image_url", "image_url": URL}]}]
    out = media.prepare({"messages": messages}, {"vision": True}, model="m", transport=_serve({URL: png}))
    assert calls == [URL]
    assert out["messages"][0] is messages[0]
    assert [p.get("image_url") for p in out["messages"][1]["content"]] == [None, {"url": DATA_URI},
                                                                          {"url": DATA_URI}]
    assert out["messages"][2]["content"] == [{"type": "image_url", "image_url": {"url": DATA_URI}}]


# --- counting ----------------------------------------------------------------------------------------------------


def test_counting_leaves_media_out() -> None:
    big = "data:image/png;base64," + "A" * 5_000_000
    payload = {"messages": _user(_image(big), {"type": "input_audio", "input_audio": {"data": "A" * 1000}})}
    assert char_bound(payload) < 512 + 200 + 2 * media.MEDIA_PART_BOUND
    assert template_payload(payload)["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}]}]
    only_image = [{"role": "user", "content": [_image(big)]}]
    assert media.text_only(only_image) == [{"role": "user", "content": ""}]


# --- through the engine, over a replayed llama-server ------------------------------------------------------------


def _with_vision(replay: Replay) -> Replay:
    exchanges = copy.deepcopy(replay.exchanges)
    for ex in exchanges:
        if ex["path"] == "/props":
            props = json.loads(ex["body"])
            props["modalities"] = {"vision": True, "video": True, "audio": False}
            ex["body"] = json.dumps(props)
    return Replay(exchanges)


@pytest.fixture
def chat_replay() -> Replay:
    return load_replay("smollm2_chat")


def test_no_vision_server_gets_no_request(chat_replay: Replay) -> None:
    """The recorded server has no projector (/props modalities: vision false): every adapter path raises before
    sending the chat request."""
    image = {"type": "image", "base64": base64.b64encode(PNG).decode(), "mime_type": "image/png"}
    llm = ChatGGUF(base_url=BASE_URL, transport=chat_replay.transport)
    message = [HumanMessage(content=[{"type": "text", "text": "What is this?"}, image])]
    with pytest.raises(UnsupportedInputError, match="the server at http://replayed"):
        llm.invoke(message)
    with pytest.raises(UnsupportedInputError):
        list(llm.stream(message))
    li = GGUF(base_url=BASE_URL, transport=chat_replay.transport)
    with pytest.raises(UnsupportedInputError):
        li.chat([ChatMessage(role="user", blocks=[TextBlock(text="What is this?"), ImageBlock(image=PNG)])])
    assert chat_replay.bodies("/v1/chat/completions") == [] and chat_replay.bodies("/apply-template") == []


async def test_no_vision_server_async(chat_replay: Replay) -> None:
    llm = ChatGGUF(base_url=BASE_URL, transport=chat_replay.transport)
    with pytest.raises(UnsupportedInputError):
        await llm.ainvoke([HumanMessage(content=[{"type": "image_url", "image_url": {"url": DATA_URI}}])])
    assert chat_replay.bodies("/v1/chat/completions") == []


def test_vision_server_gets_inlined_images(chat_replay: Replay, monkeypatch: pytest.MonkeyPatch) -> None:
    replay = _with_vision(chat_replay)
    web = _serve({URL: httpx.Response(200, headers={"content-type": "image/png"}, content=PNG)})
    real = media.fetch
    monkeypatch.setattr(media, "fetch", lambda url, **kw: real(url, **{**kw, "transport": web}))
    llm = ChatGGUF(base_url=BASE_URL, transport=replay.transport, max_tokens=50)
    assert llm.load().profile is not None and llm.profile["image_inputs"] is True
    assert llm.engine.modalities()["vision"] is True
    llm.invoke([HumanMessage(content=[{"type": "text", "text": "What is this?"}, {"type": "image", "url": URL}])])
    sent = replay.bodies("/v1/chat/completions")[-1]
    assert sent["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": DATA_URI}}
    # the prompt was counted (an image part never "surely fits") without the image part
    assert replay.bodies("/apply-template")[-1]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}]}]


def test_langchain_image_block_without_data_is_a_value_error() -> None:
    from gguf_provider.langchain._utils import to_openai

    with pytest.raises(ValueError, match="no url or base64 data"):
        to_openai([HumanMessage(content=[{"type": "image", "file_id": "file-123"}])], keep_reasoning=False)




# --- where image URLs may point: a real HTTP server on 127.0.0.1 and a redirector ---------------------------------


class _Web:
    """A loopback HTTP server: ``/cat.png`` (a PNG) and ``/to?URL`` (a 302 to URL); records each request's Host."""

    def __init__(self) -> None:
        import http.server
        import threading
        from urllib.parse import unquote

        hosts: list[str] = []
        self.hosts = hosts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hosts.append(self.headers.get("Host", ""))
                if self.path.startswith("/to?"):
                    self.send_response(302)
                    self.send_header("Location", unquote(self.path[4:]))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(PNG)))
                self.end_headers()
                self.wfile.write(PNG)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{path}"


@pytest.fixture
def web() -> Any:
    server = _Web()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_loopback_is_refused_by_default_before_any_connection(web: _Web) -> None:
    for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
        url = web.url("cat.png", host)
        with pytest.raises(MediaURLRefusedError, match="loopback address.*media_allow_hosts") as info:
            media.fetch(url)
        assert info.value.url == url and info.value.reason == "loopback"
        assert media.ALLOW_HOSTS_ENV in str(info.value)
    assert web.hosts == []


@pytest.mark.parametrize("allow", [["127.0.0.1"], "127.0.0.1", ["*"], ["127.0.0.0/8"], "localhost, 127.0.0.1"])
def test_loopback_is_fetched_when_allowed(web: _Web, allow: Any) -> None:
    assert media.fetch(web.url("cat.png"), policy=media.FetchPolicy.parse(allow)) == DATA_URI


def test_the_env_var_allows_hosts(web: _Web, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(media.ALLOW_HOSTS_ENV, "127.0.0.1")
    assert media.fetch(web.url("cat.png")) == DATA_URI
    assert media.FetchPolicy.parse([]) == media.FetchPolicy()  # an explicit empty list ignores the env var


def test_a_public_looking_name_resolving_to_loopback_is_refused(web: _Web) -> None:
    with pytest.raises(MediaURLRefusedError, match=r"innocent.example \(127.0.0.1\) is a loopback address"):
        media.fetch(web.url("cat.png", "innocent.example"))
    with pytest.raises(MediaURLRefusedError, match=r"mixed.example \(10.1.2.3\) is a private address"):
        media.fetch("http://mixed.example/cat.png")  # one internal address among public ones is enough
    assert web.hosts == []


def test_the_connection_goes_to_the_checked_address(web: _Web) -> None:
    """images.test is allowed and resolves (in our table only) to 127.0.0.1: the fetch connects there without a
    second lookup, and the server sees the name in Host."""
    url = web.url("cat.png", "images.test")
    assert media.fetch(url, policy=media.FetchPolicy.parse(["images.test"])) == DATA_URI
    assert web.hosts == [f"images.test:{web.port}"]


@pytest.mark.parametrize("target", ["http://127.0.0.1:{port}/cat.png", "http://169.254.169.254/latest/meta-data/",
                                    "http://10.0.0.1/x.png", "http://[::1]:{port}/cat.png",
                                    "http://innocent.example:{port}/cat.png"])
def test_a_redirect_to_an_internal_address_is_refused(web: _Web, target: str) -> None:
    """The redirector is allowed by name; where it sends us is checked again, hop by hop."""
    from urllib.parse import quote

    url = web.url("to?" + quote(target.format(port=web.port), safe=""), "redirector.test")
    policy = media.FetchPolicy.parse(["redirector.test"])
    with pytest.raises(MediaURLRefusedError, match="redirected to .* was not fetched") as info:
        media.fetch(url, policy=policy)
    assert info.value.url == url
    assert web.hosts == [f"redirector.test:{web.port}"]  # only the redirector was asked


def test_an_allowed_redirect_is_followed(web: _Web) -> None:
    from urllib.parse import quote

    url = web.url("to?" + quote(web.url("cat.png", "images.test"), safe=""), "redirector.test")
    policy = media.FetchPolicy.parse(["redirector.test", "images.test"])
    assert media.fetch(url, policy=policy) == DATA_URI
    assert web.hosts == [f"redirector.test:{web.port}", f"images.test:{web.port}"]


async def test_async_fetch_checks_the_same(web: _Web) -> None:
    from urllib.parse import quote

    with pytest.raises(MediaURLRefusedError, match="loopback"):
        await media.afetch(web.url("cat.png"))
    redirect = web.url("to?" + quote(web.url("cat.png"), safe=""), "redirector.test")
    with pytest.raises(MediaURLRefusedError, match="redirected to"):
        await media.afetch(redirect, policy=media.FetchPolicy.parse(["redirector.test"]))
    assert await media.afetch(web.url("cat.png"), policy=media.FetchPolicy.parse("127.0.0.1")) == DATA_URI


def test_a_redirect_through_a_mock_transport_is_checked_too() -> None:
    routes = {URL: httpx.Response(302, headers={"location": "http://10.0.0.5/internal.png"})}
    with pytest.raises(MediaURLRefusedError, match=r"10.0.0.5 is a private address"):
        media.fetch(URL, transport=_serve(routes))


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.0.0.1", "private"), ("192.168.1.1", "private"),
    ("172.16.0.1", "private"), ("fc00::1", "private"), ("224.0.0.1", "multicast"), ("ff0e::1", "multicast"),
    ("240.0.0.1", "private"), ("100.64.0.1", "non-public"), ("8.8.8.8", None), ("2606:4700::1111", None),
])
def test_not_public(address: str, why: str | None) -> None:
    got = media.not_public(address)
    assert (got is None) if why is None else (got is not None and got.startswith(why))


def test_the_option_reaches_the_policy_and_llama_server_sees_no_url(chat_replay: Replay, web: _Web) -> None:
    """Through ChatGGUF over a replayed vision server: a loopback URL is refused before any request; listed in
    media_allow_hosts, it is fetched and inlined."""
    replay = _with_vision(chat_replay)
    message = [HumanMessage(content=[{"type": "text", "text": "What is this?"},
                                     {"type": "image", "url": web.url("cat.png")}])]
    strict = ChatGGUF(base_url=BASE_URL, transport=replay.transport, max_tokens=50)
    with pytest.raises(MediaURLRefusedError, match="loopback"):
        strict.invoke(message)
    assert replay.bodies("/v1/chat/completions") == [] and web.hosts == []
    allowed = ChatGGUF(base_url=BASE_URL, transport=replay.transport, max_tokens=50, media_allow_hosts="127.0.0.1")
    assert allowed.engine.config.media_allow_hosts == ("127.0.0.1",)
    allowed.invoke(message)
    sent = replay.bodies("/v1/chat/completions")[-1]
    assert sent["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": DATA_URI}}


@pytest.mark.parametrize(("location", "error", "match"), [
    ("file:///etc/passwd", MediaURLRefusedError, "only http"),
    ("gopher://images.example/", MediaURLRefusedError, "only http"),
    ("http:///nohost.png", MediaFetchError, "names no host|not a valid URL"),
])
def test_a_redirect_elsewhere_than_http_is_refused(location: str, error: type[Exception], match: str) -> None:
    routes = {URL: httpx.Response(302, headers={"location": location})}
    with pytest.raises(error, match=match) as info:
        media.fetch(URL, transport=_serve(routes))
    assert isinstance(info.value, MediaFetchError) and info.value.url == URL


@pytest.mark.skipif(not __import__("shutil").which("openssl"), reason="needs the openssl command for a certificate")
def test_https_to_the_checked_address_verifies_the_name(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An https server on 127.0.0.1 with a certificate for images.test only: the fetch connects to the address it
    checked and verifies the certificate (and sends SNI) for the name; a name the certificate lacks fails."""
    import http.server
    import ssl
    import subprocess
    import threading

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=images.test", "-addext", "subjectAltName=DNS:images.test", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    names: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts it
    HOSTS["other.test"] = ["127.0.0.1"]
    try:
        policy = media.FetchPolicy.parse(["images.test", "other.test"])
        assert media.fetch(f"https://images.test:{port}/cat.png", policy=policy) == DATA_URI
        assert names == ["images.test"]
        with pytest.raises(MediaFetchError, match="CERTIFICATE_VERIFY_FAILED|certificate|hostname"):
            media.fetch(f"https://other.test:{port}/cat.png", policy=policy)
    finally:
        del HOSTS["other.test"]
        httpd.shutdown()
        httpd.server_close()


async def test_none_turns_url_fetching_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``media_allow_hosts="none"`` (or the variable) refuses every URL before any connection, even one another
    entry would allow; data: URIs still go through."""
    off = media.FetchPolicy.parse("none,*,file:")
    never = httpx.MockTransport(lambda request: pytest.fail("no request when fetching is off"))
    for url in (URL, (tmp_path / "a.png").as_uri()):
        with pytest.raises(MediaURLRefusedError, match="URL fetching is off") as info:
            media.prepare({"messages": _user(_image(url))}, {"vision": True}, model="m", policy=off)
        assert info.value.reason == "off"
    with pytest.raises(MediaURLRefusedError, match="URL fetching is off"):
        media.fetch(URL, transport=never, policy=off)
    with pytest.raises(MediaURLRefusedError, match="URL fetching is off"):
        await media.afetch(URL, policy=off)
    monkeypatch.setenv("GGUF_PROVIDER_MEDIA_ALLOW_HOSTS", "None")
    with pytest.raises(MediaURLRefusedError, match="URL fetching is off"):
        media.prepare({"messages": _user(_image(URL))}, {"vision": True}, model="m")
    assert media.prepare({"messages": _user(_image(DATA_URI))}, {"vision": True}, model="m", policy=off)
