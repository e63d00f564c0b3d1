"""``python -m gguf_provider.runtime._serve.watchdog KEY [ENTRY_JSON]``: stops a shared server when its clients are gone.

Polls the registry once a second (:func:`step`): prunes leases of dead clients, and once none is left and
``keep_alive`` has run out, stops the server (after proving it is ours) and exits. Exits too when the server is gone.

It remembers the last entry it saw: if the registry loses it (a corrupted file was reset, or the key now names
another server) while the server still runs, the watchdog goes on from that copy, pruning leases by whether their
client processes are alive, so the server is not orphaned.
"""

from __future__ import annotations

import json
import sys
import time

from . import registry


def step(reg: registry.Registry, key: str, last: registry.Entry | None, now: float) -> tuple[bool, registry.Entry | None]:
    """One look at ``key``'s server: whether the watchdog is done (server stopped or gone), and the entry to
    remember for the next look."""
    to_stop: registry.Entry | None = None
    with reg.locked() as data:
        entry = data.get(key)
        if entry is not None and last is not None and not entry.same_server(last):
            entry = None  # the key names a newer server now; ours lost its entry
        if entry is None:
            if last is None or not reg.server_alive(last):
                return True, last
            last, remove = reg.sweep_entry(last, now)  # on our own copy, outside the registry
            if remove:
                to_stop = last
        else:
            entry, remove = reg.sweep_entry(entry, now)
            if remove:
                del data[key]
                to_stop = entry
            else:
                data[key] = last = entry
    if to_stop is not None:
        reg.stop_entry(to_stop)
        return True, last
    return False, last


def main(argv: list[str]) -> int:
    key = argv[0]
    last = registry.Entry.from_json(json.loads(argv[1])) if len(argv) > 1 else None
    reg = registry.default()
    while True:
        try:
            done, last = step(reg, key, last, time.time())
        except Exception:  # a transient lock or file error: try again next tick
            done = False
        if done:
            return 0
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
