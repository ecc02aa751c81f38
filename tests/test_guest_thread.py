"""The guest thread's start/join contract under a stop signal (gpuvm.vmm.guest_thread)."""

from __future__ import annotations

import threading

import pytest

from gpuvm.vmm import guest_thread
from gpuvm.vmm.guest_session import GuestOutcome
from gpuvm.vmm.guest_thread import GuestThread


class _Guest(GuestThread):
    name, backend, session = "g", "test", None  # type: ignore[assignment]

    def __init__(self, body) -> None:
        self._init_thread()
        self._body = body

    def _main(self) -> None:
        self._body()
        self._outcome = GuestOutcome(self.name, self.backend, self.session)

    def stop(self, reason: str) -> None:
        pass

    def _not_returned(self) -> str:
        return "not returned"


def test_a_join_waits_for_a_thread_a_stop_signal_caught_on_its_way_up():
    """A signal landing inside start() leaves the thread made but not yet running:
    join() must wait for it, not fail, so the GPU is not closed under it."""
    ran = threading.Event()
    guest = _Guest(ran.set)
    guest._thread = threading.Thread(target=guest._main)  # start() interrupted here
    assert guest.started() and not guest.alive()
    threading.Timer(0.05, guest._thread.start).start()
    outcome = guest.join(5)
    assert ran.is_set() and outcome.failure is None


def test_a_thread_never_started_is_given_up_on_after_the_grace(monkeypatch):
    monkeypatch.setattr(guest_thread, "STOP_GRACE_S", 0.05)
    guest = _Guest(lambda: None)
    assert not guest.started()
    with pytest.raises(RuntimeError):
        guest.join(1)
    guest._thread = threading.Thread(target=guest._main)
    assert guest.join(1).failure == "not returned" and not guest.alive()
