"""Configuration: settings, timings, the core plan, memory and process limits (the bottom layer)."""
