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

from gguf_provider import ChatGGUF, MediaFetchError, UnsupportedInputError, media
from gguf_provider.limits import char_bound, template_payload
from gguf_provider.llama_index import GGUF
from tests.support.replay import BASE_URL, Replay, load_replay

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()
URL = "https://images.example/cat.png"


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
    for url in ("file:///etc/passwd", "ftp://host/x.png", "cat.png"):
        with pytest.raises(MediaFetchError, match="neither http"):
            media.prepare({"messages": _user(_image(url))}, {"vision": True}, model="m")


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


