"""Where GetConversation places a turn without a stored reply among the messages, and which
page lists it (``turnwire_server.turn_places``, ``turnwire_server.api.message_pages``;
docs/semantics.md §5)."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from turnwire_client.v1 import message_pb2
from turnwire_server.api.message_pages import on_page
from turnwire_server.turn_places import turn_places


def _at(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def _created(*times: timestamp_pb2.Timestamp | None) -> list[message_pb2.Message]:
    return [message_pb2.Message(id=f"m{i}", create_time=t) for i, t in enumerate(times)]


def test_a_turn_sits_after_its_own_input_even_with_sub_microsecond_create_times() -> None:
    """The store keeps a turn's start to the microsecond; its input's create_time (the same
    instant) may carry nanoseconds, and must not count as created after the start."""
    messages = _created(_at(10), _at(20, 123_456_789), _at(30))
    assert turn_places(messages, [_at(20, 123_456_000)]) == [2]


def test_places_before_every_message_between_and_after_the_last() -> None:
    messages = _created(_at(10), _at(20), _at(30))
    assert turn_places(messages, [_at(5), _at(10), _at(25), _at(30), _at(99)]) == [0, 1, 2, 3, 3]


def test_a_clock_that_went_back_does_not_move_a_turn_before_later_messages() -> None:
    """Replicas' clocks may disagree: a message created "earlier" than the one before it does
    not pull a turn started after the first one past it (running maximum)."""
    messages = _created(_at(10), _at(40), _at(20), _at(50), None)
    assert turn_places(messages, [_at(30), _at(45)]) == [1, 3]


def test_each_place_is_on_exactly_one_page() -> None:
    pages = [(0, 2), (2, 4), (4, 5)]
    for place in range(6):
        listed = [page for page in pages if on_page(place, *page)]
        assert len(listed) == 1, (place, listed)
    assert on_page(0, 0, 2) and on_page(2, 0, 2) and on_page(3, 2, 4) and on_page(5, 4, 5)
    assert on_page(0, 0, 0)  # an empty conversation's one page lists a turn before every message
