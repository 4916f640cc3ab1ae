"""Writing files so that a crash, a kill or a full disk never leaves a half-written one in place of the old one;
reading text files line by line.

Every file the project writes goes through `atomic_path` / `atomic_write`: the new content is written to a
temporary file in the same directory (a name that matches no pattern the project reads: `.NAME.tmp-…`), flushed
to disk (`fsync`), then renamed over the old file with `os.replace`, which POSIX makes atomic: a reader sees the
old file or the new one, never a mix. Directories are built under `NAME.partial` and swapped into place
(`atomic_directory`), or their files moved one by one into a directory that also holds other things
(`replace_files`, the final model beside the checkpoints); one writer at a time (`sole_writer`).

A write that fails because the disk is full raises `DiskFullError`, one line naming the path: errno ENOSPC or
EDQUOT (a user's quota, a cluster's scratch space), or any error (torch and safetensors report a full disk as a
bare "write failed") while the file system has almost no free space left. One that the file system refuses for
another reason (an NFS server's EIO, a file system remounted read-only) raises `UnwritableError`, one line naming
the path and the reason (`write_error`).

Every text file the project reads (corpora, sources to translate, references, hypotheses) goes through
`iter_lines`: UTF-8 only, one "\n" per line, gzip, xz and bzip2 decompressed (recognised by their bytes), each
refusal one line naming the file (and the line); `reads_once` says whether a path is a pipe that can be read only
once.
"""

from __future__ import annotations

import bz2
import errno
import fcntl
import gzip
import hashlib
import json
import logging
import lzma
import os
import re
import secrets
import shutil
import stat
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO, Any, BinaryIO

logger = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
# Below this much free space, a failed write is blamed on a full disk.
NEARLY_FULL_BYTES = 16 * 2**20


class UnwritableError(OSError):
    """A file that cannot be written where it was asked for; the message is one line naming it and why."""

    def __str__(self) -> str:
        return self.strerror


class DiskFullError(UnwritableError):
    """A write failed for lack of space (`code`: ENOSPC, or EDQUOT for a quota); the message is one line naming
    the path."""

    def __init__(self, path: str | os.PathLike, free: int | None = None, code: int = errno.ENOSPC):
        where = f" ({free / 2**20:.1f} MiB free)" if free is not None else ""
        super().__init__(code, f"{os.strerror(code)} while writing {os.fspath(path)}{where}")
        self.path = os.fspath(path)


def _free_bytes(path: str | os.PathLike) -> int | None:
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def disk_full_error(error: BaseException, path: str | os.PathLike) -> DiskFullError | None:
    """`DiskFullError` for `path` if `error` (or its cause) is a full disk or quota, else None.

    Call it before removing what the failed write left: that is what fills the disk."""
    if isinstance(error, DiskFullError):
        return error
    codes = [code for code, _ in _os_errors(error)]
    if errno.ENOSPC in codes:
        return DiskFullError(path, _free_bytes(path))
    if errno.EDQUOT in codes:  # the disk's free space says nothing of the user's quota
        return DiskFullError(path, code=errno.EDQUOT)
    free = _free_bytes(path)
    if free is not None and free < NEARLY_FULL_BYTES:
        return DiskFullError(path, free)
    return None


def write_error(error: BaseException, path: str | os.PathLike) -> UnwritableError | None:
    """One line naming `path` for a write that failed in the file system: `disk_full_error`'s, else an
    `UnwritableError` with the reason the file system gave (EIO from an NFS server, EROFS, ...), or, for torch's
    writer, which gives none, its own words. None for an error that names its file already (`open`'s, `rename`'s)
    and for one that is not the file system's (a bug's: its traceback says more), or already one line (a nested
    write's: raised again from itself, it lost its cause, the file system's own error). Call it before removing
    what the failed write left."""
    if isinstance(error, UnwritableError):
        return None
    full = disk_full_error(error, path)
    if full is not None:
        return full
    code, seen = next(_os_errors(error), (None, None))
    if code is not None:
        if getattr(seen, "filename", None) is not None:
            return None
        # "[Errno 5] Input/output error" alone: a write's or an fsync's, which name no file
        return UnwritableError(code, f"{os.strerror(code)} while writing {os.fspath(path)}")
    words = next((str(seen) for seen in exception_chain(error) if _TORCH_WRITER_FAILED.search(str(seen))), None)
    if words is not None:
        return UnwritableError(
            errno.EIO,
            f"Writing {os.fspath(path)} failed ({words.splitlines()[0]}), with free space on its disk: a quota "
            "that is full, or a file system error",
        )
    return None


