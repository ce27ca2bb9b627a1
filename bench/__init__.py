"""Benchmarks: our gateway beside the baselines of the background reports, one command."""
