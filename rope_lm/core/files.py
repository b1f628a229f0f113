"""File chores every writer shares: a write that a kill cannot truncate, a
folder built aside and renamed into place, a JSON record, a figure, and a new
folder name that never reuses an old one."""

import contextlib
import contextvars
import errno
import glob
import io
import json
import logging
import os
import shutil
import tempfile
import traceback

from rope_lm.core.errors import OutputError, free_space, write_failure
from rope_lm.core.stops import signals_deferred

# The files of a written_together block waiting for their rename: [(temporary file, path)], or None.
_STAGED: contextvars.ContextVar = contextvars.ContextVar("rope_lm_staged_files", default=None)


@contextlib.contextmanager
def written_together(folder: str, setting: str | None = None, what: str = "output", new: bool = False):
    """The files the block writes (replaced_atomically, atomic_write,
    write_json, save_figure) replace theirs together when it ends: a write
    that fails (a full disk) leaves every earlier file of the set as it was,
    never a new table beside an old plot, and removes `folder` where the
    block made it (or, with `new`, where the caller made it for this set,
    while it is empty). The failure is one paragraph naming `setting` (the
    one that moves the folder, e.g. "out=")."""
    made = _first_missing(folder) or (os.path.abspath(folder) if new else None)
    staged: list = []
    token = _STAGED.set(staged)
    try:
        yield
    except BaseException as e:
        for tmp, _ in staged:
            _remove(tmp)
        _remove_empty(os.path.abspath(folder), made)
        if not isinstance(e, OutputError):
            raise
        if os.path.isdir(folder):
            kept = f"No file of this {what} was written: {folder} is as it was."
        else:
            kept = f"Nothing of this {what} was kept: {folder} was not made."
        raise e.reworded(kept=kept, setting=setting) from None
    finally:
        _STAGED.reset(token)
    with signals_deferred():  # a stop (SIGTERM, Ctrl-C) comes after the whole set is in place, never amid it
        for tmp, path in staged:
            os.replace(tmp, path)


@contextlib.contextmanager
def replaced_atomically(path: str, errors: tuple = (OSError,)):
    """Yields a temporary file's path beside `path`; what the block writes
    there replaces `path` by a rename when the block ends, so a kill
    mid-write leaves the previous version intact, never a truncated file.
    A failure of the kinds in `errors` is one paragraph (write_failure)
    saying what was kept."""
    tmp, folder = None, os.path.dirname(os.path.abspath(path))
    made = _first_missing(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-" + os.path.basename(path))
        os.close(fd)
        # mkstemp makes the file private (0600); results, checkpoints and models should be as readable as any
        # file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        staged = _STAGED.get()
        if staged is None:
            os.replace(tmp, path)
        else:  # renamed with the rest of its set, when the written_together block ends
            staged.append((tmp, path))
            tmp = None
    except errors as e:
        # The writer's frames may still hold the file open (its space is not freed until it is closed).
        chained, seen = e, set()
        while chained is not None and id(chained) not in seen:
            seen.add(id(chained))
            traceback.clear_frames(chained.__traceback__)
            chained = chained.__context__
        written = _remove(tmp)  # first, so that the space it took counts as free in the message
        _remove_empty(folder, made)  # the folders made for it, which it never reached
        kept = f"The previous {os.path.basename(path)} is untouched. " if os.path.exists(path) else ""
        raise write_failure(path, e, kept, written=written) from None
    finally:
        _remove(tmp)


def _first_missing(path: str) -> str | None:
    """The outermost folder of path that does not exist yet (None when path exists)."""
    path, missing = os.path.abspath(path), None
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing, path = path, os.path.dirname(path)
    return missing


def _remove_empty(folder: str, made: str | None) -> None:
    """Remove folder and its parents up to `made`, the outermost one a failed write made, while empty."""
    if made is None:
        return
    while True:
        try:
            os.rmdir(folder)
        except OSError:
            return
        if folder == made or os.path.dirname(folder) == folder:
            return
        folder = os.path.dirname(folder)


def _remove(path: str | None) -> int | None:
    """Remove a temporary file if it is there; its size, or None."""
    try:
        size = os.path.getsize(path)
        os.unlink(path)
    except (OSError, TypeError):
        return None
    return size


def atomic_write(path: str, data: str | bytes):
    """Write data via a temporary file and a rename (replaced_atomically),
    flushed to the disk before the rename."""
    with replaced_atomically(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())


def build_folder(target: str, build, what: str) -> None:
    """Make the folder `target` by `build(tmp)` in a temporary folder beside
    it, then rename it into place (replacing an older `target`): a build
    stopped part-way never leaves a half-made target. Call it under the
    target's lock, so that any temporary folder found there is the leftover
    of a build (`what`) that was killed before its cleanup: it is removed."""
    for stale in glob.glob(glob.escape(target) + ".tmp-*"):
        logging.getLogger("rope_lm").info("Removing %s, left by a %s that was stopped", stale, what)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = f"{target}.tmp-{os.getpid()}"
    parent = os.path.dirname(os.path.abspath(target))
    made = _first_missing(parent)
    try:
        os.makedirs(tmp)
        build(tmp)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(parent, made)  # the folders made for it: a failed build leaves no empty folder behind
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_room(path: str, setting: str, need: int = 64 << 10) -> None:
    """OutputError, before anything is written, when the disk that would
    hold path has less than `need` bytes free: not even a run's own
    bookkeeping (Hydra's saved settings, a few KiB, and its log) would fit,
    and the run would stop half-made."""
    free = free_space(path)
    if free is not None and free < need:
        raise write_failure(
            path,
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
            kept="Nothing was started or written there.",
            setting=setting,
        )


def from_here(path: str) -> str:
    """Relative to the working directory when under it, so a committed results
    file names no home folder (a path elsewhere stays as it is)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def write_json(path: str, obj):
    atomic_write(path, json.dumps(obj, indent=1, default=str))


def save_figure(fig, path: str, palette: bool = False):
    """Write a matplotlib figure as PNG atomically. With palette, as 256
    colours: line plots use a few dozen, and the file is a third of the size,
    small enough to commit next to a results page."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    if palette:
        from PIL import Image

        buf.seek(0)
        with Image.open(buf) as im:
            small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        buf = io.BytesIO()
        small.save(buf, format="png", optimize=True)
    atomic_write(path, buf.getvalue())


def fresh_dir(path: str) -> str:
    """path, or path-2, path-3, ...: the first name not taken yet, so a
    default output folder never lands in an earlier result's. The caller
    creates it only once its inputs are checked (no empty folder left behind
    by a refused run)."""
    candidate, n = path, 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate
