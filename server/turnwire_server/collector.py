"""The garbage collector's settings for a serving process (issue 33: what a turn costs; the
measurements: bench/ttft.md, "Issue 33: per-request CPU" and "the collector's passes").

``turnwire serve`` calls :func:`tune_collector` once start-up is done; the benches that run a
sidecar in process call it too, so they measure the collector a served turn meets
(``bench/gc_probe`` records its passes). A turn's own objects do not need the collector unless it
ended in an error: they are freed by reference counting when it ends (docs/architecture.md, "A
turn's objects").
"""

from __future__ import annotations

import gc

__all__ = ["GC_THRESHOLDS", "tune_collector"]

GC_THRESHOLDS = (10_000, 10, 10)
"""``gc.set_threshold`` of ``turnwire serve`` once started (Python's default: 700, 10, 10). A turn
in flight holds a few thousand young objects (events, records, the SDK's request and response):
at 700 the youngest pass runs several times per turn and promotes what is merely in flight, so
objects that die a moment later fill the older generations and set off full passes (tens of ms
each over the objects loaded after start-up, the price list among them). At 10,000 most of a
turn's objects die before a pass sees them (bench/ttft.md, "Issue 33: per-request CPU")."""


def tune_collector() -> None:
    """Set the garbage collector for serving, once start-up is done (``turnwire serve``, and the
    benches that measure a served turn): what start-up built (modules, descriptors, the engine)
    lives as long as the process, so it is collected once and frozen out of the collector's full
    passes, which otherwise walk it all each time (tens of ms at 100k+ objects) as objects held a
    while (queued spans, stream buffers) pile up; then :data:`GC_THRESHOLDS`."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
