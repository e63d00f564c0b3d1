"""Images reach the model: every image form of LangChain and LlamaIndex, against a real llama-server with a real
(random-weight) projector beside SmolLM2 (``projector_path``).

The projector's weights are random, so nothing here looks at the reply's words: each test compares the prompt
token count the server reports (usage) with and without the image. The same text plus one image must count exactly
the image's tokens more, whatever the form the image came in. URLs are served by a local HTTP server started here;
the fetch is ours (its User-Agent), never llama-server's.

Order matters for the machine's load: the tests that need a server without the projector, or another model file,
run first and let theirs go; the rest share one SmolLM2 + projector server held by a module fixture.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from PIL import Image

from gguf_provider import media
from gguf_provider.engine import Engine, EngineConfig
from gguf_provider.errors import (
    MediaFetchError,
    MediaURLRefusedError,
    ModelNotFoundError,
    UnsupportedInputError,
)
from gguf_provider.langchain import ChatGGUF
from gguf_provider.llama_index import GGUF
from gguf_provider.runtime._serve.config import resolve_spec

pytestmark = pytest.mark.timeout(300)  # a hang guard: the slowest test takes ~7 s under load

N_CTX = 2048
TEXT = "Describe this image."
# The image server below is on 127.0.0.1, which image URLs may reach only when allowed (docs/security.md).
LOCAL = ["127.0.0.1"]
PARAMS: dict[str, Any] = {"n_ctx": N_CTX, "temperature": 0, "max_tokens": 1, "media_allow_hosts": LOCAL}


def _png(size: tuple[int, int] = (64, 64), color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def _jpeg(size: tuple[int, int] = (96, 64)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (20, 120, 220)).save(buf, "JPEG")
    return buf.getvalue()


PNG = _png()
PNG_B64 = base64.b64encode(PNG).decode()


# --- a local image server ---------------------------------------------------------------------------------------


class ImageServer:
    """Files over HTTP on 127.0.0.1, a redirect, a 404, a text page and an untyped image; records each request's
    path and User-Agent."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str]] = []
        handler = functools.partial(_Handler, self, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{path}"

    def agents(self, path: str) -> list[str]:
        return [ua for p, ua in self.requests if p == "/" + path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, server_state: ImageServer, *args: Any, **kwargs: Any) -> None:
        self.state = server_state
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.state.requests.append((self.path, self.headers.get("User-Agent", "")))
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/red.png")
            self.end_headers()
            return
        if self.path == "/untyped":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(PNG)))
            self.end_headers()
            self.wfile.write(PNG)
            return
        super().do_GET()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageServer]:
    root = tmp_path_factory.mktemp("images")
    (root / "red.png").write_bytes(PNG)
    (root / "blue.jpg").write_bytes(_jpeg())
    (root / "notes.txt").write_text("not an image\n")
    server = ImageServer(root)
    yield server
    server.close()


# --- helpers ----------------------------------------------------------------------------------------------------


def _lc_prompt_tokens(llm: ChatGGUF, content: Any) -> int:
    msg = llm.invoke([HumanMessage(content=content)])
    assert msg.usage_metadata is not None
    return msg.usage_metadata["input_tokens"]


def _li_prompt_tokens(response: Any) -> int:
    assert response.raw["usage"]["prompt_tokens"] == response.additional_kwargs["prompt_tokens"]
    return int(response.raw["usage"]["prompt_tokens"])


def _li_message(*blocks: Any) -> list[ChatMessage]:
    return [ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text=TEXT), *blocks])]


# --- first: servers other than the shared one (each released before the next starts) ----------------------------


def test_image_to_a_model_without_projector_is_a_typed_error(smollm2_path: Path, images: ImageServer) -> None:
    """SmolLM2 without vision: the image is refused before any request (no HTTP 500 from llama-server), the URL is
    not even fetched, and the server still answers text."""
    llm = ChatGGUF(model_path=str(smollm2_path), **PARAMS)
    try:
        assert llm.load().engine.modalities()["vision"] is False
        assert llm.profile is not None and llm.profile["image_inputs"] is False
        with pytest.raises(UnsupportedInputError, match="vision=True") as info:
            llm.invoke([HumanMessage(content=[{"type": "text", "text": TEXT},
                                              {"type": "image", "url": images.url("red.png")}])])
        assert info.value.modality == "vision" and "mmproj" in str(info.value)
        assert images.agents("red.png") == []
        li = GGUF(model_path=str(smollm2_path), **PARAMS)
        with pytest.raises(UnsupportedInputError):
            asyncio.run(li.achat(_li_message(ImageBlock(image=PNG, image_mimetype="image/png"))))
        assert _lc_prompt_tokens(llm, TEXT) > 0
    finally:
        llm.unload()


