"""VMM processes forked from one that has already imported the VMM (a fork server).

Why: a VMM process is a Python interpreter that must import numpy and the VMM stack
before it can build its VM -- 0.35 s of its own CPU on the 16-core H200 machine, most of
it numpy's import, and 0.45-0.6 s each when an isolated run starts eight at once.  An
isolated run starts one `VmmForkServer` instead, which pays the imports once; each VM's
VMM is then a fork of it, the modules already in memory (and shared, copy-on-write).

A forked VMM runs exactly what `python -m gpuvm.vmm.vm_process` runs (vm_process.main):
its stdin and stdout are pipes to the run, its vfio-user socket the job's fd.  Its
environment is the fork server's, taken when the run started it, plus one thread for
BLAS (a VMM does no linear algebra, and a process that forks must have no other thread).

The control socket (a SOCK_SEQPACKET pair: one message a request or a notice):
- run -> fork server: a job (JSON) with three fds -- the VM's vfio-user socket, the
  read end of its stdin pipe, the write end of its stdout pipe;
- fork server -> run: "spawned PID" with a pidfd of the child (SCM_RIGHTS: a kill
  aimed through it cannot hit another process that reused the pid), then, once the
  child has exited and been reaped, "exited PID RETURNCODE" (negative: the signal, as
  subprocess says it).
The fork server exits when the run closes its end; VMMs still running are the run's to
kill (it kills every VM it has not collected).
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import Any, NoReturn, TextIO

from gpuvm.vmm import vm_process

# a VMM forks from a process with no thread besides its own: BLAS's pool stays empty
ONE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                  "MKL_NUM_THREADS": "1"}
_MESSAGE_MAX = 1 << 16  # a job is a few hundred bytes
_SPAWN_FDS = 3
# a VMM whose fork server went away before saying how it ended (see ForkedVmm.poll)
UNKNOWN_EXIT = 255


class ForkServerError(Exception):
    """No VMM could be forked: the fork server died, and a fresh one did too."""


class ForkedVmm:
    """A VMM process forked by the fork server, seen as subprocess.Popen shows one (pid,
    stdin, stdout, returncode, poll, wait, kill), so a run treats both alike."""

    def __init__(self, pid: int, pidfd: int, stdin: TextIO, stdout: TextIO,
                 ended: "_Ending") -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self._pidfd = pidfd
        self._ended = ended

    @property
    def returncode(self) -> int | None:
        return self._ended.returncode

    def poll(self) -> int | None:
        """The exit status once the process has ended and been reaped, else None."""
        return self._settle(0)

    def wait(self, timeout: float | None = None) -> int:
        self._ended.done.wait(timeout)  # set when it is reaped, or the server is gone
        returncode = self._settle(timeout)
        if returncode is None:
            raise subprocess.TimeoutExpired("forked VMM", timeout or 0)
        return returncode

    def _settle(self, timeout: float | None) -> int | None:
        """The exit status if known; for a VMM whose fork server is gone, UNKNOWN_EXIT
        once its pidfd says it ended (waiting up to `timeout`)."""
        ended = self._ended
        if ended.returncode is None and ended.orphaned and _exited(self._pidfd, timeout):
            ended.set(UNKNOWN_EXIT)  # it ended; who reaped it is gone
        return ended.returncode

    def kill(self) -> None:
        """SIGKILL, through the pidfd (a no-op once it has been reaped)."""
        try:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Let go of the pidfd (after the process was collected)."""
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


