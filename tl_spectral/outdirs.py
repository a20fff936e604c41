"""Output folders the command line writes whole (``analyze --out``, ``geometry --out``):
the folder's identity taken at the start, a temporary sibling named with this process's pid,
and the swap at the end under a lock on the parent, re-checked atomically (``renameat2``),
so that nothing of the user's is replaced without ``--overwrite``."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from tl_spectral._leftovers import remove_dead_leftovers  # noqa: F401 - used by the CLI
from tl_spectral.usage import UsageError

#: The file that marks a folder as a report written by ``tl-spectral analyze``.
REPORT_MARKER = ".tl_spectral_report.json"


def check_out_dir(out: Path, overwrite: bool, *, marker: str = REPORT_MARKER,
                  what: str = "report") -> None:
    """``--out``: a folder we may write a report into. A file, an unwritable place, or a
    non-empty folder that is not a tl_spectral report are refused; an earlier report only
    with ``overwrite``. (``marker``/``what``: the file that marks, and the name of, another
    kind of output folder, e.g. ``tl-spectral geometry``'s).
    """
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link; pass the folder it points to "
                         f"({out.resolve()}) or a new folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; pass a folder for the {what}")
    if out.is_dir() and any(out.iterdir()):
        if not (out / marker).is_file():
            raise UsageError(f"--out {out} is a non-empty folder that is not a tl_spectral "
                             f"{what}; pass an empty or new folder")
        if not overwrite:
            raise UsageError(f"--out {out} holds an earlier {what}; pass --overwrite to "
                             "replace it whole, or choose another folder")
    base = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not base.is_dir():
        raise UsageError(f"--out {out}: {base} is a file, not a folder; pass a folder")
    try:  # a real probe: permission bits say little when running as root
        tempfile.TemporaryDirectory(dir=base).cleanup()
    except OSError as e:
        raise UsageError(f"--out {out}: {base} is not writable ({e.strerror}); pass a folder "
                         "you can write to") from None



def out_path(value: str) -> Path:
    """``--out`` as an absolute path (its last component not followed): the current folder
    or one above it is refused (the output replaces the folder whole)."""
    p = Path(value)
    out = p.parent.resolve() / p.name if p.name not in ("", ".", "..") else p.resolve()
    cwd = Path.cwd().resolve()
    if out == cwd or out in cwd.parents or out.parent == out:
        raise UsageError(f"--out {value} is the current folder or one above it; the output "
                         "replaces its folder whole: pass a new folder name (e.g. --out "
                         "report)")
    return out


def path_identity(path: Path) -> Optional[tuple[int, int]]:
    """(device, inode) of ``path`` itself (links not followed), None when absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def out_leftover_patterns(out: Path) -> list[str]:
    """The names of a killed run's temporary and set-aside folders beside ``out``."""
    n = re.escape(out.name)
    return [rf"\.{n}\.tmp-(?P<pid>\d+)-[A-Za-z0-9_]+", rf"\.{n}\.old-(?P<pid>\d+)"]


def tmp_out_dir(out: Path) -> Path:
    """A fresh temporary sibling of ``out`` whose name records this process (a killed run's
    one is removed by the next run: :func:`remove_dead_leftovers`)."""
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))


class DirLock:
    """An exclusive ``flock`` on a folder (no lock file left behind), where the OS has one."""

    def __init__(self, folder: Path):
        self.folder, self.fd = folder, None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        self.fd = os.open(self.folder, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
        return False


def renameat2(a: Path, b: Path, flags: int) -> Optional[int]:
    """Linux ``renameat2(a, b, flags)``: 0 on success, the errno on failure, None where the
    call does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    rc = fn(-100, os.fsencode(str(a)), -100, os.fsencode(str(b)), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def swap_in(new: Path, out: Path, expected: Optional[tuple[int, int]] = None,
             marker: str = REPORT_MARKER) -> None:
    """Replace ``out`` by the folder ``new``, atomically, if ``out`` is still what the run
    checked at its start: ``expected`` = its :func:`path_identity` then (None: absent), and
    still empty or an earlier output holding ``marker``. Anything else — a folder created
    there during the run, another run's output swapped in meanwhile, files added to an
    empty folder — is refused (:class:`UsageError`) and left alone. The check and the
    rename run under a lock on the parent folder, and the rename itself re-checks
    (``renameat2`` NOREPLACE / EXCHANGE), so no other process slips in between."""
    import errno

    changed = UsageError(
        f"--out {out} changed while this run was writing (another run or a user created or "
        "replaced it); nothing was replaced: run again, or choose another folder")
    with DirLock(out.parent):
        if path_identity(out) != expected:
            raise changed
        if expected is None:
            rc = renameat2(new, out, 1)  # RENAME_NOREPLACE
            if rc in (errno.EEXIST, errno.ENOTEMPTY):
                raise changed
            if rc is None or rc in (errno.EINVAL, errno.ENOSYS):  # no renameat2 here
                if out.exists() or out.is_symlink():
                    raise changed
                os.rename(new, out)
            elif rc:
                raise OSError(rc, os.strerror(rc), str(out))
            return
        rc = renameat2(new, out, 2)  # RENAME_EXCHANGE: ``new`` now holds the old folder
        if rc == 0:
            old_ok = path_identity(new) == expected and new.is_dir() and (
                (new / marker).is_file() or not any(new.iterdir()))
            if not old_ok:
                renameat2(new, out, 2)  # put it back
                raise changed
            shutil.rmtree(new, ignore_errors=True)
            return
        # pragma: no cover - no atomic exchange on this system: move aside, then in
        if out.is_symlink() or not ((out / marker).is_file() or not any(out.iterdir())):
            raise changed
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