def test_vision_from_a_hub_repo_fetches_its_projector(hub: Any, projector_path: Path, smollm2_path: Path) -> None:
    """``org/repo:QUANT`` with vision=True downloads the repo's mmproj beside the model and the server loads it."""
    repo = "test-org/SmolLM2-vision-GGUF"
    hub.add_repo(repo, {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2_path, projector_path.name: projector_path,
                        "README.md": b"# vision test repo\n"})
    engine = Engine(EngineConfig(model=f"{repo}:Q4_1", vision=True, n_ctx=N_CTX))
    try:
        spec = resolve_spec(engine.config)
        assert spec.mmproj is not None and spec.mmproj.name == projector_path.name
        assert spec.mmproj.read_bytes() == projector_path.read_bytes()
        assert engine.modalities()["vision"] is True
    finally:
        engine.unload()


# --- the shared SmolLM2 + projector server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path: Path, projector_path: Path) -> Iterator[ChatGGUF]:
    """vision=True on the model file: the projector beside it is found. Other models built here with the same
    spec share this server."""
    assert projector_path.parent == smollm2_path.parent
    model = ChatGGUF(model_path=str(smollm2_path), vision=True, **PARAMS).load()
    yield model
    model.unload()


@pytest.fixture(scope="module")
def base_tokens(llm: ChatGGUF) -> int:
    return _lc_prompt_tokens(llm, TEXT)


@pytest.fixture(scope="module")
def image_tokens(llm: ChatGGUF, base_tokens: int) -> int:
    """The tokens one image adds, measured with the OpenAI data-URI form (the one llama-server takes as it is)."""
    n = _lc_prompt_tokens(llm, [{"type": "text", "text": TEXT},
                                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}])
    assert n > base_tokens
    return n - base_tokens


def test_server_reports_vision(llm: ChatGGUF, projector_path: Path) -> None:
    assert llm.engine.modalities()["vision"] is True
    assert llm.engine.info.props["modalities"]["vision"] is True
    assert llm.profile is not None and llm.profile["image_inputs"] is True
    assert resolve_spec(llm.engine.config).mmproj == projector_path


LANGCHAIN_FORMS = {
    "openai-data-uri": lambda url: {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
    "openai-http-url": lambda url: {"type": "image_url", "image_url": {"url": url}},
    "openai-url-string": lambda url: {"type": "image_url", "image_url": url},
    "v1-base64": lambda url: {"type": "image", "base64": PNG_B64, "mime_type": "image/png"},
    "v1-url": lambda url: {"type": "image", "url": url},
    "v0-source-type-base64": lambda url: {"type": "image", "source_type": "base64", "data": PNG_B64,
                                          "mime_type": "image/png"},
    "anthropic-base64": lambda url: {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                 "data": PNG_B64}},
    "anthropic-url": lambda url: {"type": "image", "source": {"type": "url", "url": url}},
}


@pytest.mark.parametrize("form", list(LANGCHAIN_FORMS))
def test_langchain_image_forms_add_the_image_tokens(llm: ChatGGUF, images: ImageServer, base_tokens: int,
                                                    image_tokens: int, form: str) -> None:
    url = images.url("red.png")
    before = len(images.agents("red.png"))
    n = _lc_prompt_tokens(llm, [{"type": "text", "text": TEXT}, LANGCHAIN_FORMS[form](url)])
    assert n - base_tokens == image_tokens
    fetched = images.agents("red.png")[before:]
    if "url" in form:  # fetched once, by us (llama-server's own client is cpp-httplib)
        assert fetched == [media._USER_AGENT]
    else:
        assert fetched == []


def test_langchain_stream_and_ainvoke(llm: ChatGGUF, images: ImageServer, base_tokens: int,
                                      image_tokens: int) -> None:
    content = [{"type": "text", "text": TEXT}, {"type": "image", "url": images.url("redirect")}]
    before = len(images.agents("redirect"))
    full: Any = None
    for chunk in llm.stream([HumanMessage(content=content)]):
        full = chunk if full is None else full + chunk
    assert full.usage_metadata["input_tokens"] - base_tokens == image_tokens
    msg = asyncio.run(llm.ainvoke([HumanMessage(content=content)]))  # the async fetch
    assert msg.usage_metadata is not None and msg.usage_metadata["input_tokens"] - base_tokens == image_tokens
    assert images.agents("redirect")[before:] == [media._USER_AGENT] * 2  # then red.png, the redirect's target


def test_two_images_add_twice_the_tokens(llm: ChatGGUF, images: ImageServer, base_tokens: int,
                                         image_tokens: int) -> None:
    n = _lc_prompt_tokens(llm, [{"type": "text", "text": TEXT}, {"type": "image", "url": images.url("blue.jpg")},
                                {"type": "image", "base64": PNG_B64, "mime_type": "image/png"}])
    assert n - base_tokens == 2 * image_tokens


def test_untyped_image_is_sniffed(llm: ChatGGUF, images: ImageServer, base_tokens: int, image_tokens: int) -> None:
    n = _lc_prompt_tokens(llm, [{"type": "text", "text": TEXT}, {"type": "image", "url": images.url("untyped")}])
    assert n - base_tokens == image_tokens


def test_llama_index_image_blocks(smollm2_path: Path, llm: ChatGGUF, images: ImageServer, image_tokens: int,
                                  tmp_path: Path) -> None:
    li = GGUF(model_path=str(smollm2_path), vision=True, **PARAMS)  # the same spec: the shared server
    assert li.engine.info.key == llm.engine.info.key
    base = _li_prompt_tokens(li.chat(_li_message()))
    jpg = tmp_path / "blue.jpg"
    jpg.write_bytes(_jpeg())
    from_path = li.chat(_li_message(ImageBlock(path=jpg)))
    assert _li_prompt_tokens(from_path) - base == image_tokens
    from_bytes = li.chat(_li_message(ImageBlock(image=PNG, image_mimetype="image/png")))
    assert _li_prompt_tokens(from_bytes) - base == image_tokens
    from_url = li.chat(_li_message(ImageBlock(url=images.url("red.png"))))
    assert _li_prompt_tokens(from_url) - base == image_tokens
    last = list(li.stream_chat(_li_message(ImageBlock(path=jpg))))[-1]
    assert _li_prompt_tokens(last) - base == image_tokens

    async def async_calls() -> tuple[Any, Any]:
        whole = await li.achat(_li_message(ImageBlock(url=images.url("redirect"))))
        streamed = [r async for r in await li.astream_chat(_li_message(ImageBlock(image=PNG)))]
        return whole, streamed[-1]

    whole, streamed_last = asyncio.run(async_calls())
    assert _li_prompt_tokens(whole) - base == image_tokens
    assert _li_prompt_tokens(streamed_last) - base == image_tokens


def test_mmproj_option_and_model_name(smollm2_path: Path, projector_path: Path, llm: ChatGGUF, base_tokens: int,
                                      image_tokens: int) -> None:
    """mmproj= names the projector (vision implied); vision=True on a models-dir name finds it beside the model.
    Both are the shared server's spec."""
    explicit = ChatGGUF(model_path=str(smollm2_path), mmproj=str(projector_path), **PARAMS)
    by_name = ChatGGUF(model=smollm2_path.stem, vision=True, **PARAMS)
    for other in (explicit, by_name):
        assert resolve_spec(other.engine.config) == resolve_spec(llm.engine.config)
        n = _lc_prompt_tokens(other, [{"type": "text", "text": TEXT},
                                      {"type": "image", "base64": PNG_B64, "mime_type": "image/png"}])
        assert n - base_tokens == image_tokens
        assert other.engine.info.key == llm.engine.info.key
        other.unload()


def test_mmproj_that_is_missing_or_not_a_projector(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="mmproj file not found"):
        ChatGGUF(model_path=str(smollm2_path), mmproj=str(tmp_path / "mmproj-nope.gguf")).load()
    with pytest.raises(ModelNotFoundError, match="architecture is 'llama'"):
        ChatGGUF(model_path=str(smollm2_path), mmproj=str(smollm2_path)).load()


@pytest.mark.parametrize(("path", "match"), [
    ("missing.png", "HTTP 404"),
    ("notes.txt", "not an image: its content type is 'text/plain'"),
])
def test_bad_image_urls_are_typed_errors(llm: ChatGGUF, images: ImageServer, path: str, match: str) -> None:
    url = images.url(path)
    with pytest.raises(MediaFetchError, match=match) as info:
        llm.invoke([HumanMessage(content=[{"type": "text", "text": TEXT}, {"type": "image", "url": url}])])
    assert info.value.url == url and url in str(info.value)


