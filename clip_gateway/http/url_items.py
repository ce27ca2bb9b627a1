"""URL items: which JSON items are URLs (only those that say so), and fetching them into image
items under the request's admission, a few at a time (http/fetch.py does each fetch).

A URL item is ``{"image": "http(s)://..."}`` or OpenAI's ``{"type": "image_url", "image_url":
{"url": "http(s)://..."}}``; a bare string is never taken for a URL. Fetched bytes count as the
request's body bytes while they arrive and each image is priced as an upload's once complete
(``Reservation.add``), so a slow or large URL holds what a slow or large upload would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from clip_gateway.errors import InvalidFields, MalformedRequest, UrlFailed, UrlRefused
from clip_gateway.http.fetch import Fetcher, failed
from clip_gateway.http.schemas import InputObject
from clip_gateway.pipeline.admission import Reservation
from clip_gateway.pipeline.items import ImageItem, Item

#: What a refused URL item says when URL items are off.
TURN_ON = "the operator turns them on with GATEWAY_URL_INPUTS=true (docs/API.md, URL items)"


def is_url(value: str) -> bool:
    return value[:8].lower().startswith(("http://", "https://"))


def openai_part(value: InputObject, index: int) -> InputObject:
    """OpenAI's typed part as our own object: ``image_url`` to ``{"image": url}``, ``text`` as
    it is."""
    if value.type == "image_url" and isinstance(value.image_url, msgspec.Struct):
        if value.text is msgspec.UNSET and value.image is msgspec.UNSET:
            return InputObject(image=value.image_url.url)
    elif value.type == "text" and value.image_url is msgspec.UNSET:
        return InputObject(text=value.text)
    raise InvalidFields(
        f'input[{index}]: a typed part is {{"type": "image_url", "image_url": {{"url": ...}}}} '
        'or {"type": "text", "text": ...}',
        index=index,
    )


async def fetch_items(
    items: Sequence[Item], fetcher: Fetcher | None, reservation: Reservation, *, skip: bool
) -> list[Item]:
    """``items`` with every URL item fetched (or, with ``skip``, carrying why it was not) and
    added to ``reservation``; the first refusal is raised otherwise."""
    urls = [i for i, item in enumerate(items) if isinstance(item, ImageItem) and item.url]
    if not urls:
        return list(items)
    if fetcher is None:
        raise MalformedRequest(
            f"input[{urls[0]}] is a URL item, and URL items are off: {TURN_ON}", index=urls[0]
        )
    out, queue = list(items), iter(urls)

    async def fetch_some() -> None:
        for index in queue:  # shared: each worker takes the next URL
            url = str(items[index].url)  # type: ignore[union-attr]
            try:
                item = ImageItem(await fetcher.fetch(url, reservation.received), url=url)
            except (UrlRefused, UrlFailed) as exc:
                error = failed(exc, index, url)
                if not skip:
                    raise error from None
                item = ImageItem(url=url, error=error)
            reservation.add(item)
            out[index] = item

    workers = [asyncio.ensure_future(fetch_some()) for _ in range(fetcher.slots(len(urls)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
    reservation.body_read()  # the fetched bytes no longer count as bodies being received
    return out
