import errno
import os
import re
import shutil


class RopeLMError(Exception):
    """An error the user can act on; entry points print it as one paragraph,
    without a traceback."""


class ConfigError(RopeLMError, ValueError):
    """A user error in the configuration or input data, raised before
    expensive work starts."""


class UnwritableFolder(ConfigError):
    """An output or cache folder that cannot be written (read-only file
    system, permissions, a file in its path): a setting moves it, but the
    fault is the machine's, so it exits 1 as a failed write does."""

    exit_status = 1


class TrainingDiverged(RopeLMError):
    """The training loss or the weights became NaN or infinite."""


class EvaluationNotFinite(RopeLMError):
    """An evaluation gave a perplexity that is not a number: the run is not complete."""


class OutputError(RopeLMError):
    """A result or checkpoint could not be written (disk full, permissions).
    One made by write_failure keeps its parts (`failure`), so a caller that
    knows more (the setting that moves the file, how to go on) can say it:
    `reworded(setting=..., then=...)`."""

    failure: dict | None = None

    def reworded(self, **changes) -> "OutputError":
        if self.failure is None:
            return self
        return write_failure(**{**self.failure, **changes})


FULL, DENIED, OTHER = "full", "denied", "other"
_FULL_CODES = {errno.ENOSPC: FULL, errno.EDQUOT: FULL, errno.EFBIG: FULL}
_DENIED_CODES = {errno.EROFS: DENIED, errno.EACCES: DENIED, errno.EPERM: DENIED}
# Errors of libraries written in Rust or C++ (safetensors, tokenizers, torch's zip writer) carry no errno: their
# message names it (Rust's "os error 28" or "Os { code: 28, ...}", Python's "[Errno 28]") or the OS's words for it.
_CODE_IN_TEXT = (r"\bos error (\d+)", r"Os \{ code: (\d+)", r"\[Errno (\d+)\]")
_WORDS = {os.strerror(code): code for code in (*_FULL_CODES, *_DENIED_CODES)}


def error_code(error: BaseException) -> int | None:
    """The errno of a failed write, also where a library's error only names it in its text."""
    code = getattr(error, "errno", None)
    if isinstance(code, int):
        return code
    text = str(error)
    for pattern in _CODE_IN_TEXT:
        found = re.search(pattern, text)
        if found and int(found.group(1)) in {**_FULL_CODES, **_DENIED_CODES}:
            return int(found.group(1))
    return next((n for words, n in _WORDS.items() if words in text), None)


def write_problem(error: BaseException) -> str:
    """FULL (no space, quota, file too large), DENIED (read-only file
    system, permissions) or OTHER."""
    # torch's zip writer reports a write that the disk refused as RuntimeError("[enforce fail at
    # inline_container.cc] unexpected pos ..." / "file write failed"), without an errno.
    if isinstance(error, RuntimeError) and any(m in str(error) for m in ("unexpected pos", "write failed")):
        return FULL
    code = error_code(error)
    return _FULL_CODES.get(code) or _DENIED_CODES.get(code) or OTHER


def size_text(n: int) -> str:
    """Bytes in words: 512 bytes, 40 KiB, 3.2 MiB, 1.5 GiB."""
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if n >= 10 else f"{n:.1f} {unit}"
    raise AssertionError


def _existing(path: str) -> str:
    """path, or its nearest folder that exists."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def free_space(path: str) -> int | None:
    """Free bytes on the disk of path (or of its nearest existing folder)."""
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return None


def write_failure(
    path: str,
    error: BaseException,
    kept: str = "",
    setting: str | None = None,
    then: str | None = None,
    written: int | None = None,
    elsewhere: str | None = None,
) -> OutputError:
    """One paragraph for a failed write: the file, the cause in words (a full
    disk, a read-only or forbidden folder, or the error itself), how much
    space is left, what was kept, and what to do: free space or choose
    another place (`setting` names the setting that moves the file), then
    `then` (by default: run the same command again). `written`: the bytes
    written before a full disk stopped the write (removed since).
    `elsewhere`: the other way out in words, where no one setting moves the
    file (e.g. "move the run folder to a disk with more room")."""
    # A folder that exists is its own place (a mount point's parent is another disk).
    directory = path if os.path.isdir(path) else _existing(os.path.dirname(os.path.abspath(path)))
    problem = write_problem(error)
    move = f"set {setting} to" if setting else "choose"
    if problem == FULL:
        free = free_space(directory)
        cause = "the disk is full" + (f" after {size_text(written)} of it were written" if written else "")
        cause += f" ({size_text(free)} free in {directory})" if free is not None else ""
        fix = f"Free some space on that disk, or {elsewhere or f'{move} a folder on a disk with more room'}"
    elif problem == DENIED:
        cause = f"{directory} is not writable ({os.strerror(error_code(error) or errno.EACCES)})"
        fix = f"Make that folder writable, or {elsewhere or f'{move} a writable folder'}"
    else:
        first = str(error).splitlines()[0] if str(error) else ""
        cause = f"{type(error).__name__}: {first}"
        fix = f"Check the disk and the folder (or {elsewhere or f'{move} another folder'})"
    kept = kept.strip()
    next_step = then or "run the same command again"
    message = f"Could not write {path}: {cause}. {kept + ' ' if kept else ''}{fix}, then {next_step}."
    failure = OutputError(message)
    failure.failure = {
        "path": path,
        "error": error,
        "kept": kept,
        "setting": setting,
        "then": then,
        "written": written,
        "elsewhere": elsewhere,
    }
    return failure


class Interrupted(RopeLMError):
    """A run stopped by SIGTERM or Ctrl-C after saying what it kept and how
    to finish; its exit status is the shell's for that signal (143, 130)."""

    def __init__(self, message: str, exit_status: int = 143):
        super().__init__(message)
        self.exit_status = exit_status
