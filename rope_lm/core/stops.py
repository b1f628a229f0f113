"""Stops by a signal that say what they kept: SIGTERM is raised where Ctrl-C
raises KeyboardInterrupt (as `Terminated`), for the span of a long piece of
work, so the work can report what is on disk and how to finish before the
process ends with the shell's status for that signal (143, 130)."""

import contextlib
import os
import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt."""


class Stop:
    """What signals_stop yields: whether SIGTERM came. A library that turns the exception raised in
    its code into an error of its own (Optuna, interrupted inside its trial bookkeeping) still lets
    the caller tell a stop from a failure."""

    signalled = False

    def reraise_if_stopped(self) -> None:
        if self.signalled:
            raise Terminated from None


@contextlib.contextmanager
def signals_stop():
    owner, record = os.getpid(), Stop()

    def stop(signum, frame):
        if os.getpid() != owner:  # a forked worker (a pool's) inherited the handler: it ends as SIGTERM ends it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        record.signalled = True
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield record
        return
    try:
        yield record
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_status(e: KeyboardInterrupt) -> int:
    """The exit status the shell gives the signal that raised `e`."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def signals_deferred():
    """SIGTERM and Ctrl-C held back for the span of a few steps that must all happen or none (a set of
    files renamed into place), then delivered as they would have been."""
    caught = []

    def hold(signum, frame):
        caught.append(signum)

    try:
        previous = {s: signal.signal(s, hold) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        for s in caught[:1]:
            signal.raise_signal(s)


def rerun_command(script: str, argv: list[str], replaced: tuple[str, ...], extra: list[str]) -> str:
    """The command that finishes a stopped piece of work: `python scripts/<script>` with the arguments
    it was given (`+` and `~` prefixes read through), those setting a key in `replaced` dropped and
    `extra` appended, quoted for a shell."""
    import shlex

    kept = [a for a in argv if not a.lstrip("+~").startswith(tuple(f"{k}=" for k in replaced))]
    return f"python scripts/{script} " + shlex.join([*kept, *extra])
