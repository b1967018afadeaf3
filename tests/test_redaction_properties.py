"""Secret masking replaces the secret alone (``turnwire_server.redaction.Redactor``): the text
around it, the punctuation right after it included, and ordinary words are kept, in any line."""

from __future__ import annotations

import logging
import string
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from turnwire_server.logs import formatter_for
from turnwire_server.redaction import MASK, Redactor

# Words a log line holds that sit next to secrets' names but are no secrets.
TRICKY_WORDS = ["bearer", "Bearer", "basic", "token", "tokens", "Token", "authorization", "password", "key"]
WORDS = st.one_of(st.sampled_from(TRICKY_WORDS), st.from_regex(r"[a-z]{1,12}", fullmatch=True))
SEPARATORS = st.sampled_from([" ", ", ", ". ", " (", ") ", "; ", "! ", "? ", " [", "] ", "'s "])


@st.composite
def prose(draw: st.DrawFn) -> str:
    """Words and punctuation with no secret in them."""
    words = draw(st.lists(WORDS, min_size=1, max_size=12))
    return "".join(word + draw(SEPARATORS) for word in words)


# A credential: letters and digits, with at least one of each (a key's random part).
SECRETS = st.text(string.ascii_letters + string.digits, min_size=12, max_size=40).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isalpha() for c in s)
)
# Punctuation that closes a clause or a bracket right after a secret.
CLOSERS = st.text(")]>.,:;!?", min_size=1, max_size=3)

Form = Callable[[str], tuple[str, str]]
"""A secret in the context that marks it: the text, and the text masked."""

FORMS: list[Form] = [
    lambda s: (f"password={s}", f"password={MASK}"),
    lambda s: (f"api_key: {s}", f"api_key: {MASK}"),
    lambda s: (f"Authorization: Bearer {s}", f"Authorization: Bearer {MASK}"),
    lambda s: (f"'authorization': 'Basic {s}", f"'authorization': 'Basic {MASK}"),
    lambda s: (f"bearer {s}", f"bearer {MASK}"),
    lambda s: (f"postgresql://app:{s}@db:5432/x", f"postgresql://app:{MASK}@db:5432/x"),
]


@given(prose(), st.sampled_from(range(len(FORMS))), SECRETS, CLOSERS, prose())
def test_a_masked_secret_takes_nothing_around_it(
    before: str, form: int, secret: str, closer: str, after: str
) -> None:
    """Every character that is not the secret is kept, the closing punctuation right after it too."""
    text, masked = FORMS[form](secret)
    line = f"{before}{text}{closer} {after}"
    assert Redactor().redact(line) == f"{before}{masked}{closer} {after}"


@given(prose(), SECRETS, CLOSERS, prose())
def test_a_configured_value_is_masked_alone(before: str, secret: str, closer: str, after: str) -> None:
    line = f"{before}{secret}{closer} {after}"
    assert Redactor([secret]).redact(line) == f"{before}{MASK}{closer} {after}"


@given(prose())
def test_ordinary_words_are_never_masked(text: str) -> None:
    """Prose that names bearer tokens, keys or passwords holds no secret: it comes back equal."""
    assert Redactor().redact(text) == text


def test_the_refusal_of_a_call_without_a_token_is_logged_as_said() -> None:
    """The doors' refusal (api/authentication.py) names the header with a placeholder: no secret."""
    message = "this call needs a bearer token: send the metadata 'authorization: Bearer <token>'"
    record = logging.LogRecord("turnwire.http", logging.INFO, __file__, 1, message, None, None)
    assert formatter_for("text").format(record).endswith(message)
