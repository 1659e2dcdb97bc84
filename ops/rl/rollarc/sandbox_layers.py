"""The layers inside the sandbox, as the source text the host hands to a fresh interpreter
(``ops.rl.rollarc.sandbox.run_python``): the trusted **supervisor** (``SUPERVISOR``; forks the child,
enforces the wall-clock deadline, reaps it with ``wait4`` and builds the result JSON itself) and the
untrusted **child** (``CHILD``; lowers its rlimits, enters a Landlock domain, installs the seccomp
filter and the PEP 578 audit hook, then runs the code). The host side (modes, bubblewrap's
namespaces, spawning and reading the report) is ``sandbox.py``; its docstring describes every
layer from the outside in. Both scripts run under ``python -I -S -B`` and import only the standard
library.
"""

# The untrusted child: the supervisor forks, points fd 0 at /dev/null and fds 1/2 at its pipes,
# closes every other descriptor (its own stdout, the result channel, among them) and execs this
# with ``cfg`` ({"code", "cpu_s", "mem_mb", "max_output"}) in the globals. It prints the code's
# output to fd 1 as it comes (capped); on an exception writes "ExcType: message" to fd 2 and exits
# 1; exits 0 otherwise. Nothing it writes is parsed as a result: the supervisor builds the result.
CHILD = r'''
import sys, os, io, ast, builtins, resource, signal
import math, cmath, fractions, decimal, statistics, itertools, functools, random
cap = int(cfg["max_output"])

class _Cap(io.TextIOBase):
    def __init__(self):
        self.n, self.cut = 0, False
    def writable(self):
        return True
    def write(self, s):
        s = str(s)
        if self.cut:
            return len(s)
        room = cap - self.n
        t = s
        if len(t) > room:
            t, self.cut = t[:max(room, 0)] + " ...[output truncated]", True
        if t:
            b = t.encode("utf-8", "replace")
            while b:
                b = b[os.write(1, b):]
            self.n += len(t)
        return len(s)

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

def _seccomp():
    # x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl)
    if os.uname().machine != "x86_64":
        return False
    import ctypes, struct
    deny = (41, 53, 56, 57, 58, 59, 62, 101, 129, 165, 200, 234, 248, 249, 250, 256, 272, 279, 297, 298,
            308, 310, 311, 312, 321, 322, 323, 424, 425, 426, 427, 434, 435, 438, 440)
    # calls that may target another process: allowed only on the caller itself (that argument == 0)
    self_only = {302: 0, 141: 1, 142: 0, 144: 0, 203: 0, 251: 1, 314: 0}  # prlimit64 setpriority sched_* ioprio_set
    # fcntl F_SETOWN / F_SETSIG / F_SETOWN_EX and ioctl FIOSETOWN / SIOCSPGRP: SIGIO aimed at another process
    cmds = {72: (8, 10, 15), 16: (0x8901, 0x8902)}
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, EPERM = 0x7FFF0000, 0x00050000 | 1
    prog, at = [], {}
    def op(code, k, jt=None, jf=None, label=None):
        if label:
            at[label] = len(prog)
        prog.append([code, jt, jf, k])
    op(LD, 4)
    op(JEQ, 0xC000003E, jf="deny")                 # not x86-64: deny
    op(LD, 0)
    op(JGE, 0x40000000, jt="deny")                 # x32 ABI: deny
    for nr in deny:
        op(JEQ, nr, jt="deny")
    for nr in self_only:
        op(JEQ, nr, jt=f"self{nr}")
    for nr in cmds:
        op(JEQ, nr, jt=f"cmd{nr}")
    op(RET, ALLOW)
    for nr, arg in self_only.items():
        op(LD, 16 + 8 * arg, label=f"self{nr}")    # low 32 bits of the pid argument (pid_t)
        op(JEQ, 0, jt="allow", jf="deny")
    for nr, bad in cmds.items():
        op(LD, 24, label=f"cmd{nr}")               # the command (unsigned int, 2nd argument)
        for c in bad:
            op(JEQ, c, jt="deny")
        op(RET, ALLOW)
    op(RET, ALLOW, label="allow")
    op(RET, EPERM, label="deny")
    for i, ins in enumerate(prog):
        for j in (1, 2):
            ins[j] = 0 if ins[j] is None else at[ins[j]] - i - 1
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Prog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: seccomp filter refused")
    return True

def _landlock():
    # Landlock (Linux >= 5.13; syscalls 444-446 on every arch): a domain of its own, so the kernel refuses
    # ptrace-class access to any process outside it (/proc/<worker>/mem, /proc/<worker>/environ in the
    # rlimits mode), no file creation/write/removal anywhere, no TCP bind/connect (ABI >= 4), no signals
    # or abstract unix sockets out of the domain (ABI >= 6). Best effort: a kernel without it skips it.
    import ctypes, struct
    libc = ctypes.CDLL(None, use_errno=True)
    abi = libc.syscall(444, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return 0
    fs = 0b1111111110010  # WRITE_FILE, REMOVE_DIR/FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM
    fs |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # REFER, TRUNCATE
    attr = struct.pack("Q", fs) + (struct.pack("Q", 0b11) if abi >= 4 else b"")  # BIND_TCP, CONNECT_TCP
    attr += struct.pack("Q", 0b11) if abi >= 6 else b""  # scoped: ABSTRACT_UNIX_SOCKET, SIGNAL
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = libc.syscall(444, buf, len(attr), 0)
    if fd < 0 or libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: landlock refused")
    os.close(fd)
    return abi

_landlock()
_seccomp()
del _seccomp, _landlock
for m in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
    del sys.modules[m]

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
    try:
        err = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    except BaseException:
        err = type(e).__name__
    b = err[:cap].encode("utf-8", "replace")
    while b:
        b = b[os.write(2, b):]
    os._exit(1)
os._exit(0)
'''

