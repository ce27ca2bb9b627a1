"""Metrics, tracing, logs and the per-request access middleware."""
