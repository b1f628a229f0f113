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


class OutputError(RopeLMError):
    """A result or checkpoint could not be written (disk full, permissions)."""


def write_failure(path: str, error: BaseException, kept: str = "") -> OutputError:
    """One paragraph for a failed write: the file, the cause in words, how
    much space is left, and what was kept."""
    import errno
    import os
    import shutil

    directory = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    code = getattr(error, "errno", None)
    # torch's zip writer reports a write that the disk refused as RuntimeError("[enforce fail at
    # inline_container.cc] unexpected pos ..." / "file write failed"), without an errno.
    torn = isinstance(error, RuntimeError) and any(m in str(error) for m in ("unexpected pos", "write failed"))
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or torn or (free is not None and free < 64 << 20):
        cause = "the disk is full" + (f" ({free / 2**20:.0f} MiB free in {directory})" if free is not None else "")
        fix = "free some space (or point hydra.run.dir / data.cache_dir at a larger disk)"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        cause = f"{directory} is not writable ({os.strerror(code)})"
        fix = "fix the folder's permissions or choose a writable output folder"
    else:
        first = str(error).splitlines()[0] if str(error) else ""
        cause = f"{type(error).__name__}: {first}"
        fix = "check the disk and the folder"
    return OutputError(
        f"Could not write {path}: {cause}. {kept}Then {fix}, and resume the run "
        f"(python train.py resume=<run dir>).".replace("  ", " ")
    )


class Interrupted(RopeLMError):
    """A run stopped by SIGTERM or Ctrl-C after saying what it kept and how
    to finish; its exit status is the shell's for that signal (143, 130)."""

    def __init__(self, message: str, exit_status: int = 143):
        super().__init__(message)
        self.exit_status = exit_status
