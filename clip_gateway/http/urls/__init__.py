"""The outbound URL fetcher: URL items (``{"image": "https://..."}``) fetched under the
request's admission and deadline (``items.py``), each URL parsed into exactly what is fetched
(``targets.py``), vetted by the deny list and allowlist (``guard.py``), fetched in the worker's
slots (``slots.py``) by httpcore pinned to the vetted address (``fetch.py``) on connections that
read no further ahead than the fetch counts (``streams.py``). Nothing of the inbound API or of
Immich's protocol is imported here."""
