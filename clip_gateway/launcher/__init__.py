"""The launcher: the one launch path (``supervisor.py``) and the processes it starts, supervises
and stops: the exporter (``served_export.py``), tritonserver on its rendered model repository
(``local.py``, ``repository.py``) and the gateway's HTTP process (``gateway.py``); ``host.py`` is
what the profiles may ask of them. What to serve is the profiles' (clip_gateway/profiles);
settings, timings and the worker plan are the configuration's (clip_gateway/config)."""
