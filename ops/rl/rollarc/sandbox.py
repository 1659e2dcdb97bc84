"""A sandboxed Python calculator for tool-use environments, enforced by the kernel: one fresh sandbox per call.

RollArc (arXiv 2512.22560 §3-4) keeps stateful environments on CPU workers and lets a slow or
failing one block only its own trajectory; here a tool call runs model-generated code that can
neither hang its caller (CPU and wall-clock limits) nor reach the host: its files, processes,
network services, or the channel that carries its result.

Modes (``SANDBOX_MODES``; chosen by config: ``roles_common.RoleSpec.sandbox``, the environments'
``sandbox`` argument, ``run_python(sandbox=...)``):

* ``bwrap`` (the default) — **kernel-enforced**: Debian's bubblewrap (``bwrap``) starts the call in
  new user, network, PID, IPC, UTS and mount namespaces (cgroup too where the kernel allows), with
  ``--die-with-parent``, ``--new-session``, every capability dropped, ``no_new_privs``, as uid/gid
  65534 (``nobody``; mapped onto the caller's uid outside), an empty environment and cwd ``/``. Its
  file system is an empty read-only root holding only read-only binds of the interpreter's prefix
  (``sys.base_prefix``: the binary and the standard library; not the venv's site-packages, which
  the calculator does not need) and the shared libraries (``/usr/lib``, ``/usr/lib64``, ``/lib``,
  ``/lib64``), plus a minimal ``/dev``: no ``/proc``, ``/etc``, ``/tmp``, ``/home`` or the
  project. A private network namespace has no route to any host service. When bwrap is missing or
  cannot create its namespaces, ``run_python`` raises ``SandboxUnavailable`` — it never falls back.
* ``rlimits`` — the weaker mode, only when the config asks for it: the same supervisor, child,
  rlimits, seccomp filter and audit hook, without namespaces (the code runs as the worker's user
  and sees its file system). Run metadata says so (``describe``).

Inside either mode, from the outside in:

* a **supervisor** (trusted, ``python -I -S -B``) runs the code in a child process with pipes for
  its stdin, stdout and stderr, kills it at the wall-clock deadline, reaps it with ``wait4`` and
  builds the result JSON itself from the child's exit status, CPU rusage and captured output. The
  result travels on the supervisor's stdout, which the child never holds: the child can only
  print (its output is what it printed) and exit — forged result JSON written to any descriptor
  is at most printed text. The host trusts a report only from a sandbox that exited 0 within its
  time (a supervisor killed or stopped after a forged report cannot pass one on);
* the child (``python -I -S -B``, empty environment, its own session) lowers its own rlimits before
  any untrusted code runs: ``RLIMIT_CPU`` (backstop, ``ceil(cpu_s) + 1`` s), ``RLIMIT_AS``
  (``mem_mb``), ``RLIMIT_FSIZE = 0``, ``RLIMIT_NOFILE = 16``, ``RLIMIT_NPROC = 0``,
  ``RLIMIT_CORE = 0``; arms ``ITIMER_PROF`` at ``cpu_s``;
* then it enters a **Landlock** domain of its own where the kernel has it (Linux >= 5.13; skipped
  without): no file created, written, truncated or removed anywhere, no TCP bind/connect, no
  signals or abstract unix sockets out of the domain, and no ptrace-class access to processes
  outside it (in the ``rlimits`` mode it opened ``/proc/<worker>/mem`` read-write before);
  ``/proc/<worker>/environ`` stays readable there (measured on Linux 6.18): the ``rlimits`` mode
  does not hide the worker's environment;
* then (x86-64) it installs a **seccomp** filter (``prctl(PR_SET_NO_NEW_PRIVS)`` +
  ``PR_SET_SECCOMP``; the kernel keeps it for the process's life, nothing can remove it) that fails
  with EPERM: ``fork``/``vfork``/``clone``/``clone3`` (no processes or threads: fork bombs end at
  the first fork), ``execve``/``execveat``, ``kill``/``tkill``/``tgkill``/``rt_(tg)sigqueueinfo``/
  ``pidfd_send_signal`` (no signals to the supervisor), ``ptrace``, ``process_vm_readv/writev``,
  ``pidfd_open``/``pidfd_getfd`` (a copy of the supervisor's result descriptor), ``process_madvise``,
  ``kcmp``, ``move_pages``/``migrate_pages``, ``socket``/``socketpair``, ``unshare``/``setns``/``mount``,
  ``bpf``, ``userfaultfd``, ``perf_event_open``, ``io_uring_*``, the key-ring calls and every x32-ABI
  call; ``prlimit64``, ``setpriority``, ``sched_set{param,scheduler,affinity,attr}`` and ``ioprio_set``
  only on the caller itself (pid argument 0); ``fcntl`` ``F_SETOWN``/``F_SETSIG``/``F_SETOWN_EX`` and
  ``ioctl`` ``FIOSETOWN``/``SIOCSPGRP`` (SIGIO, with any signal, aimed at the supervisor). ``RLIMIT_NPROC``
  alone would not do: under bwrap as root the sandbox uid maps onto root, which the kernel exempts;
* last, a PEP 578 **audit hook** (``sys.addaudithook``) refuses sockets, writes, reads outside the
  standard library, process creation, file-system mutation, ``ctypes`` and imports of ``socket``,
  ``ctypes``, ``subprocess``, ... with a clear ``PermissionError: sandbox: ...``. It is defence in
  depth and a readable error for honest code: PEP 578 hooks can be undone from inside (rebind the
  hook's ``__code__`` found through ``gc.get_objects()``), after which the layers above still hold.

The rlimits are set inside the child rather than in ``preexec_fn``: ``preexec_fn`` is documented as
unsafe when the parent has threads, and environments run many instances in threads of one process.

Namespace of the code: builtins, ``math``'s public names (``sqrt``, ``pi``, ``comb``, ... except
``pow``, which stays the builtin), and the modules ``math cmath fractions decimal statistics
itertools functools random`` plus ``Fraction`` and ``Decimal``. Output: what the code prints, then,
as in a REPL, ``repr`` of the last statement when it is an expression with a value other than None.

Cost: the bwrap layer adds its namespace setup to each call (measured and quoted in
docs/rollarc.md, "Sandbox"). The supervisor's and the child's source text (the layers inside the
sandbox) is ``sandbox_layers``; this module is the host side. Both import only the standard library.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .sandbox_layers import CHILD as _CHILD, SUPERVISOR as _SUPERVISOR

#: Largest code accepted (characters); calculator expressions are far shorter.
MAX_CODE_CHARS = 100_000

SANDBOX_MODES = ("bwrap", "rlimits")
"""``bwrap``: kernel-enforced (bubblewrap namespaces) + the process layers; ``rlimits``: the process
layers only (supervisor, rlimits, seccomp, audit hook) — weaker, only when a config asks for it."""
DEFAULT_MODE = "bwrap"

#: The unprivileged uid/gid the code runs as inside the bwrap sandbox (``nobody``).
SANDBOX_UID = 65534

_MIN_MEM_MB = 64  # python -I -S itself maps ~20 MB; below this even the bootstrap fails
_GRACE_S = 1.0  # the host waits this long past the wall deadline for the supervisor's report


class SandboxUnavailable(RuntimeError):
    """The configured sandbox mode cannot run here (``bwrap`` missing, or it cannot create its
    namespaces); the message says why and how to allow the weaker mode."""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run."""

    ok: bool
    """The code ran to completion without an exception or a limit."""
    output: str
    """What the code printed, plus ``repr`` of a final expression (capped at ``max_output_chars``)."""
    error: str
    """``""`` when ok; else ``"ExcType: message"``, ``"CPU time limit exceeded (... s)"``, ``"wall-clock limit
    exceeded (... s)"`` or ``"sandbox failed: ..."``."""
    cpu_s: float
    """CPU seconds (user + system) of the child that ran the code, from the supervisor's ``wait4`` rusage
    (the host's ``wait4`` of the whole sandbox when no report came back)."""
    wall_s: float
    """Wall-clock seconds from spawn to reap, sandbox start included."""
    mode: str = DEFAULT_MODE
    """The sandbox mode that ran it (``SANDBOX_MODES``)."""