# torch's file writer reports a failed write without errno: "[enforce fail at inline_container.cc:672] . unexpected
# pos 576 vs 534" (caused by "basic_ios::clear: iostream error"), or "PytorchStreamWriter failed writing file ...".
_TORCH_WRITER_FAILED = re.compile(r"inline_container\.cc|PytorchStreamWriter|iostream error")
# safetensors (Rust) reports one in words only: "Error while serializing: I/O error: Disk quota exceeded (os error
# 122)".
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then its cause (else the exception it was raised while handling), and so on, each once: a chain can
    loop (`raise err.__cause__` inside `except ... as err` makes the cause's context `err`)."""
    seen: BaseException | None = error
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        yield seen
        seen = seen.__cause__ or seen.__context__


def _os_errors(error: BaseException) -> Iterator[tuple[int, BaseException]]:
    """Each error in `error`'s chain that has an errno (an OSError, or a Rust library's error whose message ends in
    its number), with that errno."""
    for seen in exception_chain(error):
        if isinstance(seen, OSError) and seen.errno is not None:
            yield seen.errno, seen
        elif (match := _OS_ERROR_CODE.search(str(seen))) is not None:
            yield int(match[1]), seen


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file, or a directory's entries, to disk."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if Path(path).is_dir() and hasattr(os, "O_DIRECTORY") else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # file systems without fsync
            raise
    finally:
        os.close(fd)


def fsync_tree(directory: str | os.PathLike) -> None:
    """Flush every file below `directory`, then the directories themselves."""
    for root, _, files in os.walk(directory):
        for name in files:
            fsync_path(Path(root) / name)
        fsync_path(root)


def _umask_file_mode(directory: Path) -> int:
    """The permissions the umask gives a new file, read off one made in `directory` (the umask itself cannot be
    read without changing it, which is not thread-safe)."""
    probe = _temporary_name(directory / "permissions")
    try:
        return probe.stat().st_mode & 0o777
    finally:
        probe.unlink()


def _widen_to_umask(paths: Iterable[Path], mode: int) -> None:
    """Give `paths` at least the permissions `mode`: safetensors writes its files 0600 (through a private
    temporary file), which a serving account or a colleague on a shared file system could not read."""
    for path in paths:
        current = path.stat().st_mode & 0o777
        if current | mode != current:
            path.chmod(current | mode)


def publish_tree(directory: str | os.PathLike) -> None:
    """Make a finished directory ready to move into place: its files get the permissions the umask gives (as the
    files the project writes itself have), then everything below it is flushed to disk (`fsync_tree`)."""
    directory = Path(directory)
    _widen_to_umask((path for path in directory.rglob("*") if path.is_file()), _umask_file_mode(directory))
    fsync_tree(directory)


def _temporary_name(path: Path) -> Path:
    """A new empty file beside `path`, with the permissions the umask gives (mkstemp's would be 0600)."""
    while True:
        candidate = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return candidate


_TEMPORARY_NAME = re.compile(r"\.(?P<name>.+)\.tmp-\d+-[0-9a-f]{8}")


def _written_by_atomic_path(name: str) -> str | None:
    """The file whose temporary (`_temporary_name`) `name` is: left by a writer killed before renaming it into
    place, it is part of that file, and goes where the file goes. None for any other name."""
    match = _TEMPORARY_NAME.fullmatch(name)
    return match["name"] if match else None


def written_path(path: str | os.PathLike) -> Path:
    """Where `path` is written: itself, or where the links on the way to it lead (the writers here follow them, so
    that a link stays a link and the file it leads to, which others read, is the one replaced)."""
    path = Path(path)
    resolved = Path(os.path.realpath(path))
    return path if resolved == Path(os.path.abspath(path)) else resolved


def _named(given: Path, written: Path) -> str:
    """`given` for messages, with where links lead it."""
    return str(given) if written == given else f"{given} (which leads to {written})"


_SPECIAL_FILES = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def _special_file_error(path: Path, named: str) -> UnwritableError | None:
    """The refusal of `path` if it is neither a file nor a directory (`/dev/null`, a FIFO): the file written would
    be renamed over it, and a root user's (a container's) `--output-file /dev/null` made /dev/null a file of
    translations; another user's was `Permission denied`, which /dev/null is not."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kind = next((kind for is_kind, kind in _SPECIAL_FILES if is_kind(mode)), None)
    if kind is None:
        return None
    return UnwritableError(
        errno.EINVAL,
        f"cannot write {named}: it is {kind}, not a file, which the output would replace; give a file name",
    )


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; on success it replaces `path` atomically.

    For writers that take a file name (`safetensors.torch.save_file`, `torch.save`, `Figure.savefig` with an
    explicit `format`). On failure the temporary file is removed and `path` is left as it was; a full disk
    raises `DiskFullError`, another refusal of the file system `UnwritableError` (`write_error`). A link at
    `path` stays, and the file it points to is replaced.
    """
    given = Path(path)
    path = written_path(given)
    if path.is_dir():  # else the work was done, then refused naming the temporary file ("Is a directory: .x.tmp-…")
        raise UnwritableError(errno.EISDIR, f"cannot write {_named(given, path)}: it is a directory; give a file name")
    if (special := _special_file_error(path, _named(given, path))) is not None:
        raise special
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary_name(path)
    umask_mode = temporary.stat().st_mode & 0o777  # made with the umask's permissions, which the result keeps
    try:
        yield temporary
        _widen_to_umask([temporary], umask_mode)  # a writer may have replaced it with a 0600 file
        fsync_path(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        refused = write_error(error, path) if isinstance(error, Exception) else None
        temporary.unlink(missing_ok=True)
        if refused is not None:
            raise refused from error
        raise
    fsync_path(path.parent)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """`open(path, mode)` whose content replaces `path` only once it is completely written (see `atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', not {mode!r}.")
    with atomic_path(path) as temporary:
        with open(temporary, mode, encoding=None if "b" in mode else encoding) as handle:
            yield handle
            handle.flush()


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` as UTF-8, atomically."""
    with atomic_write(path) as handle:
        handle.write(text)
    return Path(path)


def write_json(path: str | Path, data: dict[str, Any], **dumps: Any) -> Path:
    """Write `data` as indented UTF-8 JSON, atomically, creating parent directories."""
    settings = {"indent": 2, "ensure_ascii": False, **dumps}
    return write_text(path, json.dumps(data, **settings) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON `path` holds; one that does not parse (cut short, not UTF-8) as a ValueError naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError or UnicodeDecodeError
        raise ValueError(f"{path} does not parse ({error})") from error


def require_directory(path: str | os.PathLike, role: str) -> Path:
    """`path`, a directory, as a Path; else one line naming it by its `role` ("Checkpoint directory") and what is
    there instead: a file (a weight or corpus file given for the directory that holds it), or nothing."""
    path = Path(path)
    if path.is_file():
        raise NotADirectoryError(f"{role} {path} is a file: give the directory that holds it.")
    if not path.is_dir():
        raise FileNotFoundError(f"{role} {path} does not exist.")
    return path


def check_writable(path: str | os.PathLike) -> None:
    """Raise `UnwritableError` now if `atomic_path` could not write `path` later: a directory there, a file where a
    directory should be, no permission, a read-only file system. For commands whose long work ends in writing a
    file (translating or scoring a test set), so that a mistyped or unwritable destination costs no work. Creates
    the missing parent directories, as the write would; a path through links is checked where they lead. Also
    refused: `-`, which would make a file of that name rather than mean standard output, and a `.gz` name: the
    project writes text uncompressed, which neither `zcat` nor `iter_lines` would read back under that name."""
    if os.fspath(path) == "-":
        raise UnwritableError(errno.EINVAL, "cannot write -: it would be a file named '-', not standard output")
    if os.fspath(path).lower().endswith(".gz"):
        raise UnwritableError(
            errno.EINVAL,
            f"cannot write {os.fspath(path)}: the output is plain text, which a .gz name would misdescribe; drop "
            "the .gz (and gzip the file afterwards)",
        )
    given = Path(path)
    path = written_path(given)
    named = _named(given, path)
    if path.is_dir():
        raise UnwritableError(errno.EISDIR, f"cannot write {named}: it is a directory; give a file name")
    if (special := _special_file_error(path, named)) is not None:
        raise special
    existing = next(parent for parent in (*path.parents, Path(".")) if parent.exists())
    if not existing.is_dir():
        raise UnwritableError(errno.ENOTDIR, f"cannot write {named}: {existing} is a file, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _temporary_name(path).unlink()
    except OSError as error:
        raise UnwritableError(error.errno, f"cannot write {named}: {error.strerror or error}") from error


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether `a` and `b` name one file: the same inode where both exist (links too), else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_distinct_outputs(
    outputs: Mapping[str, str | os.PathLike | None], inputs: Mapping[str, str | os.PathLike]
) -> None:
    """Raise `UnwritableError` now if an output (by its flag or role: `{"--output-file": path}`) is one of the
    `inputs` (`{"--input-file": path}`; writing it would destroy what is read) or another output's file (one
    would overwrite the other). None outputs are not written and not compared; `-` (stdin) is no file."""
    named = [(name, path) for name, path in outputs.items() if path is not None]
    for index, (name, path) in enumerate(named):
        for role, source in inputs.items():
            if os.fspath(source) != "-" and _same_file(path, source):
                raise UnwritableError(
                    errno.EEXIST, f"{name} {path} is {role} {source}: writing it would destroy it; choose another path"
                )
        for other, other_path in named[index + 1 :]:
            if _same_file(path, other_path):
                raise UnwritableError(errno.EEXIST, f"{name} and {other} are one file, {path}: give each its own")


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a directory and everything below it (nothing if it does not exist)."""
    if os.path.lexists(path):
        shutil.rmtree(path)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh `PATH.partial` directory to fill; on success it takes `path`'s place.

    A leftover `PATH.partial` of a killed attempt is removed first. The swap renames the old directory aside
    (`.PATH.old`), the new one into place, then removes the old one: a crash in between leaves the complete old
    or new directory under one of those names, never a mix. On failure the partial directory is removed. A second
    writer of `path` meanwhile is refused (`sole_writer`).
    """
    # "." and "out/.." have no name to put the partial directory beside; a link (`out -> /scratch/out`) stays a
    # link, and the directory it points to is what gets replaced, from beside it, on its own file system.
    path = Path(os.path.realpath(path))
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    with sole_writer(path):
        check_deletable(path)
        remove_tree(partial)
        partial.mkdir(parents=True)
        with _removed_on_failure(partial, path):
            yield partial
            publish_tree(partial)
            swap_directory(partial, path)


def check_deletable(path: str | os.PathLike) -> None:
    """Refuse, in one line naming it, to replace the directory `path` when this user could not delete what it (or
    a leftover `.partial` / `.old` of an earlier attempt) holds: another user's directory, written under a umask of
    022 into one a group shares. The swap put the new directory in place, then failed to delete the old one
    ("Permission denied: 'tokenizer.json'", exit 1), and every later replacement failed on the `.old` directory it
    left."""
    path = Path(os.path.realpath(path))  # a link is left in place; what it points to is replaced
    for directory in (path, path.with_name(path.name + PARTIAL_SUFFIX), path.with_name(f".{path.name}.old")):
        blocked = undeletable(directory)
        if blocked is not None:
            raise UnwritableError(
                errno.EACCES,
                f"cannot replace {path}: this user may not delete what {blocked} holds (another user's files); have "
                "its owner remove it, or write into another directory (nothing was written)",
            )


def undeletable(path: Path) -> Path | None:
    """The first directory in the tree `path` whose entries this user may not delete (what `shutil.rmtree` would
    fail on: no write, search or read permission, or a sticky directory holding another user's entries), or
    `path`'s parent where it is a sticky directory and `path` another user's (renaming `path` aside fails); None
    when there is none, or no directory at `path`."""
    if path.is_symlink() or not path.is_dir():
        return None
    user, unreadable = os.geteuid(), []

    def guarded(directory: str | os.PathLike, owners: Iterable[int]) -> bool:  # sticky: owners delete their own
        status = os.stat(directory)
        sticky = status.st_mode & stat.S_ISVTX and user not in (0, status.st_uid)
        return bool(sticky) and any(uid != user for uid in owners)

    if guarded(path.parent, [os.lstat(path).st_uid]):
        return path.parent
    for root, directories, names in os.walk(path, onerror=lambda error: unreadable.append(Path(error.filename))):
        if not os.access(root, os.R_OK | os.W_OK | os.X_OK):
            return Path(root)
        if guarded(root, (os.lstat(os.path.join(root, name)).st_uid for name in (*directories, *names))):
            return Path(root)
    return unreadable[0] if unreadable else None


@contextmanager
def _removed_on_failure(staging: Path, target: Path) -> Iterator[None]:
    """`staging` removed on any failure inside the block; one of the file system (a full disk, an I/O error) raised
    as `write_error`'s, naming `target`."""
    try:
        yield
    except BaseException as error:
        refused = write_error(error, target) if isinstance(error, Exception) else None
        remove_tree(staging)
        if refused is not None:
            raise refused from error
        raise


@contextmanager
def sole_writer(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on `.NAME.lock` beside the directory `path` while it is built and swapped
    (`atomic_directory`) or pushed with its card, or refuse at once: two writers of one directory (two exports, a
    user's average and the one a run makes at its end) deleted each other's partial directory and swapped in a mix
    of both, and a push uploaded what replaced the directory it had checked. The lock file is removed while still
    held; a writer that locked it after that (it had opened it before) opens the new one instead."""
    path = Path(os.path.realpath(path))
    lock = path.with_name(f".{path.name}.lock")
    with ExitStack() as stack:
        while path.parent.is_dir():  # else nothing to guard (a push of a path that does not exist fails next)
            try:
                handle = stack.enter_context(open_lock_file(lock))
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UnwritableError(
                    errno.EBUSY,
                    f"another process is writing {path} (it holds {lock}): wait for it to end, then run this again",
                ) from None
            except OSError as error:  # a file system without locks (some NFS mounts), a read-only parent: unguarded
                logger.warning("Cannot lock %s (%s): a second writer of %s is not refused", lock, error, path)
                break
            if is_open_as(handle, lock):
                stack.callback(_remove_lock_file, lock)  # runs before the handle closes
                break
            handle.close()  # the lock file of a writer that has finished since this one opened it
        yield


def open_lock_file(lock: Path, mode: str = "a") -> IO[str]:
    """`lock` opened to be locked (`mode`: "a", or "a+" to read its holder too), created if absent. Another user's
    lock file (0644 under a umask of 022, in a directory a group shares) cannot be opened for writing; `flock` takes
    a lock through a read-only handle too, so it is opened for reading: the second writer is refused as with one's
    own, not let through with a warning. Absent then (an unwritable directory, or removed meanwhile): the
    FileNotFoundError is the caller's."""
    try:
        return open(lock, mode, encoding="utf-8")
    except PermissionError:
        return open(lock, encoding="utf-8")


def _remove_lock_file(lock: Path) -> None:
    """Remove the lock file of a writer that has finished; one that cannot be removed (another user's, in a
    directory with the sticky bit) stays, empty, for the next writer to lock."""
    with suppress(PermissionError):
        lock.unlink(missing_ok=True)


def is_open_as(handle: IO, path: Path) -> bool:
    """Whether the open file `handle` is still the file at `path` (not one removed or renamed since)."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def check_replaceable(path: str | os.PathLike, marker: str, what: str) -> None:
    """Refuse, in one line, to replace `path` unless it is absent, an empty directory, or holds `marker`: the record
    that what replaces it (`what`: "an export", ...) writes, so that a user's other files are never replaced."""
    path = Path(path)
    if Path(os.path.realpath(path)) in (Path.cwd(), *Path.cwd().parents):
        raise UnwritableError(
            errno.EBUSY,
            f"cannot replace {path}: it holds the current directory, which would be deleted under you; give a "
            "directory below it (e.g. ./out)",
        )
    if not path.exists():
        written = written_path(path)
        existing = next(parent for parent in (*written.parents, Path(".")) if parent.exists())
        if not existing.is_dir():
            raise UnwritableError(
                errno.ENOTDIR, f"cannot write {_named(path, written)}: {existing} is a file, not a directory"
            )
        check_deletable(path)  # another user's `.partial` / `.old` left beside it
        return
    if not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a directory.")
    if any(path.iterdir()) and not (path / marker).is_file():
        raise FileExistsError(f"{path} exists and is not {what} (no {marker}): remove it or choose another directory.")
    check_deletable(path)


@contextmanager
def replacing_directory(
    path: str | os.PathLike, marker: str, what: str, *, regenerated: Iterable[str] = ()
) -> Iterator[Path]:
    """`atomic_directory`, replacing only what `check_replaceable` allows: checked before the directory is built
    and again before it takes `path`'s place (something may have appeared there meanwhile). A previous one that
    holds anything under a name the new one does not (an evaluation a user put there, another format's files) is
    refused then, in one line naming those entries, and stays as it was: replacing it would delete them, keeping
    them would leave them beside weights they do not describe. The names in `regenerated` (a model card, which the
    next push renders again) are replaced all the same."""
    check_replaceable(path, marker, what)
    with atomic_directory(path) as partial:
        yield partial
        check_replaceable(path, marker, what)
        path = Path(path)
        replaced = set(regenerated) | {entry.name for entry in partial.iterdir()}
        others = sorted(
            entry.name
            for entry in (path.iterdir() if path.is_dir() else ())
            if entry.name not in replaced and _written_by_atomic_path(entry.name) not in replaced
        )
        if others:
            raise FileExistsError(
                f"{path} holds {others} besides {what}, which replacing it would delete: move them out of it, or "
                "write into another directory (nothing was replaced)."
            )


def swap_directory(new: str | os.PathLike, path: str | os.PathLike) -> None:
    """Put the complete directory `new` at `path`, replacing (then deleting) what was there; if `new` cannot be
    renamed into place, what was there comes back."""
    new, path = Path(new), Path(path)
    old = path.with_name(f".{path.name}.old")  # hidden: matches no pattern the project lists
    remove_tree(old)
    if path.exists():
        os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        if old.exists() and not path.exists():
            os.replace(old, path)
        raise
    fsync_path(path.parent)
    remove_tree(old)


def replace_files(
    staging: str | os.PathLike, target: str | os.PathLike, *, last: Iterable[str] = ("config.json",)
) -> list[Path]:
    """Move every file of the (flat) directory `staging` into `target`, each with an atomic `os.replace`, the
    names in `last` at the end; then remove `staging`. For a directory that holds other things too (OUT holds
    the final model beside checkpoints and records). Returns the moved paths."""
    staging, target = Path(staging), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    names = sorted(path.name for path in staging.iterdir() if path.is_file())
    ordered = [name for name in names if name not in last] + [name for name in last if name in names]
    moved = []
    for name in ordered:
        fsync_path(staging / name)
        os.replace(staging / name, target / name)
        moved.append(target / name)
    fsync_path(target)
    remove_tree(staging)
    return moved


def write_files_into(
    directory: str | os.PathLike,
    write: Callable[[Path], Any],
    *,
    last: Iterable[str] = ("config.json",),
    name: str = "files",
) -> list[Path]:
    """`write(staging)` fills a hidden staging directory inside `directory` (`save_pretrained`, say); its files
    are then moved into `directory` one atomic rename each (`replace_files`, the names in `last` at the end).
    A failure, a full disk included, leaves `directory` as it was."""
    directory = Path(directory)
    staging = directory / f".{name}.partial"
    directory.mkdir(parents=True, exist_ok=True)
    with sole_writer(directory / name):  # a second writer of these files would remove this one's staging
        remove_tree(staging)
        staging.mkdir()
        with _removed_on_failure(staging, directory):
            write(staging)
            publish_tree(staging)
            return replace_files(staging, directory, last=last)


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or compressed; `-`: standard input) without line terminators.

    Only "\\n" ends a line (a stray "\\r" or U+2028 inside a sentence must not break line alignment of
    parallel files); a file whose lines end in "\\r" alone (classic Mac OS) is refused, as it would read as one
    line. Lines are read as bytes and decoded one at a time, so that an invalid UTF-8 sequence raises a ValueError
    naming the file and its exact line (`file:line`); a truncated or corrupt compressed file raises one naming the
    file and the number of lines read. Compression is recognised by the first bytes whatever the file's name: gzip
    and xz / bzip2 (the standard library reads them) are decompressed, zstd is refused by name; a `.gz` file must
    hold gzip data. A byte order mark at the very start of the text is dropped; a U+FEFF anywhere else is text.
    """
    path = os.fspath(path)
    name = "<stdin>" if path == "-" else path
    line_number = 0
    try:
        with ExitStack() as stack:
            for raw in _refusing_carriage_return_lines(_open_binary(path, stack), path):
                line_number += 1
                if b"\0" in raw:  # valid UTF-8, but no text's: UTF-16 read so gave sentences of every other letter
                    raise ValueError(
                        f"{name}:{line_number}: holds a NUL byte, which no text does{_nul_cause(raw, line_number)}"
                    )
                line = raw.decode("utf-8").rstrip("\r\n")
                # Windows editors start UTF-8 files with one: kept, it would open the first sentence (a reference
                # that no hypothesis matches, a vocabulary entry).
                yield line[1:] if line_number == 1 and line.startswith(_BYTE_ORDER_MARK) else line
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{name}:{line_number}: not valid UTF-8 ({err.reason} at byte {err.start} of the line); "
            "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from err
    except (EOFError, OSError, zlib.error, lzma.LZMAError) as err:
        if isinstance(err, OSError) and err.errno is not None:  # the file system's (not found, ...), not the data's
            if err.filename is None:  # a read's, hours in (an NFS server's EIO, a stale handle): named by itself only
                raise OSError(err.errno, f"{err.strerror} after {line_number} lines", name) from err
            raise
        raise ValueError(f"cannot read {name} after {line_number} lines: {err}") from err


def _nul_cause(line: bytes, line_number: int) -> str:
    """Why a line holds a NUL byte, and the way out: UTF-16 text without a byte order mark holds one in its first
    line (before every letter of big-endian, after every one of little-endian); one further on is damage."""
    if line_number > 1:
        return " (a damaged file, or not text?)"
    encoding = "utf-16be" if line.startswith(b"\0") else "utf-16le"
    return f" (UTF-16 without a byte order mark?): convert the file to UTF-8 (e.g. iconv -f {encoding} -t utf-8)"


def _refusing_carriage_return_lines(lines: Iterable[bytes], path: str) -> Iterator[bytes]:
    """`lines`, unless they are one line that holds lines ended by "\\r" alone (classic Mac OS): with or without a
    last "\\n" (which a tool appending to the file adds), it would read as a single sentence."""
    lines = iter(lines)
    first = next(lines, None)
    if first is None:
        return
    # "\r\n" ends the line of a Windows file, whose one stray "\r" inside stays text.
    if _ends_lines_in_carriage_returns(
        first.removesuffix(b"\r\n") if first.endswith(b"\r\n") else first.removesuffix(b"\n")
    ):
        second = next(lines, None)
        if second is None:
            name = "<stdin>" if path == "-" else path
            convert = "tr '\\r' '\\n'" + ("" if path == "-" else f" < {name}")
            raise ValueError(
                f"{name}: its lines end in \\r alone (classic Mac OS), so it would read as one line; "
                f"convert them (e.g. {convert})"
            )
        yield first
        first = second
    yield first
    yield from lines


def _ends_lines_in_carriage_returns(text: bytes) -> bool:
    """Whether a file's only line (its last "\\n" removed) looks like lines ended by "\\r": two of them, or one ending
    it and another before. A single "\\r" inside one sentence is a stray character, kept."""
    inner = text.rstrip(b"\r")
    return inner.count(b"\r") >= 2 or (b"\r" in inner and text.endswith(b"\r"))


_BYTE_ORDER_MARK = "\ufeff"
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# "BZh", the block size, then a block's start or (an empty stream) the end-of-stream marker: no sentence begins so
_BZIP2_MAGIC = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")
_UTF16_BYTE_ORDER_MARKS = (b"\xff\xfe", b"\xfe\xff")  # little-, big-endian: what Windows' "Unicode" saves


def _open_binary(path: str, stack: ExitStack) -> BinaryIO:
    """`path` (`-`: standard input, left open) opened for reading bytes, decompressed if it holds gzip, xz or bzip2
    data, whatever its name; a `.gz` name must hold gzip data (what else does is more often an error page
    downloaded under that name than text)."""
    handle = sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
    # Compressed data named like text (`train.de`, `zcat` forgotten) is read decompressed rather than refused: no
    # UTF-8 text starts with the gzip, xz or zstd bytes (0xfd is never UTF-8; 0x8b and 0xb5 cannot follow there), so
    # no text file is ever misread this way. The wrappers close not `handle`; the stack does.
    head = _peek(handle, 10)
    if path.lower().endswith(".gz") and head and not head.startswith(_GZIP_MAGIC):  # `.GZ` too
        raise ValueError(
            f"{path} is named .gz but holds no gzip data (it starts with {head[:8]!r}): a file decompressed but not "
            "renamed (rename it), or an error page downloaded under that name (download it again)"
        )
    if head.startswith(_GZIP_MAGIC):
        return stack.enter_context(gzip.GzipFile(fileobj=handle, mode="rb"))
    if head.startswith(_XZ_MAGIC):
        return stack.enter_context(lzma.LZMAFile(handle, "rb"))
    if _BZIP2_MAGIC.match(head):
        return stack.enter_context(bz2.BZ2File(handle, "rb"))
    name = "<stdin>" if path == "-" else path
    if head.startswith(_ZSTD_MAGIC):  # else "not valid UTF-8 ... iconv -f latin1", which would garble it
        raise ValueError(f"{name} is zstd-compressed: decompress it first (e.g. zstd -d {name})")
    if head[:2] in _UTF16_BYTE_ORDER_MARKS:
        raise ValueError(f"{name} is UTF-16 text: convert it to UTF-8 (e.g. iconv -f utf-16 -t utf-8)")
    return handle


def _peek(handle: BinaryIO, size: int) -> bytes:
    """The next `size` bytes of `handle`, left unread (fewer from a pipe that has not delivered them yet)."""
    if hasattr(handle, "peek"):  # open(..., "rb") and a real standard input: works on pipes too
        return handle.peek(size)[:size]
    if handle.seekable():  # io.BytesIO standing in for standard input
        start = handle.tell()
        head = handle.read(size)
        handle.seek(start)
        return head
    return b""


def reads_once(path: str | os.PathLike) -> bool:
    """Whether `path` can be read only once: `-` (standard input), a pipe (`<(command)`, `/dev/stdin` fed by one),
    a FIFO or a terminal. A second `open` of it does not start again from its first line, so whoever reads it must
    read it once, from the start to the end. False for a path that does not exist (`iter_lines` names it)."""
    path = os.fspath(path)
    if path == "-":
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def file_states(paths: Iterable[str | os.PathLike]) -> tuple[tuple[int, int, int], ...]:
    """What rewriting or replacing files changes: each one's inode, size and modification time. Compared before and
    after a long read, it tells whether what was read is what was hashed, without reading it again."""
    return tuple((status.st_ino, status.st_size, status.st_mtime_ns) for status in map(os.stat, paths))


def file_sha256(path: str | os.PathLike, chunk_size: int = 2**22) -> str:
    """The sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
