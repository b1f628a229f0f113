"""`run` and `Popen` for the tests that start rope-lm's scripts as processes.

A script started with `python script.py` spends about 8 s of a CPU core on
imports (lightning, torch._dynamo, torchmetrics, transformers) before its first
line of work, and the suite starts scripts about a hundred times. Here a
`python <file>.py ...` command instead runs in a process forked from a
multiprocessing forkserver that imported those libraries once: it is still its
own process (own pid, signals, exit status, working folder, environment,
stdout and stderr), it runs the script as `__main__` with the same argv, and it
ends with the script's exit status. Anything else (`python -c`, `-m`, other
programs) goes to the real `subprocess`. `ROPE_LM_TESTS_FORK=0` sends every
command there too, e.g. to check a failure against a cold interpreter.
"""

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
TimeoutExpired, CompletedProcess = subprocess.TimeoutExpired, subprocess.CompletedProcess

# What the scripts import on their way to work; the server imports them once.
PRELOAD = [
    "torch",
    "hydra",
    "omegaconf",
    "lightning.pytorch",
    "transformers",
    "rope_lm.cli",
    "rope_lm.runs.pipeline",
    "rope_lm.eval.evaluation",
    "rope_lm.hf",
    "tests.forked",
]

_context = None


def context():
    """The multiprocessing context of the server (for tests that start Process
    targets of their own: they then skip the imports too)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _forkable(cmd) -> bool:
    if os.environ.get("ROPE_LM_TESTS_FORK", "1") == "0":
        return False
    return isinstance(cmd, (list, tuple)) and len(cmd) >= 2 and cmd[0] == sys.executable and str(cmd[1]).endswith(".py")


def _open_target(target, merged_into=None):
    """A path the child writes to, for a subprocess-style stdout/stderr argument."""
    if target is None:
        return None  # inherit: the test process's own file descriptor
    if target == DEVNULL:
        return os.devnull
    if target == STDOUT:
        return merged_into
    if target == PIPE:
        fd, path = tempfile.mkstemp(prefix="rope_lm_test_", suffix=".out")
        os.close(fd)
        return path
    return target.name  # an open file: the child appends to it


def _child(argv, cwd, env, out_path, err_path):
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        if path is not None:
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.dup2(target, fd)
            os.close(target)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()  # the child leaves with os._exit; a script's exit handlers still run


class Popen:
    """The part of subprocess.Popen the tests use."""

    def __init__(self, cmd, cwd=None, env=None, stdout=None, stderr=None, text=False, **_):
        self.args, self.text, self.returncode = cmd, text, None
        self._out = _open_target(stdout)
        self._err = self._out if stderr == STDOUT else _open_target(stderr)
        self._pipes = [p for p, t in ((self._out, stdout), (self._err, stderr)) if t == PIPE]
        self.stdout = self.stderr = None
        self._proc = context().Process(
            target=_child,
            args=(
                [str(a) for a in cmd[1:]],
                os.path.abspath(cwd or os.getcwd()),
                dict(env if env is not None else os.environ),
                self._out,
                self._err,
            ),
            daemon=False,
        )
        self._proc.start()
        self.pid = self._proc.pid
        self._wants = (stdout == PIPE, stderr == PIPE)

    def poll(self):
        if self.returncode is None and not self._proc.is_alive():
            self._proc.join()
            self.returncode = self._proc.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._proc.join(timeout)
        if self.poll() is None:
            raise TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def _read(self, path):
        with open(path, "rb") as f:
            data = f.read()
        return data.decode("utf-8", errors="replace") if self.text else data

    def communicate(self, timeout=None):
        self.wait(timeout)
        got = [self._read(path) if wanted else None for path, wanted in zip((self._out, self._err), self._wants)]
        if self._wants[1] and self._err == self._out:
            got[1] = got[0]
        for path in set(self._pipes):
            os.unlink(path)
        self._pipes = []
        return tuple(got)


def run(
    cmd,
    cwd=None,
    env=None,
    capture_output=False,
    text=False,
    timeout=None,
    check=False,
    stdout=None,
    stderr=None,
    **kwargs,
):
    """subprocess.run, with `python <file>.py ...` run in a forked process."""
    if not _forkable(cmd):
        return subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            capture_output=capture_output,
            text=text,
            timeout=timeout,
            check=check,
            stdout=stdout,
            stderr=stderr,
            **kwargs,
        )
    if capture_output:
        stdout = stderr = PIPE
    proc = Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text)
    try:
        out, err = proc.communicate(timeout)
    except TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def start(cmd, **kwargs):
    """subprocess.Popen, with `python <file>.py ...` run in a forked process."""
    return Popen(cmd, **kwargs) if _forkable(cmd) else subprocess.Popen(cmd, **kwargs)


def warm():
    """Starts the server (its imports take a few seconds), e.g. before timing a test."""
    started = time.monotonic()
    proc = context().Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join()
    return time.monotonic() - started