def test_too_large_image_url(llm: ChatGGUF, images: ImageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(media, "MAX_IMAGE_BYTES", len(PNG) - 1)
    url = images.url("red.png")
    for call in (lambda m: llm.invoke(m), lambda m: asyncio.run(llm.ainvoke(m))):
        with pytest.raises(MediaFetchError, match="over the") as info:
            call([HumanMessage(content=[{"type": "text", "text": TEXT}, {"type": "image", "url": url}])])
        assert info.value.url == url


def test_a_loopback_url_is_refused_by_default_and_never_reaches_the_server(
        llm: ChatGGUF, images: ImageServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without media_allow_hosts an image URL on 127.0.0.1 is refused before anything connects: neither we nor
    llama-server (which would fetch an http:// URL itself) request it; the same server then fetches it for a
    model that lists the host."""
    monkeypatch.delenv(media.ALLOW_HOSTS_ENV, raising=False)
    strict = ChatGGUF(model_path=llm.model_path, vision=True, **{**PARAMS, "media_allow_hosts": None})
    url = images.url("red.png?strict")
    message = [HumanMessage(content=[{"type": "text", "text": TEXT}, {"type": "image", "url": url}])]
    for call in (lambda: strict.invoke(message), lambda: asyncio.run(strict.ainvoke(message))):
        with pytest.raises(MediaURLRefusedError, match="loopback address") as info:
            call()
        assert info.value.reason == "loopback" and info.value.url == url
    assert images.agents("red.png?strict") == []  # nobody asked for it
    assert strict.engine.info.key == llm.engine.info.key  # the same server, which is alive and answers
    monkeypatch.setenv(media.ALLOW_HOSTS_ENV, "127.0.0.1")
    strict.invoke(message)
    assert images.agents("red.png?strict") == [media._USER_AGENT]
    strict.unload()


def test_https_url_is_fetched_by_us(llm: ChatGGUF) -> None:
    """Our llama-server build answers an https image URL with HTTP 500 "HTTPS is not supported"; we fetch it
    ourselves, so a failure is ours and typed (here: nothing listens on port 9)."""
    url = "https://127.0.0.1:9/red.png"
    with pytest.raises(MediaFetchError, match="could not fetch the image") as info:
        llm.invoke([HumanMessage(content=[{"type": "text", "text": TEXT}, {"type": "image", "url": url}])])
    assert info.value.url == url


def test_base64_does_not_shrink_max_tokens(llm: ChatGGUF, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large image (its base64 is longer than the context in characters) is no reason to cut the reply, nor to
    refuse the prompt: max_tokens is left unset (a server that ends a reply at the context's end) or set to
    context − the prompt's text tokens (a counted one)."""
    import random

    rng = random.Random(0)
    noisy = Image.frombytes("RGB", (512, 512), bytes(rng.getrandbits(8) for _ in range(512 * 512 * 3)))
    buf = io.BytesIO()
    noisy.save(buf, "PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    assert len(data) > 100 * N_CTX
    sent: list[dict[str, Any]] = []
    client = llm.engine.client
    real = client.stream_chat

    def spy(payload: dict[str, Any], deadline: Any = None) -> Iterator[Any]:
        sent.append(copy.deepcopy(payload))
        return real({**payload, "max_tokens": 1}, deadline)  # what would be sent is recorded; one token is enough here

    monkeypatch.setattr(client, "stream_chat", spy)
    content = [{"type": "text", "text": TEXT}, {"type": "image", "base64": data, "mime_type": "image/png"}]
    msg = llm.invoke([HumanMessage(content=content)], max_tokens=None)  # no max_tokens: the engine sets it
    text_tokens = llm.get_num_tokens_from_messages([HumanMessage(content=content)])
    assert text_tokens == llm.get_num_tokens_from_messages([HumanMessage(content=[{"type": "text", "text": TEXT}])])
    if llm.engine.info.ends_at_context:  # the server ends a reply at the context's end: no cap is sent at all
        assert "max_tokens" not in sent[-1]
    else:  # counted: the text's tokens, not the image's bytes
        assert sent[-1]["max_tokens"] == N_CTX - text_tokens
    assert msg.usage_metadata is not None and msg.usage_metadata["input_tokens"] > text_tokens


def test_image_prompt_over_the_context_is_the_servers_typed_overflow(llm: ChatGGUF, image_tokens: int) -> None:
    """Counting covers the text; an image that pushes the prompt past the context is refused by llama-server as
    a ContextOverflowError (not a 500), before any generation."""
    from gguf_provider.errors import ContextOverflowError

    def count(words: int) -> int:
        return llm.engine.count_prompt_tokens({"messages": [{"role": "user", "content": "word " * words}]})

    words = N_CTX - 100
    words += N_CTX - 4 - count(words)  # "word " is one token: the text alone is 4 tokens short of the context
    assert N_CTX - image_tokens < count(words) < N_CTX
    with pytest.raises(ContextOverflowError):
        llm.invoke([HumanMessage(content=[{"type": "text", "text": "word " * words},
                                          {"type": "image", "base64": PNG_B64, "mime_type": "image/png"}])])


def test_attached_server_takes_images_too(llm: ChatGGUF, images: ImageServer, base_tokens: int,
                                         image_tokens: int) -> None:
    """Attached to the same server (base_url = its socket): modalities from /props, URLs fetched by us."""
    address = llm.engine.info.address
    attached = ChatGGUF(base_url=address.socket or address.base_url, api_key=address.api_key, temperature=0,
                        max_tokens=1, media_allow_hosts=LOCAL)
    assert attached.load().engine.modalities()["vision"] is True
    n = _lc_prompt_tokens(attached, [{"type": "text", "text": TEXT}, {"type": "image", "url": images.url("red.png")}])
    assert n - base_tokens == image_tokens
