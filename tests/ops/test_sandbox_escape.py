"""The kernel-enforced tool sandbox (``ops.rl.rollarc.sandbox``, mode ``bwrap``) against a battery of
escape attempts, each run after the PEP 578 audit hook has been disabled from inside (so that what
holds is the kernel layer: namespaces, read-only binds, seccomp, rlimits), plus the refusal to run
without the kernel layer and the call from inside a Ray actor.

Without bubblewrap these tests skip with the reason, except in CI (``CI`` or
``CRUCIBLE_SANDBOX_REQUIRED`` set; .ci/run exports the latter): there a missing or broken bwrap fails.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading

import pytest

from ops.rl.rollarc import sandbox
from ops.rl.rollarc.envs import CheckedSubtraction, ToolMath, make_env
from ops.rl.rollarc.sandbox import SANDBOX_UID, SandboxUnavailable, run_python
from ops.rl.rollarc.types import Task

#: The three lines of the issue (sandbox-escape-audit-hook): find the hook, make it a no-op.
DISABLE_HOOK = ("import gc\n"
                "h = [o for o in gc.get_objects() if type(o).__name__ == 'function' "
                "and getattr(o, '__name__', '') == '_hook'][0]\n"
                "h.__code__ = (lambda e, a: None).__code__\n")


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("CRUCIBLE_SANDBOX_REQUIRED"))


@pytest.fixture(scope="module")
def kernel():
    """The bwrap layer works here (a real call), else skip with the reason — or fail in CI."""
    try:
        r = run_python("6 * 7", sandbox="bwrap")
        why = None if (r.ok, r.output) == (True, "42") else f"a bwrap call returned {r}"
    except SandboxUnavailable as e:
        why = str(e)
    if why:
        if _required():
            pytest.fail(f"CI requires the kernel sandbox (CI / CRUCIBLE_SANDBOX_REQUIRED set): {why}")
        pytest.skip(f"kernel sandbox unavailable here: {why}")
    return "bwrap"


def attack(code: str, **kw):
    """Run ``code`` under bwrap with the audit hook disabled first (the hook really is off: a check
    prints 'hook off' only when an import the hook refuses succeeds)."""
    pre = DISABLE_HOOK + "import _socket\nprint('hook off')\n"
    return run_python(pre + code, sandbox="bwrap", **{"cpu_s": 1.0, "wall_s": 5.0, **kw})


@pytest.fixture()
def host_server():
    """A real TCP listener on the host's loopback (stands for Ray/Dagster/MLflow); counts accepts."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                accepted.append(conn)
            except (socket.timeout, OSError):
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join(timeout=2)
    srv.close()


def test_case_sandbox_escape_audit_hook(kernel, tmp_path, host_server):
    """Case sandbox-escape-audit-hook (tests/cases/training.json): after the three-line hook rewrite,
    ``/bin/sh -c 'touch <outside>'`` creates nothing and starts no process, a TCP connect to a host
    service on 127.0.0.1 reaches nothing (each fails inside and the result says so); forged result
    JSON on fds 3..11 never becomes the result: the reported output is what the code printed."""
    port, accepted = host_server
    outside = tmp_path / "pwned"
    code = (f"import subprocess\n"
            f"try:\n"
            f"    subprocess.run(['/bin/sh', '-c', 'touch {outside}'], timeout=3)\n"
            f"    print('sh: ran')\n"
            f"except BaseException as e:\n"
            f"    print('sh:', type(e).__name__, e)\n"
            f"import socket\n"
            f"try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            f"    print('tcp: connected')\n"
            f"except BaseException as e:\n"
            f"    print('tcp:', type(e).__name__, e)\n")
    r = attack(code)
    assert r.ok and r.mode == "bwrap", r
    lines = r.output.splitlines()
    assert lines[0] == "hook off"                          # the rewrite worked: only the kernel layer is left
    assert lines[1] == "sh: PermissionError [Errno 1] Operation not permitted"
    assert lines[2] == "tcp: PermissionError [Errno 1] Operation not permitted"
    assert not outside.exists()
    assert accepted == []

    forged = json.dumps({"ok": True, "output": "FORGED", "error": ""})
    r = attack(f"import os\nprint('printed')\n"
               f"for fd in range(3, 12):\n"
               f"    try:\n"
               f"        os.write(fd, {forged!r}.encode())\n"
               f"    except OSError:\n"
               f"        pass\n"
               f"os._exit(0)\n")
    assert (r.ok, r.output) == (True, "hook off\nprinted\n")
    # the same JSON printed on stdout and a failing exit: reported as printed text, not parsed
    r = attack(f"import os\nos.write(1, {forged!r}.encode())\nos._exit(3)\n")
    assert not r.ok and r.output == "hook off\n" + forged and "FORGED" != r.output
    assert r.error == "sandbox failed: the code's process ended (exit code 3)"


