"""Replies that never end on their own, for tests that act while a turn runs.

A finite slow reply ("60 words, 50 ms each") only hopes to outlast what the test does next; on
a loaded machine it can end first, and the test fails, or passes without testing its point. A
scripted step with ``until_cancelled: true`` streams its text again and again until the turn is
cancelled (turnwire.testing), so the test must end it: a cancel, an interrupt, a signal.
"""

from __future__ import annotations

from typing import Any


def endless_step(text: str, delay_ms: float) -> dict[str, Any]:
    """A scripted step (YAML/JSON form) streaming ``text`` over and over, one delta every
    ``delay_ms``. End ``text`` with a space so the last and first words stay apart."""
    return {"text": text, "delay_ms": delay_ms, "until_cancelled": True}


def is_prefix_of_repeats(part: str, text: str) -> bool:
    """True when ``part`` is a prefix of ``text`` repeated: what an endless step streamed or
    stored, cut anywhere."""
    return (text * (len(part) // len(text) + 1)).startswith(part)
