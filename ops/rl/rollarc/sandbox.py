"""A sandboxed Python calculator for tool-use environments: one fresh subprocess per call.

RollArc (arXiv 2512.22560 §3-4) keeps stateful environments on CPU workers and lets a slow or
failing one block only its own trajectory; here a tool call can neither hang its caller (CPU and
wall-clock limits), nor reach the network, write files, start processes or read the parent's
environment. Layers, from the outside in:

* the child is ``python -I -S -B`` (isolated mode: no user site, no ``PYTHON*`` variables, no
  site-packages, no bytecode writes) with an **empty environment**, ``cwd="/"``, in its own
  session/process group; the parent kills the whole group at the **wall-clock limit**;
* before the untrusted code runs, the child lowers its own rlimits: ``RLIMIT_CPU`` (backstop,
  whole seconds), ``RLIMIT_AS`` (``mem_mb``), ``RLIMIT_FSIZE = 0`` (no file growth),
  ``RLIMIT_NOFILE = 16``, ``RLIMIT_NPROC = 0`` (ineffective for root), ``RLIMIT_CORE = 0``; and arms
  ``ITIMER_PROF`` at ``cpu_s`` (sub-second CPU limit: SIGPROF terminates the process);
* then it installs an audit hook (PEP 578, ``sys.addaudithook``) that refuses ``socket.*``, opening
  anything for writing, reading outside the standard library, ``subprocess``/``os.system``/
  ``os.exec*``/``os.fork``/``os.posix_spawn``, file-system mutation (``os.remove``, ``os.mkdir``,
  ``shutil.*``, ...), ``ctypes``, ``resource.setrlimit`` and imports of ``socket``, ``ctypes``,
  ``subprocess``, ``multiprocessing``, ``mmap``, ``fcntl``, ``pty``.

The rlimits are set inside the child rather than in ``preexec_fn``: ``preexec_fn`` is documented as
unsafe when the parent has threads (the subprocess docs: the child "could deadlock before exec"),
and environments run many instances in threads of one process. Lowering limits before any
untrusted code runs gives the same guarantee.

Audit hooks are defence in depth, not a security boundary against adversarial code (PEP 578 says
so: e.g. ``gc``/frame tricks can defeat them); the rlimits, the empty environment and the process
group kill hold regardless. Run hostile code in a container or under seccomp.

Namespace of the code: builtins, ``math``'s public names (``sqrt``, ``pi``, ``comb``, ... except
``pow``, which stays the builtin), and the modules ``math cmath fractions decimal statistics
itertools functools random`` plus ``Fraction`` and ``Decimal``. Output: what the code prints, then,
as in a REPL, ``repr`` of the last statement when it is an expression with a value other than None.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

#: Largest code accepted (characters); calculator expressions are far shorter.
MAX_CODE_CHARS = 100_000

_MIN_MEM_MB = 64  # python -I -S itself maps ~20 MB; below this even the bootstrap fails

# The child bootstrap (run with ``python -I -S -B -c``). Reads {"code", "cpu_s", "mem_mb",
# "max_output"} as JSON on stdin; writes one JSON object {"ok", "output", "error"} on a private
# duplicate of fd 1 (fds 0/1 then point to /dev/null, so stray writes to fd 1 cannot corrupt it).
_CHILD = r'''
import sys, os, io, json, ast, builtins, resource, signal
import math, cmath, fractions, decimal, statistics, itertools, functools, random
cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
res_fd = os.dup(1)
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0); os.dup2(null, 1); os.close(null)
cap = int(cfg["max_output"])

class _Cap(io.TextIOBase):
    def __init__(self):
        self.parts, self.n, self.cut = [], 0, False
    def writable(self):
        return True
    def write(self, s):
        s = str(s)
        room = cap - self.n
        if len(s) > room:
            s, self.cut = s[:max(room, 0)], True
        if s:
            self.parts.append(s); self.n += len(s)
        return len(s)
    def text(self):
        return "".join(self.parts) + (" ...[output truncated]" if self.cut else "")

out = _Cap()
back = int(math.ceil(cfg["cpu_s"])) + 1
resource.setrlimit(resource.RLIMIT_CPU, (back, back + 1))
mem = int(cfg["mem_mb"]) * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
DENY = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
        "os.forkpty", "os.kill", "os.killpg", "os.remove", "os.unlink", "os.rename", "os.replace",
        "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod", "os.chown", "os.truncate",
        "os.chdir", "os.chroot", "os.putenv", "os.unsetenv", "os.setxattr", "os.removexattr",
        "os.utime", "os.chflags", "os.lchflags", "os.lchmod", "os.lchown", "os.mkfifo", "os.mknod",
        "os.startfile", "pty.", "shutil.", "ctypes.", "mmap.", "fcntl.", "urllib.", "http.",
        "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.", "webbrowser.",
        "sqlite3.", "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "signal.pthread_kill")
DENY_IMPORT = {"socket", "_socket", "ctypes", "_ctypes", "subprocess", "_posixsubprocess",
               "multiprocessing", "_multiprocessing", "mmap", "fcntl", "pty", "_ssl", "ssl"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _path_ok(p):
    if isinstance(p, int):
        return True
    try:
        p = os.path.abspath(os.fsdecode(p))
    except Exception:
        return False
    return p.startswith(STDLIB)

def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS):
            raise PermissionError(f"sandbox: opening {path!r} for writing is not allowed")
        if not _path_ok(path):
            raise PermissionError(f"sandbox: reading {path!r} is not allowed")
    elif event in ("os.listdir", "os.scandir"):
        if args and args[0] is not None and not _path_ok(args[0]):
            raise PermissionError(f"sandbox: listing {args[0]!r} is not allowed")
    elif event == "import":
        if args and str(args[0]).split(".")[0] in DENY_IMPORT:
            raise PermissionError(f"sandbox: import of {args[0]} is not allowed")
    elif event.startswith(DENY):
        raise PermissionError(f"sandbox: {event} is not allowed")

ns = {"__name__": "__sandbox__", "__builtins__": builtins}
ns.update({k: getattr(math, k) for k in dir(math) if not k.startswith("_") and k != "pow"})
ns.update(math=math, cmath=cmath, fractions=fractions, decimal=decimal, statistics=statistics,
          itertools=itertools, functools=functools, random=random,
          Fraction=fractions.Fraction, Decimal=decimal.Decimal)
code = cfg["code"]
sys.stdout = sys.stderr = out
sys.addaudithook(_hook)
signal.setitimer(signal.ITIMER_PROF, float(cfg["cpu_s"]))
ok, err = True, ""
try:
    tree = ast.parse(code, "<calc>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<calc>", "exec"), ns)
    if last is not None:
        v = eval(compile(last, "<calc>", "eval"), ns)
        if v is not None:
            out.write(repr(v))
except BaseException as e:
    ok = False
    try:
        err = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except BaseException:
        err = type(e).__name__
signal.setitimer(signal.ITIMER_PROF, 0)
try:
    text = out.text()
except BaseException:
    text = ""
os.write(res_fd, json.dumps({"ok": ok, "output": text, "error": err[:cap]}).encode("utf-8"))
os._exit(0)
'''


@dataclass
class SandboxResult:
    """Outcome of one sandboxed run."""

    ok: bool
    """The code ran to completion without an exception or a limit."""
    output: str
    """Printed text plus ``repr`` of a final expression (capped at ``max_output_chars``)."""
    error: str
    """``""`` when ok; else ``"ExcType: message"``, ``"CPU time limit exceeded (... s)"``, ``"wall-clock limit
    exceeded (... s)"`` or ``"sandbox failed: ..."``."""
    cpu_s: float
    """CPU seconds (user + system) the child used, from ``wait4`` rusage."""
    wall_s: float
    """Wall-clock seconds from spawn to reap."""


