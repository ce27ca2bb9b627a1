"""Immich's machine-learning protocol (docs/IMMICH.md): its routes (``routes.py``), its form
(``form.py``), and Immich's own ML server behind this one for what the gateway does not serve
(``passthrough.py`` decides and forwards, ``upstream.py`` is the client)."""
