"""URL items fetched into image items under the request's admission and deadline, in the fetch
slots the request gets (http/urls/slots.py; http/urls/fetch.py does each fetch). Which items
are URL items the request's parser says (http/parsing.py: only those that say so).

Every URL is parsed (http/urls/targets.py) before any is fetched, and the request is checked against
admission at the cheapest its URL items could cost, so a request that cannot be served does no
network work. Fetched bytes count as the request's body bytes while they arrive, and each image is
priced as an upload's once complete (``Reservation.add``), all held together when the last fetch is
done, as a body's items are: a slow or large URL holds what a slow or large upload would. A URL that
gave no image costs no model work: its price is the time it held a fetch slot, which the request's
and its key's slot shares bound. The fetches end by ``fetch_window``: the request's deadline less
the admission horizon (what its admitted work is given to finish in), so a request answers within
its deadline however many of its URLs are dead; a URL not fetched by then is refused like one that
timed out.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from clip_gateway.errors import MalformedRequest, UrlFailed, UrlRefused
from clip_gateway.http.urls.fetch import Fetcher, failed
from clip_gateway.http.urls.targets import Target, parse
from clip_gateway.imaging import work
from clip_gateway.pipeline.admission import Reservation
from clip_gateway.pipeline.items import ImageItem, Item

#: What a refused URL item says when URL items are off.
TURN_ON = "the operator turns them on with GATEWAY_URL_INPUTS=true (docs/API.md, URL items)"


def has_urls(items: Sequence[Item]) -> bool:
    return any(isinstance(item, ImageItem) and item.url for item in items)


def fetch_window(request_timeout_s: float, horizon_s: float) -> float:
    """Seconds a request's URL items are fetched in: its deadline less the admission horizon,
    and at least a quarter of the deadline (when the horizon is the whole deadline)."""
    return max(request_timeout_s - horizon_s, request_timeout_s / 4)


def fetcher_for(items: Sequence[Item], fetcher: Fetcher | None) -> Fetcher:
    """The fetcher for a request with URL items; refused naming the first when they are off."""
    if fetcher is None:
        index = next(i for i, item in enumerate(items) if isinstance(item, ImageItem) and item.url)
        raise MalformedRequest(
            f"input[{index}] is a URL item, and URL items are off: {TURN_ON}", index=index
        )
    return fetcher


async def fetch_items(
    items: Sequence[Item],
    fetcher: Fetcher,
    reservation: Reservation,
    *,
    skip: bool,
    window_s: float,
) -> list[Item]:
    """``items`` with every URL item fetched within ``window_s`` (or, with ``skip``, carrying
    why it was not) and added to ``reservation``; the first refusal is raised otherwise."""
    indices = [i for i, item in enumerate(items) if isinstance(item, ImageItem) and item.url]
    if not indices:
        return list(items)
    out = list(items)
    targets = _parsed(out, indices, skip)
    admission = reservation.admission
    cheapest = len(targets) * admission.image_cost(work.REFUSED)  # a model call each, at least
    admission.check(cheapest, request_total=reservation.cost + reservation.pending + cheapest,
                    key=reservation.key)  # fmt: skip
    reservation.receiving()
    for index in indices:
        if out[index] is not items[index]:  # refused as parsed: added as it is
            reservation.add(out[index])
    if targets:
        await _fetch_all(out, targets, fetcher, reservation, skip, window_s)
    reservation.body_read()  # the fetched bytes are no longer being received; their costs held
    return out


#: A URL item to fetch: its index in the request, its URL as sent, what will be asked for.
Fetch = tuple[int, str, Target]


def _parsed(out: list[Item], indices: list[int], skip: bool) -> deque[Fetch]:
    """Every URL item's target; one that cannot be fetched is refused now (with ``skip``, put
    in ``out`` carrying its refusal), before any network work."""
    targets: deque[Fetch] = deque()
    for index in indices:
        url = str(out[index].url)  # type: ignore[union-attr]
        try:
            targets.append((index, url, parse(url)))
        except UrlRefused as exc:
            error = failed(exc, index, url)
            if not skip:
                raise error from None
            out[index] = ImageItem(url=url, error=error)
    return targets


async def _fetch_all(
    out: list[Item],
    targets: deque[Fetch],
    fetcher: Fetcher,
    reservation: Reservation,
    skip: bool,
    window_s: float,
) -> None:
    """Fetch ``targets`` into ``out`` in the slots this request gets: as many as it may take
    now (none: Overloaded, at once), and more as they free up while URLs are left; each slot
    runs one fetch at a time and is given back when none is left for it. What is not fetched
    within ``window_s`` is refused as late."""
    lease = fetcher.slots.lease(reservation.key)
    unfetched = {index: (url, out[index]) for index, url, _ in targets}
    tasks: set[asyncio.Future[None]] = set()

    async def fetch_some() -> None:
        try:
            while targets:
                index, url, target = targets.popleft()
                item = await _fetched(fetcher, target, url, index, skip, reservation)
                reservation.add(item)
                out[index] = item
                start(lease.take(len(targets)))  # slots other requests gave back meanwhile
        finally:
            lease.give()

    def start(count: int) -> None:
        for _ in range(count):
            tasks.add(asyncio.ensure_future(fetch_some()))

    first = lease.take(len(targets))
    if not first:
        raise lease.refusal()
    start(first)
    try:
        async with asyncio.timeout(window_s):
            while tasks:
                ended, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
                tasks.difference_update(ended)
                for task in ended:
                    task.result()  # the first refusal, raised
    except TimeoutError:
        pass  # what is not fetched now is refused below
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for index, (url, original) in unfetched.items():
        if out[index] is original:
            out[index] = _late(index, url, window_s, skip)
            reservation.add(out[index])


async def _fetched(
    fetcher: Fetcher, target: Target, url: str, index: int, skip: bool,
    reservation: Reservation,
) -> ImageItem:  # fmt: skip
    """Item ``index`` fetched, or (with ``skip``) carrying why it was not."""
    try:
        return ImageItem(await fetcher.fetch(target, reservation), url=url)
    except (UrlRefused, UrlFailed) as exc:
        error = failed(exc, index, url)
        if not skip:
            raise error from None
        return ImageItem(url=url, error=error)


def _late(index: int, url: str, window_s: float, skip: bool) -> ImageItem:
    """Item ``index``, not fetched within the window: refused (raised, unless ``skip``)."""
    error = failed(
        UrlFailed(
            f"not fetched within the {window_s:g} s the request's deadline leaves for fetching "
            "its URL items; send fewer URLs, or URLs that answer sooner",
            rule="deadline",
        ),
        index,
        url,
    )
    if not skip:
        raise error
    return ImageItem(url=url, error=error)