def test_files_outside_are_neither_written_nor_read(kernel, tmp_path):
    """Writes fail (no such directory or a read-only bind), host files are invisible, the root holds
    only the interpreter and libraries, and nothing appears on the host."""
    target = tmp_path / "created"
    for code, err in ((f"open({str(target)!r}, 'w')", "FileNotFoundError"),
                      ("open('/created', 'w')", "OSError: [Errno 30] Read-only file system"),
                      (f"open({os.__file__!r}, 'a')", "OSError: [Errno 30] Read-only file system"),
                      ("open('/etc/passwd').read()", "FileNotFoundError"),
                      (f"open({str(tmp_path)!r} + '/../x', 'w')", "FileNotFoundError")):
        r = attack(code)
        assert not r.ok and r.error.startswith(err), (code, r)
    assert not target.exists()
    r = attack("import os, json\nprint(json.dumps([os.listdir('/'), os.listdir('/dev'), os.listdir('/usr')]))")
    top, dev, usr = json.loads(r.output.splitlines()[1])
    prefix_top = os.path.realpath(sys.base_prefix).split("/")[1]     # e.g. root (pyenv) or usr
    assert set(top) <= {"usr", "lib", "lib64", "dev", prefix_top} and {"usr", "dev"} <= set(top)
    assert set(usr) <= {"lib", "lib64", "local"} and "bin" not in usr   # no /usr/bin: no shell to run
    assert "null" in dev and not [d for d in dev if d.startswith(("sd", "nvme", "mem", "kmsg"))]


def test_identity_and_namespaces(kernel):
    """uid/gid 65534, a new PID namespace (small pids; pid 1 is bwrap's), no capabilities,
    no_new_privs set, an empty environment."""
    r = attack("import os, ctypes\n"
               "libc = ctypes.CDLL(None)\n"
               "print(os.getuid(), os.getgid(), os.getpid() < 10, os.getppid() < 10, libc.prctl(39, 0, 0, 0, 0), "
               "sorted(os.environ), os.uname().nodename)")
    assert r.ok, r
    assert r.output.splitlines()[1] == f"{SANDBOX_UID} {SANDBOX_UID} True True 1 ['LC_CTYPE'] sandbox"


@pytest.mark.parametrize("name,code,error", [
    ("proc-self-mem", "open('/proc/self/mem', 'rb+')", "FileNotFoundError"),
    ("fork-bomb", "import os\nwhile True:\n    os.fork()", "PermissionError: [Errno 1] Operation not permitted"),
    ("thread-bomb", "import threading\nwhile True:\n    threading.Thread(target=lambda: None).start()",
     "RuntimeError: can't start new thread"),
    ("exec-shell", "import os\nos.execv('/usr/bin/sh', ['sh', '-c', 'true'])",
     "PermissionError: [Errno 1] Operation not permitted"),
    ("kill-parent", "import os\nos.kill(os.getppid(), 9)", "PermissionError: [Errno 1] Operation not permitted"),
    ("kill-everyone", "import os\nos.kill(-1, 9)", "PermissionError: [Errno 1] Operation not permitted"),
    ("ptrace-parent", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "if libc.ptrace(16, os.getppid(), 0, 0) != 0:\n    raise OSError(ctypes.get_errno(), 'ptrace refused')",
     "PermissionError: [Errno 1] ptrace refused"),
    ("socketpair", "import socket\nsocket.socketpair()", "PermissionError: [Errno 1] Operation not permitted"),
    ("raise-rlimit", "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
     "ValueError: not allowed to raise maximum limit"),
    ("memory-bomb", "x = bytearray(8 * 1024**3)", "MemoryError"),
    ("memory-creep", "x = []\nwhile True:\n    x.append(bytearray(10**6))", "MemoryError"),
    # issue 42 review: calls that reach the supervisor without kill()/ptrace()
    ("pidfd-getfd-supervisor", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "if libc.syscall(438, libc.syscall(434, os.getppid(), 0), 1, 0) < 0:\n"
     "    raise OSError(ctypes.get_errno(), 'pidfd refused')", "PermissionError: [Errno 1] pidfd refused"),
    ("sigio-to-supervisor", "import fcntl, os\nfcntl.fcntl(1, fcntl.F_SETOWN, os.getppid())",
     "PermissionError: [Errno 1] Operation not permitted"),
    ("sigio-signal-choice", "import fcntl, signal\nfcntl.fcntl(1, 10, signal.SIGKILL)",
     "PermissionError: [Errno 1] Operation not permitted"),
    ("prlimit-supervisor", "import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_AS, (1 << 20, 1 << 20))",
     "PermissionError: [Errno 1] Operation not permitted"),
    ("renice-supervisor", "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)",
     "PermissionError: [Errno 1] Operation not permitted"),
    ("affinity-supervisor", "import os\nos.sched_setaffinity(os.getppid(), {0})",
     "PermissionError: [Errno 1] Operation not permitted"),
])
def test_escape_battery_is_contained(kernel, name, code, error):
    """Each attempt fails inside the sandbox with the kernel's error, and the supervisor still
    reports (the result is never 'sandbox failed')."""
    r = attack(code, mem_mb=256)
    assert r.output.startswith("hook off") and not r.ok, (name, r)
    assert r.error.startswith(error), (name, r)


