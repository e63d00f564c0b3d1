"""How long tests wait for processes to react: to a signal, to their parent's death (PR_SET_PDEATHSIG), to a
watchdog's tick (1 s) or a stop's grace (runtime/_common/guard.py's 3 s, registry stops' 5 s). A bound for a failure,
not an expectation: a passing test waits as long as the reaction takes, not this long."""

from __future__ import annotations

# Seconds. Typical <= 2.5 s on a loaded 2-core machine (both cores busy with a CPU hog: a shared server stopped by
# its watchdog, a killed script's Python exit); 10x that, and well above the library's graces.
REACT = 30.0
