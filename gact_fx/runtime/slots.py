"""Process-wide numbering of saved-tensor sites ("slots").

Every compressed saved tensor in every compiled graph gets a distinct slot, baked into
its ``gact::quantize`` call; run-time state (rounding seeds, bits, statistics) is keyed
by it. Numbers are handed out in compile order, so the same program numbers its sites
the same way in every process (which keeps Inductor's FX graph cache effective).
"""

from __future__ import annotations

import itertools
import threading

_lock = threading.Lock()
_counter = itertools.count()


def allocate_slot() -> int:
    with _lock:
        return next(_counter)
