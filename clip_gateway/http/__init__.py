"""The HTTP edge: app, routes, request/response types, API keys, the error map, OpenAPI."""
