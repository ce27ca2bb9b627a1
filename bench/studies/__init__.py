"""The bench's studies: each a subcommand of ``python -m bench`` (bench/README.md lists them,
live or concluded), each importing only bench.harness and the gateway, never another study."""