def run_python(expr_or_code: str, cpu_s: float = 1.0, wall_s: float = 2.0, mem_mb: int = 256,
               max_output_chars: int = 4000) -> SandboxResult:
    """Run ``expr_or_code`` (an expression or statements) in a fresh, limited Python subprocess.

    Args:
        expr_or_code: Python source, at most ``MAX_CODE_CHARS`` characters.
        cpu_s: CPU-time limit in seconds (``ITIMER_PROF``; ``RLIMIT_CPU`` backstop at
            ``ceil(cpu_s) + 1``).
        wall_s: wall-clock limit in seconds (the process group is SIGKILLed past it); includes the
            ~50 ms interpreter start.
        mem_mb: address-space limit (``RLIMIT_AS``) in MiB, >= 64.
        max_output_chars: cap on the returned output (and error) text.

    Returns:
        SandboxResult. Failures of the code (exceptions, limits, refused operations) are returned
        in ``error``, never raised. Thread-safe: each call owns its subprocess and pipes.

    Raises:
        ValueError: ``expr_or_code`` is not a str or too long, or a limit is not positive.
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
    payload = json.dumps({"code": expr_or_code, "cpu_s": float(cpu_s), "mem_mb": int(mem_mb),
                          "max_output": int(max_output_chars)}).encode("utf-8")
    read_cap = 4 * int(max_output_chars) + 4096  # JSON escaping may grow the text; stray bytes dropped

    t0 = time.monotonic()
    deadline = t0 + wall_s
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={}, cwd="/",
                            start_new_session=True, close_fds=True)
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
                    except BrokenPipeError:  # the child died before reading it all
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
    wall = time.monotonic() - t0
    cpu = ru.ru_utime + ru.ru_stime if ru is not None else 0.0
    rc = proc.returncode
    if timed_out:
        return SandboxResult(False, "", f"wall-clock limit exceeded ({wall_s:g} s)", cpu, wall)
    if rc in (-signal.SIGPROF, -signal.SIGXCPU) or (rc == -signal.SIGKILL and cpu >= cpu_s):
        return SandboxResult(False, "", f"CPU time limit exceeded ({cpu_s:g} s)", cpu, wall)
    try:
        res = json.loads(bytes(bufs[fd_out]).decode("utf-8"))
        return SandboxResult(bool(res["ok"]), str(res["output"]), str(res["error"]), cpu, wall)
    except (ValueError, KeyError, TypeError):
        tail = bytes(bufs[fd_err]).decode("utf-8", "replace").strip()[-500:]
        why = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        return SandboxResult(False, "", f"sandbox failed: {why}" + (f": {tail}" if tail else ""), cpu, wall)


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
