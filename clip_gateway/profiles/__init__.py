"""What to serve here: choosing, building, gating and timing a profile, and a CPU profile's core
plan. The supervisor asks one question (``choice.Selection``) and gets one answer
(``choice.Serving``); every process the answer needs (the exporter, a tritonserver to time a
profile in) is the launcher's to start (``host.Host``). pyproject.toml's import contracts place
this package between the launcher and the HTTP edge."""
