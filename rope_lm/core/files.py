"""File chores every writer shares: a write that a kill cannot truncate, a
folder built aside and renamed into place, a JSON record, a figure, and a new
folder name that never reuses an old one."""

import contextlib
import glob
import io
import json
import logging
import os
import shutil
import tempfile

from rope_lm.core.errors import write_failure


@contextlib.contextmanager
def replaced_atomically(path: str, errors: tuple = (OSError,)):
    """Yields a temporary file's path beside `path`; what the block writes
    there replaces `path` by a rename when the block ends, so a kill
    mid-write leaves the previous version intact, never a truncated file.
    A failure of the kinds in `errors` is one paragraph (write_failure)
    saying what was kept."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-" + os.path.basename(path))
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
    except errors as e:
        kept = f"The previous {os.path.basename(path)} is untouched. " if os.path.exists(path) else ""
        raise write_failure(path, e, kept) from None
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: str, data: str | bytes):
    """Write data via a temporary file and a rename (replaced_atomically),
    flushed to the disk before the rename."""
    with replaced_atomically(path) as tmp:
        # mkstemp makes the file private (0600); results should be as readable as any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
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
    os.makedirs(tmp)
    try:
        build(tmp)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
