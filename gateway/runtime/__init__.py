"""Settings, the supervisor (one launch path), child processes, worker plan, GPU profiles."""
