"""Two layers in one package: at the bottom settings, the timings and the worker plan derived
from them, the allocator, child processes and ports; on top the launcher (the supervisor, the
model to serve, GPU profiles, the local tritonserver, repository rendering). pyproject.toml's
import contracts name which module is which."""