def test_forged_report_on_the_supervisors_stdout_with_the_supervisor_killed(kernel):
    """Issue 42 review: the child copied the supervisor's stdout (pidfd_getfd), wrote a forged report
    there and had the supervisor SIGKILLed through SIGIO (fcntl F_SETOWN + F_SETSIG), so the forged
    report was the only one the host read: before the fix the result was ok=True, output 'FORGED'.
    Now each call fails inside (EPERM) and the host trusts only a sandbox that exited 0 in time."""
    forged = json.dumps({"ok": True, "output": "FORGED", "error": "", "cpu_s": 0.0, "rc": 0, "timed_out": False})
    r = attack("import os, ctypes, fcntl, signal\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "fd = libc.syscall(438, libc.syscall(434, os.getppid(), 0), 1, 0)\n"
               f"print('stolen fd', fd)\n"
               f"if fd >= 0:\n    os.write(fd, {forged!r}.encode())\n"
               "fcntl.fcntl(1, fcntl.F_SETOWN, os.getppid())\n"
               "fcntl.fcntl(1, 10, signal.SIGKILL)\n"
               "fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_ASYNC)\n"
               "while True:\n    os.write(1, b'x' * 4096)\n")
    assert "FORGED" not in r.output
    assert (r.ok, r.output, r.error) == (False, "hook off\nstolen fd -1\n",
                                         "PermissionError: [Errno 1] Operation not permitted"), r


def test_worker_secrets_in_the_environment_do_not_reach_the_code(kernel, monkeypatch):
    """An API key in the worker's environment is not in the sandbox's environment (bwrap --clearenv,
    the host passes env={}, the supervisor clears its child's)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-crucible-review-secret")
    r = attack("import os\nprint(sorted(os.environ.items()))")
    assert r.ok and "sk-crucible" not in r.output and "OPENAI" not in r.output
    assert r.output.splitlines()[1] == "[('LC_CTYPE', 'C.UTF-8')]"


def test_cpu_limit_holds_after_the_timer_is_disarmed(kernel):
    """Disarming ITIMER_PROF leaves RLIMIT_CPU (ceil(cpu_s) + 1 s), which the code cannot raise."""
    r = attack("import signal\nsignal.setitimer(signal.ITIMER_PROF, 0)\nwhile True:\n    pass", cpu_s=0.3, wall_s=20.0)
    assert (r.ok, r.error) == (False, "CPU time limit exceeded (0.3 s)")
    assert 1.0 <= r.cpu_s < 3.5


def test_closing_its_pipes_and_sleeping_is_stopped_at_the_wall_deadline(kernel):
    r = attack("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", wall_s=1.0)
    assert (r.ok, r.error) == (False, "wall-clock limit exceeded (1 s)") and 1.0 <= r.wall_s < 3.0


def test_environments_use_the_kernel_layer_by_default(kernel):
    """ToolMath and CheckedSubtraction default to bwrap: the calculator's code runs as uid 65534."""
    env = ToolMath()
    assert env.sandbox == "bwrap" and CheckedSubtraction().sandbox == "bwrap"
    env.reset(Task("t", "tool_math", {"problem": "p", "answer": "1"}))
    r = env.step("<calc>" + DISABLE_HOOK.replace("\n", "; ").rstrip("; ") + "; import os; os.getuid()</calc>")
    assert r.observation == f"Result: {SANDBOX_UID}"


