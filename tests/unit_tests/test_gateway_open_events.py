"""gateway/common.open_events with a wait, offline: fakes stand in for the model pool and the reply (the real
gateway's keep-alives over a real server: tests/integration_tests/test_gateway_keepalive.py). Every fake step is
an asyncio.Event the test sets, so nothing depends on a clock but the waits' own, which are made short."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gguf_provider.gateway.common import WAITING, open_events

WAIT = 0.01


class Fake:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.go = asyncio.Event()
        self.fail = fail
        self.entered = self.exited = self.closed = False

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Any]:
        self.entered = True
        try:
            yield object()
        finally:
            self.exited = True

    async def reply(self, engine: Any) -> AsyncGenerator[str, None]:
        try:
            await self.go.wait()
            if self.fail is not None:
                raise self.fail
            yield "a"
            yield "b"
        finally:
            self.closed = True


async def collect(events: AsyncIterator[Any], fake: Fake, release_after: int) -> list[Any]:
    out: list[Any] = []
    async for ev in events:
        out.append(ev)
        if len(out) == release_after:
            fake.go.set()
    return out


def test_a_first_event_that_comes_in_time_is_at_hand_as_before() -> None:
    async def main() -> None:
        fake = Fake()
        fake.go.set()
        opened = await open_events(fake.use(), fake.reply, wait=60)
        assert [ev async for ev in opened.events()] == ["a", "b"]
        assert fake.exited and fake.closed

    asyncio.run(main())


def test_a_late_first_event_is_waited_for_with_keepalives() -> None:
    async def main() -> None:
        fake = Fake()
        opened = await open_events(fake.use(), fake.reply, wait=WAIT)
        out = await collect(opened.events(), fake, release_after=3)
        assert out == [WAITING, WAITING, WAITING, "a", "b"]
        assert fake.exited and fake.closed

    asyncio.run(main())


def test_an_error_before_the_first_event_is_raised_by_the_events_once_the_head_went() -> None:
    async def main() -> None:
        fake = Fake(fail=ValueError("too long"))
        opened = await open_events(fake.use(), fake.reply, wait=WAIT)
        seen: list[Any] = []
        with pytest.raises(ValueError, match="too long"):
            async for ev in opened.events():
                seen.append(ev)
                fake.go.set()
        assert seen == [WAITING] and fake.exited

    asyncio.run(main())


def test_an_error_within_the_wait_is_raised_by_open_events() -> None:
    async def main() -> None:
        fake = Fake(fail=ValueError("too long"))
        fake.go.set()
        with pytest.raises(ValueError, match="too long"):
            await open_events(fake.use(), fake.reply, wait=60)
        assert fake.exited

    asyncio.run(main())


def test_closing_while_the_first_event_is_pending_cancels_it_and_gives_the_model_back() -> None:
    async def main() -> None:
        fake = Fake()
        opened = await open_events(fake.use(), fake.reply, wait=WAIT)
        events = aiter(opened.events())
        assert await anext(events) is WAITING
        await events.aclose()  # what the stream does when the client left
        assert fake.entered and fake.exited and fake.closed

    asyncio.run(main())


def test_a_caller_that_leaves_during_the_wait_cancels_it() -> None:
    async def main() -> None:
        fake = Fake()
        task = asyncio.ensure_future(open_events(fake.use(), fake.reply, wait=60))
        while not fake.entered:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fake.exited

    asyncio.run(main())