def describe(mode: str) -> str:
    """One line for run metadata: what the mode ``mode`` enforces. Raises ValueError for an unknown mode."""
    check_mode(mode)
    inner = "supervisor-built result, rlimits, Landlock (where the kernel has it), seccomp (x86-64), audit hook"
    if mode == "bwrap":
        return (f"bwrap: kernel-enforced (bubblewrap; user, network, PID, IPC, UTS and mount namespaces; uid "
                f"{SANDBOX_UID}; read-only interpreter and libraries only; no /proc) + {inner}")
    return f"rlimits: WEAKER, explicitly allowed by config (no kernel namespaces; worker's user and file system) + {inner}"


def check_mode(mode: str) -> str:
    """``mode`` if it is one of ``SANDBOX_MODES``; else ValueError naming the field and the choices."""
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox must be one of {SANDBOX_MODES} (bwrap: kernel-enforced; rlimits: the weaker "
                         f"mode, allowed only explicitly), got {mode!r}")
    return mode


def require(mode: str) -> None:
    """Refuse early (no subprocess): ValueError for an unknown mode, ``SandboxUnavailable`` for
    ``bwrap`` without a ``bwrap`` executable on PATH."""
    if check_mode(mode) == "bwrap" and _bwrap_path() is None:
        raise SandboxUnavailable(_missing_msg())


