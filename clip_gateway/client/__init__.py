"""Python client for the gateway: ``Client`` / ``AsyncClient`` (httpx), paths, bytes or PIL in,
numpy out. Importing it pulls in none of the server's dependencies.

    from clip_gateway.client import Client
    with Client("http://localhost:8000") as client:
        vectors = client.embed(["a.jpg", "b.png"])   # float32 [2, 512], unit length
"""

from clip_gateway.client.aio import AsyncClient
from clip_gateway.client.compact import CompactOptions, compact
from clip_gateway.client.core import ClientError, Embedded, ItemError
from clip_gateway.client.formats import UnreadableImage
from clip_gateway.client.sync import Client

__all__ = [
    "AsyncClient",
    "Client",
    "ClientError",
    "CompactOptions",
    "Embedded",
    "ItemError",
    "UnreadableImage",
    "compact",
]
