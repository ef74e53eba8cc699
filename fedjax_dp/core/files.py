"""Files are data, writes are atomic, a folder has one owner.

Three small parts every reader and writer of the library's files goes through:

* :func:`read_json` / :func:`read_bytes`: a file the library did not write in this process (a
  checkpoint's metadata, a run's ``config.json``, a converted population's description, a sweep's
  records) is read as *data*: a regular file (a symlink is refused unless it stays inside
  ``root``), at most ``max_bytes`` long, JSON nested at most ``max_depth`` deep. Nothing read is
  imported or called; callers map what they read onto types they name themselves. A file that
  breaks a rule raises :class:`UntrustedFileError` (a ``ValueError``: one line, exit status 2).
* :func:`write_bytes` / :func:`write_text` / :func:`write_json` / :func:`append_line`: a write a
  later step reads is atomic. The bytes go to a temporary file in the same folder, are flushed
  and (``durable=True``) fsynced, and the file is renamed over the target, then the folder is
  fsynced: a crash, a signal or a full disk leaves the previous file or the new one, never a part.
  An appended line is one ``write(2)`` of the whole line; a failed append is cut back to the
  file's previous length. A failure raises :class:`WriteError` (an ``OSError``) naming the file.
* :class:`FolderLock`: one process holds a folder (a run's, a sweep's). An OS file lock
  (``flock``) on ``<folder>/.lock``, held for the owner's life and released by the kernel when
  the process ends however it ends, so a killed run's folder is free again at once; a second
  process is refused with one line naming the holder's pid (:class:`FolderBusyError`).
"""
from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

#: a JSON file the library reads back is at most this long unless the caller says otherwise
MAX_JSON_BYTES = 256 * 2**20
#: and nested at most this deep (a checkpoint's tree structure is the deepest: a few dozen)
MAX_JSON_DEPTH = 100
LOCK_NAME = ".lock"


class UntrustedFileError(ValueError):
    """A file that is not what the library writes: refused before anything uses it."""


class WriteError(OSError):
    """A write that failed (a full disk, a read-only folder); the previous file is intact."""


class FolderBusyError(ValueError):
    """The folder is held by another live process."""


# ----------------------------------------------------------------------------- reading

def regular_file(path: str | Path, *, root: str | Path | None = None, what: str = "file") -> Path:
    """``path`` after checking it is a regular file; a symlink must resolve inside ``root``
    (when given; no symlink is accepted without a root)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except OSError as e:
        raise UntrustedFileError(f"{what} {str(path)!r} cannot be read "
                                 f"({e.strerror or e})") from None
    import stat as stat_lib
    if stat_lib.S_ISLNK(st.st_mode):
        target = path.resolve()
        inside = root is not None and target.is_relative_to(Path(root).resolve())
        if not inside:
            raise UntrustedFileError(f"{what} {str(path)!r} is a symlink to {str(target)!r}, "
                                     f"outside {str(root) if root is not None else 'its folder'}"
                                     f"; refusing to follow it")
        try:
            st = os.stat(target)
        except OSError as e:                  # a dangling symlink
            raise UntrustedFileError(f"{what} {str(path)!r} cannot be read "
                                     f"({e.strerror or e})") from None
    if not stat_lib.S_ISREG(st.st_mode):
        raise UntrustedFileError(f"{what} {str(path)!r} is not a regular file")
    return path


def read_bytes(path: str | Path, *, max_bytes: int, root: str | Path | None = None,
               what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (:func:`regular_file`)."""
    path = regular_file(path, root=root, what=what)
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UntrustedFileError(f"{what} {str(path)!r} is larger than {max_bytes:,} bytes; "
                                 f"refusing to read it")
    return data