def _missing_msg() -> str:
    return ("sandbox 'bwrap' needs bubblewrap, and no 'bwrap' is on PATH: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap), or set sandbox: rlimits to allow the weaker mode without kernel namespaces explicitly")


def _bwrap_path():
    return shutil.which("bwrap")


_INTERP_LOCK = threading.Lock()
_INTERP: dict = {}


def _interpreter() -> tuple[str, list[str]]:
    """(the real interpreter binary, bwrap arguments binding it, its standard library and the shared
    libraries read-only). Cached."""
    with _INTERP_LOCK:
        if _INTERP:
            return _INTERP["exe"], _INTERP["binds"]
        prefix = os.path.realpath(sys.base_prefix)
        exe = os.path.realpath(sys.executable)
        own = os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")
        if not exe.startswith(prefix + os.sep) and os.path.exists(own):
            exe = os.path.realpath(own)        # a venv with a copied binary: run the base one
        binds: list[str] = []
        bound: list[str] = []

        def bind(path):
            if os.path.exists(path) and not any(path == b or path.startswith(b + os.sep) for b in bound):
                binds.extend(["--ro-bind", path, path])
                bound.append(path)

        for top in ("/lib", "/lib64", "/usr/lib", "/usr/lib64"):
            if os.path.islink(top) and top.count("/") == 1:
                binds.extend(["--symlink", os.readlink(top), top])
            else:
                bind(top)
        if prefix != "/usr":
            bind(prefix)                       # bin/ + lib/pythonX.Y (+ libpython) of the interpreter
        stdlib = os.path.dirname(os.path.realpath(os.__file__))
        bind(stdlib)
        bind(exe)
        _INTERP.update(exe=exe, binds=binds)
        return exe, binds


def bwrap_argv(exe_and_args: list[str]) -> list[str]:
    """The bubblewrap command line that runs ``exe_and_args`` in the kernel sandbox (see the module
    docstring). Raises SandboxUnavailable without ``bwrap`` on PATH."""
    bw = _bwrap_path()
    if bw is None:
        raise SandboxUnavailable(_missing_msg())
    _, binds = _interpreter()
    return [bw, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            *binds, "--dev", "/dev", "--remount-ro", "/", "--chdir", "/", "--", *exe_and_args]


