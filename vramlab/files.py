"""The one way vramlab writes a file: whole or not at all.

:func:`write_atomically` writes the bytes to a new temporary file in the same folder, syncs it,
gives it the mode a plain ``open()`` would (``0666`` less the umask: a collector running as
another user can read it), and renames it over the target (``rename(2)``: atomic within one
filesystem, and a symbolic link at the target is replaced, not followed). A reader sees the old
file or the new one, never half of one. On any failure, an interrupt included, the temporary file
is removed and the target is left as it was.

A process killed in the middle of a write (``SIGKILL``, a power cut) cannot remove its temporary
file. Its name carries the writer's process id (``.NAME.PID.XXXXXXXX.tmp``), so the next write of
the same file removes those whose writer no longer runs. The temporary files of a writer that is
still running are left alone.

Used by the history export (:meth:`vramlab.model.History.export`) and the Prometheus text file
(:func:`vramlab.exposition.write_textfile`).
"""

from __future__ import annotations

import errno
import os
import re
import tempfile

__all__ = ["write_atomically", "umask"]


def umask() -> int:
    """The process's umask, read without changing it where Linux says it
    (``/proc/self/status``), else set and restored at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process, or an id we cannot ask about: leave its file alone
    return True


def _remove_stale(folder: str, name: str) -> None:
    """Remove ``.NAME.PID.*.tmp`` files beside the target whose writer process is gone."""
    pattern = re.compile(r"^\." + re.escape(name) + r"\.(\d+)\.[^/]*\.tmp$")
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    me = os.getpid()
    for entry in entries:
        m = pattern.match(entry)
        if m is None or int(m.group(1)) == me or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(folder, entry))
        except OSError:
            pass


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` (bytes), whole or not at all (module docs).

    Raises:
        OSError: with ``path`` in its message and the failed call's ``errno`` (a full disk is
            ``ENOSPC``); ``path`` is then unchanged and no temporary file is left.
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp: str | None = None
    try:
        _remove_stale(folder, name)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.{os.getpid()}.", suffix=".tmp")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            try:
                os.fsync(fd)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: a filesystem without fsync; anything else is a failed write
                    raise
            mode = 0o666 & ~umask()  # mkstemp creates 0600
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)
            else:  # pragma: no cover - Windows before Python 3.13
                os.chmod(tmp, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        why = f"cannot write {path!r}: {e.strerror or e}"
        raise (OSError(e.errno, why) if e.errno is not None else OSError(why)) from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
