"""trainables.secrets.redact: what it hides (the same as the plain pattern it replaced), in time linear in the text."""

import random
import re
import time

import pytest

from trainables.secrets import REDACTED, credential_problem, redact

# The pattern redact used before: right, but tried from every letter of a long word (quadratic in its length).
_PLAIN = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<secret>[^/\s]*)@")


def _plain_redact(text: str) -> str:
    return _PLAIN.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def test_redact_hides_what_the_plain_pattern_hides():
    # Short random texts over the characters the pattern looks at: schemes starting after digits, '+.-' in them,
    # several '://' and '@', whitespace ends. The plain pattern is quick on short texts and is the reference.
    rng = random.Random(0)
    alphabet = "ab9+.-:/@ \nh"
    for _ in range(50_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        assert redact(text) == _plain_redact(text), repr(text)
    for text in ("9http://u:p@h", "x-y.z+1://u:p@q@h/p", "a1://:@", "http://u:p@h http://v:q@g", "db://u@h:1/x"):
        assert redact(text) == _plain_redact(text), text


@pytest.mark.parametrize(
    "text",
    [
        "y" * 200_000,  # one long word, then a URI elsewhere in the text
        "a1" * 100_000,  # letters and digits: a scheme could start at every other character
        "y" * 200_000 + "://",  # a long word that is a scheme, but no user info after it
    ],
    ids=["letters", "letters-and-digits", "long-scheme"],
)
def test_redact_is_linear_in_the_texts_length(text):
    # The plain pattern was tried from every letter of a word that is not a URI, each try reading to the word's
    # end: 25 s for a 100,000-letter value here (minutes for these), echoed in an error message (trainables.errors
    # .shown redacts before it cuts). A bound far above the linear time, no timing claim.
    text += " http://u:p@h"
    t0 = time.perf_counter()
    redacted = redact(text)
    assert time.perf_counter() - t0 < 30
    assert redacted == text.removesuffix("p@h") + f"{REDACTED}@h"


def test_credential_problem_shows_the_uri_without_its_password():
    problem = credential_problem("optuna_storage", "postgresql://u:hunter2@db/optuna")
    assert "hunter2" not in problem and "postgresql://u:***@db/optuna" in problem
    assert "Fix: drop it from the URI (postgresql://u@db/optuna)" in problem
    assert credential_problem("optuna_storage", "postgresql://u@db/optuna") is None