def json_depth(value: Any) -> int:
    """The nesting depth of a parsed JSON value (a scalar is 0), without recursion (only
    containers are stacked: a results file's long metric lists are scanned, not pushed)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
        else:
            continue
        deepest = max(deepest, d + 1)
    return deepest


def parse_json(text: str | bytes, *, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``text`` parsed as JSON (``Infinity`` / ``NaN`` allowed, as the library writes them),
    nested at most ``max_depth`` deep; anything else raises :class:`UntrustedFileError`."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UntrustedFileError(f"{what} is not valid JSON ({e})") from None
    except RecursionError:
        raise UntrustedFileError(f"{what} is nested deeper than {max_depth} levels") from None
    if json_depth(value) > max_depth:
        raise UntrustedFileError(f"{what} is nested deeper than {max_depth} levels")
    return value


def read_json(path: str | Path, *, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, root: str | Path | None = None,
              what: str = "file", expect: type | None = None) -> Any:
    """A JSON file read as data: :func:`read_bytes`, then :func:`parse_json`; ``expect`` (e.g.
    ``dict``) is the type the top level must have."""
    data = read_bytes(path, max_bytes=max_bytes, root=root, what=what)
    value = parse_json(data, what=f"{what} {str(path)!r}", max_depth=max_depth)
    if expect is not None and not isinstance(value, expect):
        raise UntrustedFileError(f"{what} {str(path)!r} holds a JSON {type(value).__name__}, "
                                 f"expected a JSON {'object' if expect is dict else expect.__name__}")
    return value


# ----------------------------------------------------------------------------- writing

def fsync_folder(folder: Path) -> None:
    """fsync a folder (its entries, e.g. a rename into it, are then on disk)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                                  # some file systems cannot sync a folder
    finally:
        os.close(fd)


def _write_error(path: Path, e: OSError) -> WriteError:
    what = e.strerror or str(e)
    hint = "; free some space and resume" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    err = WriteError(e.errno or errno.EIO, f"cannot write {str(path)!r}: {what}{hint}")
    return err


def write_bytes(path: str | Path, data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (a temporary file in the same folder, renamed)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _write_error(path, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_folder(path.parent)
    return path


def write_text(path: str | Path, text: str, *, durable: bool = True) -> Path:
    return write_bytes(path, text.encode(), durable=durable)


def write_json(path: str | Path, value: Any, *, durable: bool = True, indent: int | None = 2,
               allow_nan: bool = True) -> Path:
    """``value`` as JSON, written atomically (:func:`write_bytes`)."""
    return write_text(path, json.dumps(value, indent=indent, allow_nan=allow_nan), durable=durable)


def append_line(path: str | Path, line: str, *, durable: bool = False) -> None:
    """Append one line (``line`` without its newline) in one ``write(2)``; a failed write is
    cut back to the file's previous length, so the file never ends in a part of a line."""
    path = Path(path)
    data = (line.rstrip("\n") + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise _write_error(path, e) from None
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if durable:
                os.fsync(fd)
        except OSError as e:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise _write_error(path, e) from None
    finally:
        os.close(fd)


def remove_temporaries(folder: str | Path) -> None:
    """Remove what an interrupted :func:`write_bytes` left in ``folder`` (``.NAME.*.tmp``)."""
    folder = Path(folder)
    if folder.is_dir():
        for p in folder.glob(".*.tmp"):
            if p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- one owner

class FolderLock:
    """An exclusive ``flock`` on ``<folder>/.lock`` for the holder's life (:meth:`release`, or
    the process's end). ``what`` names the folder in the refusal (``--out``, ``--resume``)."""

    def __init__(self, folder: str | Path, *, what: str = "folder"):
        import fcntl
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise UntrustedFileError(f"{what} {str(self.folder)!r}: cannot open its lock file "
                                     f"({e.strerror or e})") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            raise FolderBusyError(
                f"{what} {str(self.folder)!r} is in use by another process"
                f"{f' (pid {holder})' if holder else ''}; wait for it to end or stop it "
                f"(a killed process releases the folder)") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def _holder(self) -> str:
        try:
            text = os.pread(self._fd, 64, 0).decode(errors="replace").strip()
        except OSError:
            return ""
        return text if text.isdigit() else ""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, *, remove: bool = False) -> None:
        """Release the lock (``remove``: also delete the lock file, when the folder goes)."""
        if self._fd is None:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)                    # closing the descriptor releases the flock
        self._fd = None

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
