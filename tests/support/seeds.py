"""The seed of a randomized stress test: ``TURNWIRE_STRESS_SEED`` when set (to replay a failed
run: its failure message and table print the seed), else a new random one.

    seed = stress_seed()
    rng = random.Random(seed)
"""

from __future__ import annotations

import os
import random

__all__ = ["stress_seed"]


def stress_seed() -> int:
    """``TURNWIRE_STRESS_SEED`` as an int when set, else a random seed in ``[0, 2**32)``.

    Raises:
        ValueError: the variable is set but not an integer.
    """
    given = os.environ.get("TURNWIRE_STRESS_SEED", "").strip()
    return int(given) if given else random.randrange(2**32)
