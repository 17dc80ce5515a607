"""The live batcher (server/batcher.py): when the C heap's free pages go back to the system."""

from __future__ import annotations

import asyncio

import pytest

import elmo_cache
from elmo_cache.server import batcher as batcher_module
from elmo_cache.server.batcher import LiveBatcher
from elmo_cache.server.metrics import Metrics


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


def _recording(encoder, monkeypatch) -> tuple[list[str], LiveBatcher]:
    """A batcher over the real encoder whose encoder calls and heap trims are written down in order."""
    events: list[str] = []

    def encode(sentences):
        events.append(f"encode {len(sentences)}")
        return encoder.embed_batch(sentences)

    monkeypatch.setattr(batcher_module, "trim_heap", lambda: bool(events.append("trim")) or True)
    # Budget of 4 tokens: two 3-token requests never share a batch.
    return events, LiveBatcher(encode, metrics=Metrics(), batch_tokens=4, max_wait_s=0.05)


async def _settled(events: list[str], count: int) -> None:
    """Wait (at most 5 s) until ``count`` events are written down: the trim runs after the answers are out."""
    for _ in range(500):
        if len(events) >= count:
            return
        await asyncio.sleep(0.01)


def test_the_heap_is_trimmed_once_the_queue_is_empty(encoder, monkeypatch):
    events, batcher = _recording(encoder, monkeypatch)

    async def scenario():
        await batcher.start()
        try:
            answer, _ = await batcher.submit([["the", "cat", "sat"]], lambda arrays: arrays)
            await _settled(events, 2)
            return answer
        finally:
            await batcher.close()

    answer = asyncio.run(scenario())
    assert answer[0].shape[1] == 3
    assert events == ["encode 1", "trim"]


def test_the_heap_is_not_trimmed_between_the_batches_of_a_burst(encoder, monkeypatch):
    """Three requests queued at once make three batches (each fills the budget); the pages the first batch frees
    are used again by the next, so the heap is trimmed once, after the last."""
    events, batcher = _recording(encoder, monkeypatch)
    requests = [["the", "cat", "sat"], ["a", "dog", "ran"], ["one", "more", "line"]]

    async def scenario():
        await batcher.start()
        try:
            answers = await asyncio.gather(*(batcher.submit([tokens], lambda arrays: arrays) for tokens in requests))
            await _settled(events, 4)
            return answers
        finally:
            await batcher.close()

    answers = asyncio.run(scenario())
    assert [answer[0].shape[1] for answer, _ in answers] == [3, 3, 3]
    assert events == ["encode 1", "encode 1", "encode 1", "trim"]
