"""The HTTP edge. Here, the inbound API: app, routes, request bodies and forms, request/response
types, API keys, the error map, OpenAPI. In ``immich/``, Immich's protocol and its upstream; in
``urls/``, the outbound fetcher of URL items."""