# The supervisor (trusted; ``python -I -S -B -c``). Reads {"code", "cpu_s", "mem_mb", "max_output",
# "deadline", "child"} on stdin (``deadline``: CLOCK_MONOTONIC seconds, the host's clock: the sandbox
# does not get a time namespace); forks the child (one interpreter start per call, not two: the
# modules the child uses are imported before the fork) and writes one JSON object {"ok", "output",
# "error", "cpu_s", "rc", "timed_out"} on its stdout, a descriptor the child does not hold.
SUPERVISOR = r'''
import json, os, selectors, signal, sys, time
import io, ast, builtins, resource, math, cmath, fractions, decimal, statistics, itertools, functools, random
cfg = json.loads(sys.stdin.buffer.read().decode("utf-8"))
cap = int(cfg["max_output"])
read_cap = 4 * cap + 4096
out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.setsid()
        lc = os.environ.get("LC_CTYPE")
        os.environ.clear()  # what the interpreter started with (an empty environment + PEP 538's LC_CTYPE): bwrap's PWD goes
        if lc:
            os.environ["LC_CTYPE"] = lc
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 20)
        child = {k: cfg[k] for k in ("code", "cpu_s", "mem_mb", "max_output")}
        exec(compile(cfg["child"], "<sandbox>", "exec"), {"__name__": "__sandbox_child__", "cfg": child})
    except BaseException as e:
        os.write(2, f"sandbox setup failed: {type(e).__name__}: {e}"[:1000].encode("utf-8", "replace"))
    finally:
        os._exit(70)
os.close(out_w)
os.close(err_w)
bufs = {out_r: bytearray(), err_r: bytearray()}
sel = selectors.DefaultSelector()
sel.register(out_r, selectors.EVENT_READ)
sel.register(err_r, selectors.EVENT_READ)
timed_out = False
def kill():
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
while sel.get_map():
    left = cfg["deadline"] - time.monotonic()
    if left <= 0:
        timed_out = True
        break
    for key, _ in sel.select(left):
        data = os.read(key.fd, 65536)
        if not data:
            sel.unregister(key.fd)
        elif len(bufs[key.fd]) < read_cap:
            bufs[key.fd] += data[: read_cap - len(bufs[key.fd])]
while True:  # wait for the child's exit without reaping it, so that its group id stays its own
    if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
        break
    if timed_out or time.monotonic() >= cfg["deadline"]:
        timed_out = True
        break
    time.sleep(0.002)
kill()  # the child at the deadline, and any process left in its group (none can exist under seccomp)
_, status, ru = os.wait4(pid, 0)
rc = os.waitstatus_to_exitcode(status)
def text(b):
    t = bytes(b).decode("utf-8", "replace")
    return t if len(t) <= cap + 22 else t[:cap] + " ...[output truncated]"
res = {"ok": rc == 0 and not timed_out, "output": text(bufs[out_r]), "error": text(bufs[err_r]).strip() if rc != 0 else "",
       "cpu_s": ru.ru_utime + ru.ru_stime, "rc": rc, "timed_out": timed_out}
b = json.dumps(res).encode("utf-8")
while b:
    b = b[os.write(1, b):]
'''
