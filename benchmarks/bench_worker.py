"""The measuring process and its protocol: the coordinator
(benchmarks/throughput.py) starts this file as a script, writes one JSON
command a line on its stdin (build, warm, block, eval, exit) and reads one
JSON answer a line from its stdout; everything else the process prints goes
to stderr, whose tail is the error when it dies."""

import json
import os
import subprocess
import sys
import tempfile
import time

from bench_machine import _peak_rss_kb
from bench_peers import LightningRunner, build_train_runner, measure_eval
import torch


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


class _Channel:
    """The worker's side: commands from stdin, answers on the original stdout;
    anything else printed (Lightning, warnings) goes to stderr."""

    def __init__(self):
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def read(self) -> dict:
        line = sys.stdin.readline()
        return json.loads(line) if line else {"cmd": "exit"}

    def reply(self, obj: dict):
        self.out.write(json.dumps(obj) + "\n")


def _exit_with_parent():
    """A worker outlives a killed coordinator only as long as it computes;
    this ends it then too."""
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(2)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker_main():
    """A measuring process: build, then warm/block commands, or one eval."""
    _exit_with_parent()
    channel = _Channel()
    state: dict = {}

    def answer(msg, wall, cpu):
        out = {"ok": True, "seconds": wall, "cpu_seconds": cpu}
        if msg["cmd"] == "warm":
            fwd = state["fwd"]
            out.update(
                compiled=None if fwd is None else fwd.compiled, compile_error=None if fwd is None else fwd.reason
            )
        elif state["spec"]["device"] == "cuda":
            out["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        else:
            out["peak_mem_mb"] = _peak_rss_kb() / 1024
        return out

    while True:
        msg = channel.read()
        cmd = msg["cmd"]
        if cmd == "exit":
            channel.reply({"ok": True})
            return
        try:
            if cmd == "eval":
                out = {"ok": True, **measure_eval(msg["spec"])}
            elif cmd == "build":
                state["spec"] = msg["spec"]
                state["runner"], counts, state["fwd"] = build_train_runner(msg["spec"])
                out = {"ok": True, **counts}
            elif cmd in ("warm", "block") and isinstance(state.get("runner"), LightningRunner):
                state["runner"].drive(channel, msg, answer)  # serves every command up to 'exit'
                return
            elif cmd in ("warm", "block"):
                if cmd == "block" and state["spec"]["device"] == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                out = answer(msg, *state["runner"].steps(msg["n"]))
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as e:
            out = {"ok": False, "error": _error_text(e)}
        channel.reply(out)


class Worker:
    """A measuring process (see _worker_main) and its command channel."""

    def __init__(self):
        self.errors = tempfile.TemporaryFile(mode="w+")
        # This file run as a script is the worker (see the end of the file).
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            bufsize=1,
        )

    def call(self, cmd: str, **kwargs) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **kwargs}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.proc.wait()
            self.errors.seek(0)
            tail = " | ".join(self.errors.read().strip().splitlines()[-3:])
            return {"ok": False, "error": f"measuring process exited with {self.proc.returncode}: {tail}"}
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.call("exit")
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.errors.close()


if __name__ == "__main__":
    _worker_main()
