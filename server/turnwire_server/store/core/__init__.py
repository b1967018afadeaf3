"""The store's shared implementation: what both drivers run, written once.

Row codecs (:mod:`.rows`, :mod:`.stream_rows`, :mod:`.submission_rows`), the reads both
dialects accept (:mod:`.reads`), the write programs and the pure rules they decide with
(:mod:`.sql`, :mod:`.turn_writes`, :mod:`.message_writes`, :mod:`.retention_writes`,
:mod:`.lease_writes`, :mod:`.tool_answers`, :mod:`.submission_rules`, :mod:`.migration_rules`),
and the helpers both drivers share (:mod:`.message_cache`, :mod:`.local_lock`, :mod:`.partial_replies`).

Only the drivers (:mod:`turnwire_server.store.sqlite`, :mod:`turnwire_server.store.postgres`)
import this package; the engine and hooks see the store through the interface at the
store's top level (:mod:`turnwire_server.store.base` and the role modules it joins,
:mod:`~turnwire_server.store.records`, :mod:`~turnwire_server.store.errors`,
:mod:`~turnwire_server.store.waiting_calls`).
"""