class _Ending:
    """How one forked VMM ended, as the fork server says (set from its reader thread)."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.done = threading.Event()
        self.orphaned = False  # the fork server went away before saying

    def set(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
        self.done.set()


class VmmForkServer:
    """The run's side of a fork server: `spawn` a VMM for a job, `close` at the end.  A
    fork server that has died is started afresh at the next spawn (its VMMs are still
    collected, see ForkedVmm), so one crash costs the run no VM started after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one request and its reply at a time
        self._current = _ForkServerProcess()
        self._retired: list[_ForkServerProcess] = []

    @property
    def process(self) -> subprocess.Popen:
        """The fork server's process now."""
        return self._current.process

    @property
    def gone(self) -> bool:
        """Whether the fork server now running has exited (the next spawn restarts it)."""
        return self._current.gone

    def spawn(self, job: dict[str, Any], device_fd: int) -> ForkedVmm:
        """Fork a VMM for `job` (vm_process's), its vfio-user socket `device_fd` (which
        the caller may close once this returns)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with self._lock:
                spawned = None
                for _ in range(2):  # the fork server, then a fresh one if it has died
                    if self._current.gone:
                        self._retired.append(self._current)
                        self._current = _ForkServerProcess()
                    spawned = self._current.request(job, [device_fd, stdin_r, stdout_w])
                    if spawned is not None:
                        break
            if spawned is None:
                raise ForkServerError(f"the VMM fork server exited (status "
                                      f"{self._current.process.poll()}) before forking a "
                                      f"VMM, twice")
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w):
                os.close(fd)
        pid, pidfd, ended = spawned
        return ForkedVmm(pid, pidfd, os.fdopen(stdin_w, "w"), os.fdopen(stdout_r, "r"),
                         ended)

    def close(self) -> None:
        """Close the control sockets: the fork servers exit (VMMs run on, the run's)."""
        for server in self._retired + [self._current]:
            server.close()


class _ForkServerProcess:
    """One fork server process and the thread that reads what it says."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, **ONE_THREAD_ENV)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuvm.vmm.vmm_forks", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()], env=env)
        finally:
            theirs.close()
        self._sock = ours
        self._spawned: queue.Queue[tuple[int, int, _Ending] | None] = queue.Queue()
        self._endings: dict[int, _Ending] = {}  # by pid, until it is reaped
        self._endings_lock = threading.Lock()
        self.gone = False
        self._reader = threading.Thread(target=self._read, name="vmm fork server",
                                        daemon=True)
        self._reader.start()

    def request(self, job: dict[str, Any], fds: list[int]
                ) -> tuple[int, int, _Ending] | None:
        """Ask for a fork; its (pid, pidfd, ending), or None if the fork server is gone."""
        if self.gone:
            return None
        try:
            socket.send_fds(self._sock, [json.dumps(job).encode()], fds)
        except OSError:
            return None  # the reader sees the end too
        return self._spawned.get()

    def _read(self) -> None:
        """Hand each "spawned" to the waiting request, record each "exited"."""
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(self._sock, _MESSAGE_MAX, 1)
                if not data:
                    break
                word, pid_text, *rest = data.decode().split()
                pid = int(pid_text)
                if word == "spawned" and len(fds) == 1:
                    ended = _Ending()
                    with self._endings_lock:
                        self._endings[pid] = ended
                    self._spawned.put((pid, fds[0], ended))
                elif word == "exited":
                    with self._endings_lock:
                        ended = self._endings.pop(pid, None)
                    if ended is not None:
                        ended.set(int(rest[0]))
        except OSError:
            pass
        finally:
            self.gone = True
            with self._endings_lock:
                for ended in self._endings.values():
                    ended.orphaned = True
                    ended.done.set()
                self._endings.clear()
            self._spawned.put(None)

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(10)
        self._sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _exited(pidfd: int, timeout: float | None) -> bool:
    """Whether the process behind `pidfd` has exited (its pidfd reads ready), waiting up
    to `timeout`."""
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        return bool(sel.select(timeout))


# ------------------------------------------------------------------ the fork server
def serve(control: socket.socket) -> None:
    """Fork a VMM for each job that arrives on `control`, report each one's exit; return
    when the run closes its end.  Ctrl-C is the run's to act on (it kills its VMMs):
    the fork server ignores SIGINT, its VMMs take it as a fresh interpreter does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in sel.select():
            if key.data is not None:  # a child's pidfd: it exited
                _, status = os.waitpid(key.data, 0)
                sel.unregister(key.fd)
                del children[key.fd]
                os.close(key.fd)
                _notify(control, f"exited {key.data} {os.waitstatus_to_exitcode(status)}")
                continue
            try:
                data, fds, _, _ = socket.recv_fds(control, _MESSAGE_MAX, _SPAWN_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                return
            if len(fds) != _SPAWN_FDS:  # the run's own bug: nothing to fork
                for fd in fds:
                    os.close(fd)
                return
            pid = os.fork()
            if pid == 0:
                _child(json.loads(data), fds, control, sel, children)
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            sel.register(pidfd, selectors.EVENT_READ, pid)
            try:
                socket.send_fds(control, [f"spawned {pid}".encode()], [pidfd])
            except OSError:
                return  # the run is gone


def _notify(control: socket.socket, text: str) -> None:
    try:
        control.send(text.encode())
    except OSError:
        pass


def _child(job: dict[str, Any], fds: list[int], control: socket.socket,
           sel: selectors.BaseSelector, children: dict[int, int]) -> NoReturn:
    """In the forked VMM: the pipes become stdin and stdout, then vm_process runs."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sel.close()
        control.close()
        for pidfd in children:
            os.close(pidfd)
        device_fd, stdin_r, stdout_w = fds
        os.dup2(stdin_r, 0)
        os.dup2(stdout_w, 1)
        os.close(stdin_r)
        os.close(stdout_w)
        job["fd"] = device_fd
        code = vm_process.main(job)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
