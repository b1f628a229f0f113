"""Stops by a signal that say what they kept: SIGTERM is raised where Ctrl-C
raises KeyboardInterrupt (as `Terminated`), for the span of a long piece of
work, so the work can report what is on disk and how to finish before the
process ends with the shell's status for that signal (143, 130)."""

import contextlib
import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def signals_stop():
    def stop(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_status(e: KeyboardInterrupt) -> int:
    """The exit status the shell gives the signal that raised `e`."""
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
