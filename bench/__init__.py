"""Benchmarks of the gateway: a harness and live studies, each run as ``python -m bench STUDY``."""
