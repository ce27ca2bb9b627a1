"""A worker's URL fetch slots (http/urls/slots.py): taken at once or not at all, within the worker's
total, one request's share and one API key's, and given back one by one."""

from __future__ import annotations

import pytest

from clip_gateway.http.urls.slots import FetchSlots


def test_a_request_takes_at_most_its_share_and_leaves_the_rest() -> None:
    slots = FetchSlots(total=32, per_request=8, per_key=32, fetch_timeout_s=10)
    first, second = slots.lease(None), slots.lease(None)
    assert first.take(256) == 8 and first.take(1) == 0  # its share, however many URLs
    assert second.take(3) == 3 and slots.held == 11
    for _ in range(8):
        first.give()
    assert slots.held == 3 and first.take(100) == 8


def test_the_total_holds_however_many_requests_take_at_once() -> None:
    slots = FetchSlots(total=32, per_request=8, per_key=32, fetch_timeout_s=10)
    leases = [slots.lease(None) for _ in range(16)]
    taken = [lease.take(32) for lease in leases]
    assert taken == [8, 8, 8, 8] + [0] * 12 and slots.held == 32
    refusal = leases[-1].refusal()
    assert refusal.reason == "32 URL fetches in flight, the most this worker runs at once"
    assert refusal.retry_after == 1.0  # nothing fetching yet: at least a second


def test_one_api_key_holds_at_most_its_share() -> None:
    slots = FetchSlots(total=32, per_request=8, per_key=16, fetch_timeout_s=10)
    mine = [slots.lease("key-a") for _ in range(3)]
    assert [lease.take(8) for lease in mine] == [8, 8, 0]
    assert slots.lease("key-b").take(8) == 8  # another key's requests still get slots
    refusal = mine[2].refusal()
    assert "this API key has 16 URL fetches in flight" in refusal.reason
    for _ in range(8):
        mine[0].give()
    assert slots.by_key == {"key-a": 8, "key-b": 8} and mine[2].take(8) == 8


def test_a_per_request_share_over_the_total_is_the_total() -> None:
    slots = FetchSlots(total=4, per_request=8, per_key=0, fetch_timeout_s=10)
    assert (slots.per_request, slots.per_key) == (4, 1)


def test_retry_after_is_when_the_oldest_fetch_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    slots = FetchSlots(total=1, per_request=1, per_key=1, fetch_timeout_s=10)
    now = [100.0]
    monkeypatch.setattr("clip_gateway.http.urls.slots.time.monotonic", lambda: now[0])
    with slots.fetching():
        now[0] = 103.5
        with slots.fetching():
            assert slots.retry_after() == 7.0  # 100 + 10 - 103.5, rounded up
        now[0] = 112.0
        assert slots.retry_after() == 1.0  # overdue: at least a second
    assert slots.retry_after() == 1.0
