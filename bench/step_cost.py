"""What pricing a step costs (issue 37, "Cost"; engine/cost.py): CPU per ``PriceBook.cost`` call
for a model in the price data (OpenAI, Anthropic with cache reads and writes), one priced by a
``pricing.models`` entry, and one the data does not know; and the first call's cost, which
imports ``genai-prices`` (done once per process, at the first step priced, not at start-up).

Per-turn allowance (issue 33's rule for later issues): ≤ 0.3 ms CPU per request. A turn prices
each of its steps once, so the allowance holds while a step's pricing stays under it.
Printed with PASS/MISS, never asserted.

    .venv/bin/python bench/step_cost.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import Table, print_tables, verdict  # noqa: E402

from turnwire.types import Usage  # noqa: E402
from turnwire_server.engine.cost import PriceBook  # noqa: E402
from turnwire_server.engine.cost_settings import PricingSettings  # noqa: E402

ALLOWANCE_MS = 0.3
CASES = [
    ("openai:gpt-4o, in data", "openai:gpt-4o", "openai", Usage(input_tokens=2500, output_tokens=65)),
    (
        "anthropic:claude-haiku-4-5, cache read and write",
        "anthropic:claude-haiku-4-5",
        "anthropic",
        Usage(input_tokens=2500, output_tokens=65, cached_input_tokens=2000, cache_write_input_tokens=300),
    ),
    (
        "scripted:weather, a pricing.models entry",
        "scripted:weather",
        "scripted",
        Usage(input_tokens=2500, output_tokens=65),
    ),
    (
        "openai:not-a-model, unknown to the data",
        "openai:not-a-model",
        "openai",
        Usage(input_tokens=10, output_tokens=5),
    ),
]
FIRST_CALL = """
import time
from turnwire.types import Usage
from turnwire_server.engine.cost import PriceBook
book = PriceBook()
start = time.process_time()
book.cost("openai:gpt-4o", "openai", Usage(input_tokens=2500, output_tokens=65))
print(time.process_time() - start)
"""


def per_call(book: PriceBook, model_id: str, provider_type: str, usage: Usage, calls: int) -> float:
    """CPU seconds per ``book.cost`` call: the median of 3 blocks of ``calls`` (after 100 warm-up calls)."""
    for _ in range(100):
        book.cost(model_id, provider_type, usage)
    blocks = []
    for _ in range(3):
        start = time.process_time()
        for _ in range(calls):
            book.cost(model_id, provider_type, usage)
        blocks.append((time.process_time() - start) / calls)
    return statistics.median(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    settings = PricingSettings.model_validate(
        {"models": {"scripted:weather": {"input_mtok": 2.0, "output_mtok": 8.0}}}
    )
    book = PriceBook(settings)
    table = Table(
        f"CPU to price one step (PriceBook.cost; median of 3 x {args.calls} calls; µs)",
        ["step", "CPU / call", f"allowance ≤ {ALLOWANCE_MS} ms per request"],
    )
    for label, model_id, provider_type, usage in CASES:
        seconds = per_call(book, model_id, provider_type, usage, args.calls)
        table.add(label, f"{seconds * 1e6:.1f}", verdict(seconds * 1e3 <= ALLOWANCE_MS))
    firsts = [
        float(
            subprocess.run(
                [sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    ]
    table.add(
        "the first step priced in a process (imports genai-prices)",
        f"{statistics.median(firsts) * 1e6:.0f}",
        "once per process",
    )
    print_tables([table])


if __name__ == "__main__":
    main()