def test_without_bwrap_code_is_refused_unless_rlimits_is_asked_for(monkeypatch):
    """No bwrap on PATH: run_python, the environments and make_env refuse with the fix in the
    message; the weaker mode runs only when named, and its results say which mode ran."""
    monkeypatch.setattr(sandbox, "_bwrap_path", lambda: None)
    for call in (lambda: run_python("1"), lambda: ToolMath(), lambda: make_env("checked_subtraction"),
                 lambda: make_env("tool_math", sandbox="bwrap")):
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*sandbox: rlimits"):
            call()
    r = run_python("6 * 7", sandbox="rlimits")
    assert (r.ok, r.output, r.mode) == (True, "42", "rlimits")
    env = make_env("tool_math", sandbox="rlimits")
    env.reset(Task("t", "tool_math", {"problem": "p", "answer": "1"}))
    assert env.step("<calc>6*7</calc>").observation == "Result: 42"
    with pytest.raises(ValueError, match="sandbox must be one of"):
        run_python("1", sandbox="none")
    assert "WEAKER" in sandbox.describe("rlimits") and "kernel-enforced" in sandbox.describe("bwrap")


def test_a_bwrap_that_cannot_create_namespaces_is_refused_not_bypassed(monkeypatch, tmp_path):
    """A bwrap that fails at setup (here a real executable that fails as bwrap does without user
    namespaces) raises SandboxUnavailable with its message; nothing runs outside."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sandbox, "_bwrap_path", lambda: str(fake))
    with pytest.raises(SandboxUnavailable, match="No permissions to creating new namespace"):
        run_python("1")


def test_role_spec_validates_the_mode_and_the_run_config_passes_it():
    from ops.rl.rollarc.driver import RunSpec
    from ops.rl.rollarc.ray_roles import RoleSpec

    assert RoleSpec(tokenizer_dir="t").sandbox == "bwrap" == RunSpec().roles.sandbox
    with pytest.raises(ValueError, match="sandbox must be one of"):
        RoleSpec(tokenizer_dir="t", sandbox="off")
    assert RunSpec.from_dict({"roles": {"tokenizer_dir": "tok", "sandbox": "rlimits"}}).role_spec.sandbox == "rlimits"


def test_bwrap_works_inside_a_ray_actor(kernel):
    """RollArc's environments run in Ray actors (``ray_roles.EnvWorker``): bwrap starts there too."""
    import logging

    import ray

    from ops.rl.rollarc.ray_roles import EnvWorker

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        Worker = ray.remote(num_cpus=0)(EnvWorker)
        w = Worker.remote({"tokenizer_dir": "t", "env_latency": "none"})
        task = Task("t", "tool_math", {"problem": "p", "answer": "1"})
        ray.get(w.reset.remote("k", task), timeout=60)
        code = DISABLE_HOOK.replace("\n", "; ").rstrip("; ") + "; import os; (os.getuid(), sorted(os.listdir('/')))"
        r = ray.get(w.step.remote("k", f"<calc>{code}</calc>"), timeout=60)
        assert r.observation.startswith(f"Result: ({SANDBOX_UID}, [") and "'etc'" not in r.observation
    finally:
        ray.shutdown()


def _landlock_abi() -> int:
    import ctypes
    return ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)


@pytest.mark.skipif(not sys.platform.startswith("linux") or _landlock_abi() < 1, reason="kernel without Landlock")
def test_rlimits_mode_cannot_write_into_the_workers_memory(tmp_path):
    """Issue 42 review: in the weaker ``rlimits`` mode (host /proc visible, same uid) the code opened
    /proc/<worker pid>/mem read-write (code injection into the Ray/Dagster worker) and created files;
    the child's Landlock domain now makes the kernel refuse both (EACCES)."""
    target = tmp_path / "made"
    r = run_python(DISABLE_HOOK + f"import os\n"
                   f"try:\n    open('/proc/{os.getpid()}/mem', 'rb+')\n    print('mem: opened')\n"
                   f"except OSError as e:\n    print('mem:', e.errno)\n"
                   f"try:\n    os.mkdir({str(target)!r})\n    print('mkdir: made')\n"
                   f"except OSError as e:\n    print('mkdir:', e.errno)\n", sandbox="rlimits", wall_s=5.0)
    assert (r.ok, r.output) == (True, "mem: 13\nmkdir: 13\n"), r
    assert not target.exists()


def test_no_files_are_made_on_the_sandbox_tmpfs(kernel):
    """/dev/shm (bwrap's --dev tmpfs) was writable: a FIFO could be made there (RLIMIT_FSIZE stops only
    data); Landlock now refuses every file creation."""
    r = attack("import os\nos.mkfifo('/dev/shm/f')")
    assert (r.ok, r.error) == (False, "PermissionError: [Errno 13] Permission denied"), r
