"""Sites for tests that call the ``gact::`` ops directly (compiled graphs get theirs from a backend)."""

from gact_fx.runtime.registry import SlotRegistry

REGISTRY = SlotRegistry()  # lives as long as the test session: its sites stay in the directory


def new_slot(*, pinned: bool = False) -> int:
    site = REGISTRY.new_site()
    site.pinned = pinned
    return site.slot


SLOT = new_slot()  # a plain site: fresh noise on every call
