"""The `/metrics` body: prometheus_client's two text formats, byte for byte, at a fraction of their cost.

prometheus_client (0.2x) checks and escapes every metric and label name of every sample at every scrape,
and its OpenMetrics encoder (what Prometheus asks for) escapes each sample's name a character at a time:
most of a scrape's CPU on this exporter. The names here come from the metric catalogue and the label
values from bounded sets, so the same few hundred strings are checked again and again. This encoder
writes what prometheus_client writes (a test holds every capture's exposition, both formats, to it) and
remembers the escaped form of each name and label pair it has met, in bounded caches.

Content negotiation stays prometheus_client's (`choose_encoder`): the fast path serves the text format
and OpenMetrics 1.0.0 where names are escaped to underscores or may be UTF-8 (the two leave a legacy name
as it is); any other answer (OpenMetrics 2.0, dotted escaping) is prometheus_client's own, and so is any
family the fast path does not cover (exemplars, native histograms, a time stamp, a name outside the
legacy character set).

    >>> from prometheus_client.core import GaugeMetricFamily
    >>> g = GaugeMetricFamily("demo_cells", "Cells held.", labels=["client"])
    >>> g.add_metric(['a"b'], 3)
    >>> class Demo:
    ...     def collect(self): return [g]
    >>> encoder, content_type = choose("")
    >>> print(encoder(Demo()).decode(), end="")
    # HELP demo_cells Cells held.
    # TYPE demo_cells gauge
    demo_cells{client="a\\"b"} 3.0
    >>> content_type
    'text/plain; version=0.0.4; charset=utf-8'
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, cast

from prometheus_client import generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from prometheus_client.validation import _is_valid_legacy_labelname, _is_valid_legacy_metric_name

Encoder = Callable[[Collector], bytes]

# prometheus_client's own functions, typed (the library leaves these two unannotated).
_go_float = cast(Callable[[float], str], floatToGoString)
_library_text = cast(Callable[[Collector, str], bytes], generate_latest)
_library_openmetrics = cast(Callable[..., bytes], om.generate_latest)

#: Entries each cache holds before it starts again (label values are bounded, but a cache must be too).
CACHE_ENTRIES = 8192

# The text format moves these OpenMetrics samples into a gauge family of their own, after the family.
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
# Escapings that leave a name in the legacy character set as it is (the fast path writes only such names).
_LEGACY_KEPT = (om.UNDERSCORES, om.ALLOWUTF8)
_TEXT_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


class _Cache(dict[Any, str]):
    """A dict that forgets everything once it holds `CACHE_ENTRIES` (the next scrape fills it again)."""

    def put(self, key: Any, value: str) -> str:
        if len(self) >= CACHE_ENTRIES:
            self.clear()
        self[key] = value
        return value


_label_pairs = _Cache()  # (name, value) -> 'name="value"', the value escaped (both formats write it so)
# A sample's labels, as its dict lists them -> '{a="x",b="y"}', sorted by name: most of a scrape's label sets
# (a histogram's buckets, a slot's series) are the same at every scrape.
_label_sets = _Cache()
_values = _Cache()  # a sample's value -> as both formats write it (Go's float format)
_text_names = _Cache()  # sample name -> itself, once seen to be in the legacy character set
_om_names = _Cache()  # sample name -> as OpenMetrics writes it (names escaped to underscores)


def cached() -> int:
    """Entries held by the fullest cache (never more than `CACHE_ENTRIES`)."""
    return max(len(c) for c in (_label_pairs, _label_sets, _values, _text_names, _om_names))


class _Slow(Exception):
    """A family the fast path does not write: prometheus_client writes it."""


def _pair(key: tuple[str, str]) -> str:
    name, value = key
    if not _is_valid_legacy_labelname(name):
        raise _Slow
    escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return _label_pairs.put(key, f'{name}="{escaped}"')


def _label_set(key: tuple[tuple[str, str], ...]) -> str:
    pairs = _label_pairs
    return _label_sets.put(key, "{" + ",".join([pairs.get(pair) or _pair(pair) for pair in sorted(key)]) + "}")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    key = tuple(labels.items())
    return _label_sets.get(key) or _label_set(key)


def _value(value: float) -> str:
    if value == 0:  # 0.0 and -0.0 are one key, two texts (a histogram's empty buckets: often)
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    return _values.get(value) or _values.put(value, _go_float(value))


def _text_name(name: str) -> str:
    if not _is_valid_legacy_metric_name(name):
        raise _Slow
    return _text_names.put(name, name)


def _om_name(name: str) -> str:
    if not _is_valid_legacy_metric_name(name):
        raise _Slow
    return _om_names.put(name, om._escape(name, om.UNDERSCORES, om._is_legacy_labelname_rune))


class _One:
    """A collector of one family, for prometheus_client's own encoders (the families the fast path leaves)."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def _text_family(metric: Metric) -> list[str]:
    name, kind = metric.name, metric.type
    if not _is_valid_legacy_metric_name(name):
        raise _Slow
    if kind == "counter":
        name += "_total"
    elif kind == "info":
        name += "_info"
    help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {name} {help_text}\n# TYPE {name} {_TEXT_TYPES.get(kind, kind)}\n"]
    moved: dict[str, list[str]] = {}
    names, base = _text_names, metric.name
    # A sample unpacked rather than read by attribute: the hot loop of a scrape.
    for sample, labels, value, timestamp, exemplar, native in metric.samples:
        if timestamp is not None or exemplar is not None or native is not None:
            raise _Slow
        line = f"{names.get(sample) or _text_name(sample)}{_labels(labels)} {_value(value)}\n"
        if sample.endswith(_OM_SUFFIXES) and sample.startswith(base) and sample[len(base) :] in _OM_SUFFIXES:
            moved.setdefault(sample[len(base) :], []).append(line)
        else:
            out.append(line)
    for suffix, lines in sorted(moved.items()):
        out.append(f"# HELP {base}{suffix} {help_text}\n# TYPE {base}{suffix} gauge\n")
        out.extend(lines)
    return out


