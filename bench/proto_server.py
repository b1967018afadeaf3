"""Turnwire with the proposed store fixes prototyped in, as its own server process.

Like ``python -m server serve --config FILE`` (same settings, same
``server.app.start``), but before serving it patches in, at run time, the
prototypes from ``turn_phases.py``:

* ``no-final-ckpt``: no checkpoint at the end of the last step (``finish_turn``
  stores the same message right after);
* ``null-store`` (diagnosis only, not a fix): store calls return at once.

The server source is not changed; this exists so ``stream_overhead.py
--with-prototype`` can measure what the fixes would gain, in the same run and
under the same conditions as the floor and unpatched Turnwire.

    python bench/proto_server.py --config turnwire.yaml [--variants no-final-ckpt]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from turn_phases import patch_no_final_checkpoint, patch_null_store


async def serve(config: Path, variants: set[str]) -> None:
    from server.app import start
    from server.config import load_settings

    settings = load_settings(config)
    logging.basicConfig(level=settings.log_level.upper())
    if "no-final-ckpt" in variants:
        patch_no_final_checkpoint()
    sidecar = await start(settings)
    if "null-store" in variants:  # a bound for diagnosis, not a fix
        patch_null_store(sidecar.store)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await sidecar.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--variants", default="no-final-ckpt")
    args = parser.parse_args()
    asyncio.run(serve(args.config, {v.strip() for v in args.variants.split(",") if v.strip()}))


if __name__ == "__main__":
    main()