def run_python(expr_or_code: str, cpu_s: float = 1.0, wall_s: float = 2.0, mem_mb: int = 256,
               max_output_chars: int = 4000, sandbox: str = DEFAULT_MODE) -> SandboxResult:
    """Run ``expr_or_code`` (an expression or statements) in a fresh sandbox (module docstring).

    Args:
        expr_or_code: Python source, at most ``MAX_CODE_CHARS`` characters.
        cpu_s: CPU-time limit of the code in seconds (``ITIMER_PROF``; ``RLIMIT_CPU`` backstop at
            ``ceil(cpu_s) + 1``).
        wall_s: wall-clock limit in seconds from spawn, sandbox and interpreter start included
            (~30-60 ms; the supervisor kills the code at the deadline, the host kills the whole
            sandbox ``_GRACE_S`` later if no report came).
        mem_mb: address-space limit (``RLIMIT_AS``) of the code's process in MiB, >= 64.
        max_output_chars: cap on the returned output (and error) text.
        sandbox: ``bwrap`` (kernel-enforced) or ``rlimits`` (weaker; see ``SANDBOX_MODES``).

    Returns:
        SandboxResult. Failures of the code (exceptions, limits, refused operations) are returned
        in ``error``, never raised. Thread-safe: each call owns its subprocesses and pipes.

    Raises:
        ValueError: ``expr_or_code`` is not a str or too long, a limit is not positive, or an
            unknown ``sandbox`` mode.
        SandboxUnavailable: ``sandbox="bwrap"`` and bubblewrap is missing or cannot create its
            namespaces here (never a silent fallback to the weaker mode).
    """
    if not isinstance(expr_or_code, str):
        raise ValueError(f"run_python needs source text (str), got {type(expr_or_code).__name__}")
    if len(expr_or_code) > MAX_CODE_CHARS:
        raise ValueError(f"run_python: code is {len(expr_or_code)} chars, limit {MAX_CODE_CHARS}")
    if not (cpu_s > 0 and wall_s > 0):
        raise ValueError(f"run_python needs cpu_s > 0 and wall_s > 0, got {cpu_s}, {wall_s}")
    if int(mem_mb) < _MIN_MEM_MB:
        raise ValueError(f"run_python needs mem_mb >= {_MIN_MEM_MB}, got {mem_mb}")
    if int(max_output_chars) < 1:
        raise ValueError(f"run_python needs max_output_chars >= 1, got {max_output_chars}")
    check_mode(sandbox)
    exe, _ = _interpreter()
    argv = [exe, "-I", "-S", "-B", "-c", _SUPERVISOR]
    if sandbox == "bwrap":
        argv = bwrap_argv(argv)
    t0 = time.monotonic()
    deadline = t0 + wall_s
    payload = json.dumps({"code": expr_or_code, "cpu_s": float(cpu_s), "mem_mb": int(mem_mb),
                          "max_output": int(max_output_chars), "deadline": deadline,
                          "child": _CHILD}).encode("utf-8")
    read_cap = 24 * (int(max_output_chars) + 64) + 4096  # the report: output and error (<= cap + 22 chars each), JSON-escaped
    rc, out, err, timed_out, ru = _spawn(argv, payload, deadline + _GRACE_S, read_cap)
    wall = time.monotonic() - t0
    host_cpu = ru.ru_utime + ru.ru_stime if ru is not None else 0.0
    try:
        if rc != 0 or timed_out:  # the supervisor exits 0 right after its report: a report from a sandbox that
            raise ValueError("no clean exit")  # was killed or ran out its time is not trusted (it may be forged)
        rep = json.loads(out.decode("utf-8"))
        ok, output, error, cpu = bool(rep["ok"]), str(rep["output"]), str(rep["error"]), float(rep["cpu_s"])
        child_rc, child_timed_out = int(rep["rc"]), bool(rep["timed_out"])
    except (ValueError, KeyError, TypeError):
        tail = err.decode("utf-8", "replace").strip()[-500:]
        if sandbox == "bwrap" and not timed_out and tail.startswith("bwrap:"):
            raise SandboxUnavailable(f"sandbox 'bwrap' could not start here ({tail}); fix bubblewrap (user namespaces "
                                     "must be allowed), or set sandbox: rlimits to allow the weaker mode explicitly")
        if timed_out:
            return SandboxResult(False, "", f"wall-clock limit exceeded ({wall_s:g} s)", host_cpu, wall, sandbox)
        why = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        return SandboxResult(False, "", f"sandbox failed: {why}" + (f": {tail}" if tail else ""), host_cpu, wall,
                             sandbox)
    if child_timed_out:
        return SandboxResult(False, output, f"wall-clock limit exceeded ({wall_s:g} s)", cpu, wall, sandbox)
    if child_rc in (-signal.SIGPROF, -signal.SIGXCPU) or (child_rc == -signal.SIGKILL and cpu >= cpu_s):
        return SandboxResult(False, output, f"CPU time limit exceeded ({cpu_s:g} s)", cpu, wall, sandbox)
    if child_rc in (0, 1):
        return SandboxResult(ok, output, error if child_rc == 1 else "", cpu, wall, sandbox)
    why = (f"killed by signal {signal.Signals(-child_rc).name}" if child_rc < 0 and -child_rc in signal.valid_signals()
           else f"exit code {child_rc}")
    return SandboxResult(False, output, f"sandbox failed: the code's process ended ({why})" + (f": {error}" if error else ""),
                         cpu, wall, sandbox)


