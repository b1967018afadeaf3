"""A finished step's record from the provider: its metadata bounded in size (docs/providers.md,
"What each API's parts become").

Provider metadata (stop details, refusals, token logprobs, Responses message phases, renamed call
ids …) is kept per step in ``StepFinishContext.provider_metadata``, the ``StepFinish`` event and the
step's stored ``StepStartPart``. Logprobs of a long answer run to megabytes, so the record is
bounded: entries are left out, largest first, until its JSON fits :data:`MAX_STEP_METADATA_BYTES`,
and a warning names each one left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

from turnwire.values import NotJsonError, dumps, normalize, struct_view

MAX_STEP_METADATA_BYTES = 64 << 10
"""The most JSON a step's provider metadata keeps (64 KiB), per step."""


def bounded_metadata(
    metadata: Mapping[str, Any] | None, max_bytes: int = MAX_STEP_METADATA_BYTES
) -> tuple[dict[str, Any] | None, struct_pb2.Struct | None, list[str]]:
    """``(metadata, view, warnings)``: ``metadata`` (keyed by API, each a mapping of entries) with
    its largest entries left out until its JSON is at most ``max_bytes``; its ``Struct`` view
    (None when it has no exact one, e.g. an integer beyond 2**53: informational, so not stored);
    a warning per entry left out, naming it and its size. ``(None, None, [])`` for no metadata."""
    if not metadata:
        return None, None, []
    try:
        kept: dict[str, Any] = normalize(dict(metadata))
    except NotJsonError as problem:
        return None, None, [f"the provider metadata was not kept: {problem}"]
    warnings: list[str] = []
    size = len(dumps(kept).encode())
    while size > max_bytes:
        entries = [
            (len(dumps(value).encode()), api, key)
            for api, record in kept.items()
            if isinstance(record, dict)
            for key, value in record.items()
        ]
        entries.extend(
            (len(dumps(value).encode()), api, None)
            for api, value in kept.items()
            if not isinstance(value, dict)
        )
        if not entries:  # only empty records left, still over a tiny bound
            return None, None, warnings
        entry_size, api, key = max(entries, key=lambda entry: entry[0])
        if key is None:
            del kept[api]
            name = api
        else:
            kept[api] = {k: v for k, v in kept[api].items() if k != key}
            name = f"{api}.{key}"
        warnings.append(
            f"provider metadata {name} ({entry_size:,} bytes of JSON) was not kept: a step keeps at "
            f"most {max_bytes:,} bytes"
        )
        size = len(dumps(kept).encode())
    return kept, struct_view(kept), warnings
