"""Kicking a vCPU thread out of KVM_RUN (timeouts, shutdown).

A guest spinning at CPL3 without exits never returns from KVM_RUN by itself.  The
standard way out (QEMU's SIG_IPI) is: set kvm_run.immediate_exit, then send the vCPU
thread a signal that has a handler; KVM_RUN returns EINTR and, because immediate_exit is
set, every later KVM_RUN does too, so there is no race with the thread re-entering.
fcntl.ioctl does not retry on EINTR; it raises InterruptedError, which the exit loop
turns into a stop.

Only the main thread may install a Python signal handler, so the handler is installed
the first time a runner is created there.  Python's C-level handler just records the
signal; the Python-level one does nothing.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

KICK_SIGNAL = signal.SIGRTMIN + 4  # unused by CPython and glibc
_installed = False
_lock = threading.Lock()


def _ignore(signum: int, frame: object) -> None:
    """The kick only has to interrupt a system call in the vCPU thread."""


def ensure_kick_handler() -> bool:
    """Install the kick handler if possible; True when kicks can interrupt KVM_RUN."""
    global _installed
    with _lock:
        if _installed:
            return True
        current = signal.getsignal(KICK_SIGNAL)
        if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
            _installed = True  # someone's handler: it interrupts the syscall just as well
            return True
        if threading.current_thread() is not threading.main_thread():
            log.warning("vCPU kick handler not installed (first KVM runner created off "
                        "the main thread): a guest spinning without exits cannot be "
                        "stopped by a timeout")
            return False
        signal.signal(KICK_SIGNAL, _ignore)
        _installed = True
        return True


def kick(thread_ident: int) -> None:
    """Interrupt a system call of thread `thread_ident` (no-op if it has ended)."""
    if not _installed:
        return
    try:
        signal.pthread_kill(thread_ident, KICK_SIGNAL)
    except (ProcessLookupError, OSError):
        pass