def _spawn(argv: list[str], payload: bytes, deadline: float, read_cap: int):
    """Run ``argv`` in its own session with ``payload`` on stdin until its pipes close or
    ``deadline`` (CLOCK_MONOTONIC) passes (then SIGKILL its process group; bwrap's
    ``--die-with-parent`` takes the sandbox with it). Returns (exit code, stdout head, stderr head,
    timed_out, rusage or None)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={},
                            cwd="/", start_new_session=True, close_fds=True)
    fd_in, fd_out, fd_err = proc.stdin.fileno(), proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {fd_out: bytearray(), fd_err: bytearray()}
    timed_out, status, ru = False, None, None
    sel = selectors.DefaultSelector()
    try:
        for fd in (fd_in, fd_out, fd_err):
            os.set_blocking(fd, False)
        sel.register(fd_in, selectors.EVENT_WRITE)
        sel.register(fd_out, selectors.EVENT_READ)
        sel.register(fd_err, selectors.EVENT_READ)
        pos = 0
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                if key.fd == fd_in:
                    try:
                        pos += os.write(fd_in, payload[pos:pos + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it died before reading it all
                        pos = len(payload)
                    if pos >= len(payload):
                        sel.unregister(fd_in)
                        proc.stdin.close()
                    continue
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(key.fd)
                elif len(bufs[key.fd]) < read_cap:  # keep the head, drain (and drop) the rest
                    bufs[key.fd] += data[: read_cap - len(bufs[key.fd])]
        # pipes closed or deadline passed: reap, SIGKILLing the process group at the deadline
        while status is None:
            pid, st, r = _wait4(proc.pid, os.WNOHANG)
            if pid:
                status, ru = st, r
            elif timed_out or time.monotonic() >= deadline:
                timed_out = True
                _killpg(proc.pid)
                _, status, ru = _wait4(proc.pid, 0)
            else:
                time.sleep(0.002)
    finally:
        sel.close()
        if status is None:  # an exception above: never leak the child
            _killpg(proc.pid)
            _, status, ru = _wait4(proc.pid, 0)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if not f.closed:
                f.close()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait
    return proc.returncode, bytes(bufs[fd_out]), bytes(bufs[fd_err]), timed_out, ru


def _wait4(pid: int, flags: int):
    """``os.wait4``; if someone else in this process reaped the child first (a blanket
    ``os.wait()``), report a clean exit without rusage."""
    try:
        return os.wait4(pid, flags)
    except ChildProcessError:
        return pid, 0, None


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
