"""Configuration: settings, timings, the worker plan, memory and process limits (the bottom
layer)."""
