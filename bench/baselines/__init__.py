"""Baselines from the background reports, written the way the reports describe them."""
