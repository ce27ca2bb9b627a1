"""Read Prometheus exposition text the way a scraper does; a missing sample is a failure."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return found


def sample(text: str, name: str, **labels: str) -> float:
    """The value of ``name{labels}``; AssertionError when the scrape has no such sample."""
    key = (name, frozenset(labels.items()))
    found = samples(text)
    if key not in found:
        near = sorted({n for n, _ in found if n.startswith(name.split("_")[0])})
        raise AssertionError(f"no sample {name}{labels or ''} in the scrape; names: {near}")
    return found[key]


def sample_or_zero(text: str, name: str, **labels: str) -> float:
    """For counters with labels that appear only once incremented: 0 when absent, but the
    metric family itself must exist (a removed metric still fails)."""
    families = {f.name for f in text_string_to_metric_families(text)}
    stems = {name} | {name.removesuffix(s) for s in ("_total", "_count", "_sum", "_bucket")}
    if not stems & families:
        raise AssertionError(f"no metric family for {name} in the scrape")
    return samples(text).get((name, frozenset(labels.items())), 0.0)