def text(registry: Collector, escaping: str = om.UNDERSCORES) -> bytes:
    """The text format, as `prometheus_client.generate_latest` writes it (`escaping`: one that leaves a legacy
    name as it is)."""
    out: list[str] = []
    for metric in registry.collect():
        try:
            out.extend(_text_family(metric))
        except _Slow:
            out.append(_library_text(_One(metric), escaping).decode("utf-8"))
    return "".join(out).encode("utf-8")


def _om_family(metric: Metric) -> list[str]:
    name = metric.name
    if not _is_valid_legacy_metric_name(name):
        raise _Slow
    help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    out = [f"# HELP {name} {help_text}\n# TYPE {name} {metric.type}\n"]
    if metric.unit:
        out.append(f"# UNIT {name} {metric.unit}\n")
    names = _om_names
    for sample, labels, value, timestamp, exemplar, native in metric.samples:
        if timestamp is not None or exemplar is not None or native is not None:
            raise _Slow
        text = _value(value) if value is not None else ""
        out.append(f"{names.get(sample) or _om_name(sample)}{_labels(labels)} {text}\n")
    return out


def openmetrics(registry: Collector, escaping: str = om.UNDERSCORES) -> bytes:
    """OpenMetrics 1.0.0, as prometheus_client's encoder writes it (`escaping`: as for `text`)."""
    out: list[str] = []
    for metric in registry.collect():
        try:
            out.extend(_om_family(metric))
        except _Slow:
            body = _library_openmetrics(_One(metric), escaping=escaping, version="1.0.0")
            out.append(body.decode("utf-8").removesuffix("# EOF\n"))
    out.append("# EOF\n")
    return "".join(out).encode("utf-8")


def choose(accept: str) -> tuple[Encoder, str]:
    """The encoder and content type for a request's Accept header: prometheus_client's choice, rendered by
    the fast path where it is one of the two default formats."""
    encoder, content_type = choose_encoder(accept)
    if encoder is generate_latest:
        return text, content_type
    if isinstance(encoder, functools.partial) and (escaping := encoder.keywords.get("escaping")) in _LEGACY_KEPT:
        if encoder.func is generate_latest and encoder.keywords.keys() == {"escaping"}:
            return functools.partial(text, escaping=escaping), content_type
        if encoder.func is om.generate_latest and encoder.keywords.get("version") == "1.0.0":
            return functools.partial(openmetrics, escaping=escaping), content_type
    return encoder, content_type
