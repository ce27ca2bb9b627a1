"""The embedding pipeline (no HTTP): items, admission, batch decoding, the service, the canary."""
