"""The /metrics of several replicas as one Prometheus exposition, each sample labelled with its replica's id."""

from __future__ import annotations

from collections.abc import Iterator

from ovbuild.errors import MissingDependencyError


def labelled(expositions: dict[str, bytes], label: str = "replica") -> bytes:
    """Merge replicas' expositions ({replica id: text format}): every family once, every sample with `label`."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.metrics_core import Metric
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as e:
        raise MissingDependencyError("serving needs prometheus-client: pip install 'ovbuild[serve]'") from e

    families: dict[str, Metric] = {}
    for replica, text in sorted(expositions.items()):
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for s in family.samples:
                merged.add_sample(s.name, {**s.labels, label: replica}, s.value, s.timestamp, s.exemplar)

    class Merged:
        def collect(self) -> Iterator[Metric]:
            yield from families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Merged())
    return generate_latest(registry)
