"""Tests of modeling/files.py: atomic writes leave the old file intact on any failure, a full disk is one line,
an unwritable destination is named before the work; text files are read line by line, gzip or not, each refusal
naming the file and the line."""

import bz2
import errno
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import signal
import socket
import stat
import sys
import types
from pathlib import Path

import pytest
import torch

import modeling.files as files_module
from modeling.files import (
    DiskFullError,
    UnwritableError,
    atomic_directory,
    atomic_path,
    atomic_write,
    check_distinct_outputs,
    check_replaceable,
    check_writable,
    disk_full_error,
    file_sha256,
    file_states,
    iter_lines,
    read_json,
    reads_once,
    replace_files,
    replacing_directory,
    require_directory,
    sole_writer,
    swap_directory,
    undeletable,
    write_files_into,
    write_json,
    write_text,
)


def leftovers(directory) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith("."))


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b'{"bleu": 27.', "Expecting"), (b'{"bleu": "\xff"}', "'utf-8' codec can't decode byte 0xff")],
    ids=["cut short", "not UTF-8"],
)
def test_json_that_does_not_parse_is_one_line_naming_the_file(tmp_path, content, reason):
    path = tmp_path / "record.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as caught:
        read_json(path)
    assert str(caught.value).startswith(f"{path} does not parse ({reason}")
    assert "\n" not in str(caught.value)
    assert read_json(write_json(path, {"bleu": 27.3})) == {"bleu": 27.3}


def test_write_replaces_whole_files_with_the_umasks_permissions(tmp_path):
    path = write_json(tmp_path / "sub" / "record.json", {"a": 1})
    assert path.read_text() == '{\n  "a": 1\n}\n'
    write_text(path, "new\n")
    assert path.read_text() == "new\n"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask, "not mkstemp's 0600"
    assert leftovers(path.parent) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = write_text(tmp_path / "hypotheses.de", "old\n")
    with pytest.raises(RuntimeError, match="writer crashed"):
        with atomic_path(path) as temporary:
            temporary.write_text("half of the new")
            raise RuntimeError("writer crashed")
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_a_directory_where_a_file_is_written_is_refused_before_the_writer_runs(tmp_path):
    """A figure, a safetensors file or a JSON record written where a directory is: the writer ran (a plot drawn, a
    model serialised), then the rename was refused naming the temporary file, `[Errno 21] Is a directory:
    '.x.tmp-2708-bc3a828e' -> 'x'`."""
    (tmp_path / "x").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "x")
    writers = []
    for given in ("x", "link"):
        with pytest.raises(UnwritableError) as refusal:
            with atomic_path(tmp_path / given):
                writers.append(given)
        named = str(tmp_path / "x") if given == "x" else f"{tmp_path / 'link'} (which leads to {tmp_path / 'x'})"
        assert str(refusal.value) == f"cannot write {named}: it is a directory; give a file name"
        assert refusal.value.errno == errno.EISDIR
    assert writers == [] and leftovers(tmp_path) == []


def test_a_device_or_a_pipe_where_a_file_is_written_is_refused_and_stays(tmp_path):
    """`--output-file /dev/null` run as root (a container's user): the translations were renamed over /dev/null,
    which became a file of them for every later process; run as another user, it was `Permission denied`. A FIFO
    stands in for the device here (making one needs no root)."""
    fifo = tmp_path / "null"
    os.mkfifo(fifo)
    message = f"cannot write {fifo}: it is a named pipe, not a file, which the output would replace; give a file name"
    with pytest.raises(UnwritableError, match=f"^{re.escape(message)}$"):
        check_writable(fifo)
    writers = []
    with pytest.raises(UnwritableError, match=f"^{re.escape(message)}$"):
        with atomic_path(fifo):
            writers.append("ran")
    assert writers == [] and stat.S_ISFIFO(fifo.stat().st_mode) and leftovers(tmp_path) == []


def test_a_directory_required_is_refused_naming_its_role_where_a_file_or_nothing_is(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert require_directory(str(tmp_path), "Model directory") == tmp_path
    with pytest.raises(NotADirectoryError) as refusal:
        require_directory(tmp_path / "model.safetensors", "Model directory")
    assert (
        str(refusal.value)
        == f"Model directory {tmp_path / 'model.safetensors'} is a file: give the directory that holds it."
    )
    with pytest.raises(FileNotFoundError) as refusal:
        require_directory(tmp_path / "nowhere", "Model directory")
    assert str(refusal.value) == f"Model directory {tmp_path / 'nowhere'} does not exist."


def test_a_full_disk_is_one_line_naming_the_file_and_the_old_content_stays(tmp_path, monkeypatch):
    path = write_text(tmp_path / "eval_results_test.json", "old\n")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(DiskFullError) as error:
        write_json(path, {"sacrebleu": 30.0})
    message = str(error.value)
    assert message.startswith(f"No space left on device while writing {path}") and "\n" not in message
    assert error.value.errno == errno.ENOSPC and isinstance(error.value, OSError)
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_an_error_without_errno_on_a_nearly_full_disk_is_a_full_disk(tmp_path, monkeypatch):
    """torch.save and safetensors report a full disk as a bare 'write failed': free space decides."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30, 3 * 2**19))
    full = r"No space left on device while writing .*optimizer\.pt \(1\.5 MiB free\)"
    with pytest.raises(DiskFullError, match=full):
        with atomic_path(tmp_path / "optimizer.pt"):
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    failed = r"Writing .*optimizer\.pt failed \(PytorchStreamWriter .*\), with free space on its disk: a quota that"
    with pytest.raises(UnwritableError, match=failed) as error:  # plenty of space: not blamed on the disk
        with atomic_path(tmp_path / "optimizer.pt"):  # its first line, not the C++ frames after it
            raise RuntimeError(
                "PytorchStreamWriter failed writing file data/0: file write failed\nframe #0: c10::Error"
            )
    assert not isinstance(error.value, DiskFullError)


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded while writing {path}"),
        (OSError(errno.EIO, "Input/output error"), "Input/output error while writing {path}"),
        # safetensors (Rust) gives its errno in words only
        (
            RuntimeError("Error while serializing: I/O error: Disk quota exceeded (os error 122)"),
            "Disk quota exceeded",
        ),
        # torch's writer gives none: quota or NFS, "unexpected pos" and a traceback were all a user saw
        (
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
            "Writing {path} failed",
        ),
    ],
)
def test_a_quota_or_an_io_error_is_one_line_naming_the_file_and_the_old_content_stays(
    tmp_path, monkeypatch, failure, message
):
    """A cluster's scratch quota (EDQUOT) and an NFS server's EIO, as Python, safetensors and torch report them: the
    bare "[Errno 122] Disk quota exceeded" named no file, the others ended in a traceback."""
    path = write_text(tmp_path / "trainer_state.json", "old\n")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    with pytest.raises(UnwritableError) as error:
        with atomic_path(path):
            raise failure
    assert str(error.value).startswith(message.format(path=path)) and "\n" not in str(error.value)
    assert isinstance(error.value, DiskFullError) == ("quota" in message)
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_an_error_that_names_its_file_or_is_no_file_systems_is_raised_as_it_is(tmp_path):
    for failure in (PermissionError(errno.EACCES, "Permission denied", "config.json"), KeyError("step")):
        with pytest.raises(type(failure)) as error:
            with atomic_path(tmp_path / "config.json"):
                raise failure
        assert error.value is failure


def unwrapped_error() -> None:
    """Raise the cause of a library's wrapper, as code that unwraps one does: the cause's context is the wrapper,
    whose cause it is, a loop."""
    try:
        try:
            raise ValueError("the real error")
        except ValueError as cause:
            raise RuntimeError("a wrapper") from cause
    except RuntimeError as wrapper:
        raise wrapper.__cause__ from None


def test_an_error_whose_chain_loops_is_raised_as_it_is(tmp_path):
    """Looking for a full disk along the error's causes and contexts went round that loop for ever."""
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("following the error's chain never ended"))
    signal.alarm(10)
    try:
        with pytest.raises(ValueError, match="the real error"):
            with atomic_path(tmp_path / "out.txt"):
                unwrapped_error()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert leftovers(tmp_path) == []


def test_a_nested_write_that_the_file_system_refused_keeps_its_cause(tmp_path, monkeypatch):
    """A file written atomically inside a directory built atomically (a checkpoint's state inside its staging
    directory): the outer block raised the inner one's error again from itself, and the file system's own error
    ("[Errno 5] Input/output error", where the write failed) was gone from the traceback."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    failure = OSError(errno.EIO, "Input/output error")
    with pytest.raises(UnwritableError) as error:
        with atomic_directory(tmp_path / "checkpoint-2") as staging:
            with atomic_path(staging / "trainer_state.json"):
                raise failure
    assert (
        str(error.value)
        == f"Input/output error while writing {tmp_path / 'checkpoint-2.partial' / 'trainer_state.json'}"
    )
    assert error.value.__cause__ is failure


def test_a_directory_is_swapped_whole_and_a_failed_build_leaves_the_old_one(tmp_path):
    target = tmp_path / "averaged"
    with atomic_directory(target) as staging:
        (staging / "model.safetensors").write_text("first")
    assert (target / "model.safetensors").read_text() == "first"
    with pytest.raises(OSError):
        with atomic_directory(target) as staging:
            (staging / "model.safetensors").write_text("half")
            raise OSError("killed")
    assert (target / "model.safetensors").read_text() == "first"
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("{}")
    assert sorted(path.name for path in target.iterdir()) == ["config.json"], "swapped whole"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged"], "no .partial or .old left"


def test_a_second_writer_of_a_directory_is_refused_while_the_first_builds_it(tmp_path):
    """Two writers (two exports, a user's average and a run's own) deleted each other's partial directory and
    swapped in a mix of both."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("first")
        with pytest.raises(UnwritableError) as refused:
            with atomic_directory(target):
                pass
        assert (staging / "model.bin").read_text() == "first", "the first writer's work untouched"
    assert str(refused.value) == (
        f"another process is writing {target} (it holds {tmp_path / '.export.lock'}): wait for it to end, then run "
        "this again"
    )
    assert (target / "model.bin").read_text() == "first"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"], "the lock file goes with its writer"
    with atomic_directory(target) as staging:  # free again
        (staging / "model.bin").write_text("second")
    assert (target / "model.bin").read_text() == "second"


def another_users_lock_files(monkeypatch, owner: str = "another user") -> None:
    """`open` in modeling.files as for a user who may not write lock files another has made (0644 under a umask
    of 022): tests run as root, whom no permission stops."""

    def opening(file, mode="r", *args, **kwargs):
        if os.path.basename(file).endswith(".lock") and os.path.exists(file) and mode != "r":
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(files_module, "open", opening, raising=False)


def test_a_second_writer_is_refused_when_the_first_ones_lock_file_is_another_users(tmp_path, monkeypatch):
    """A colleague's lock file, 0644 under a umask of 022 in a directory a group shares, could not be opened for
    writing: the second writer went on with a warning ("a second writer is not refused") beside the first."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("first")
        another_users_lock_files(monkeypatch)
        with pytest.raises(UnwritableError, match="^another process is writing "):
            with atomic_directory(target):
                pass
        monkeypatch.undo()
        assert (staging / "model.bin").read_text() == "first", "the first writer's work untouched"
    assert (target / "model.bin").read_text() == "first"


def test_another_users_lock_file_left_behind_is_locked_and_removed_or_kept(tmp_path, monkeypatch):
    """A lock file a killed writer of another user left: the next writer locks it through a read-only handle; one
    it may not remove (a directory with the sticky bit) stays, and the write succeeds."""
    target, lock = tmp_path / "export", tmp_path / ".export.lock"
    lock.touch()
    another_users_lock_files(monkeypatch)
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("second")
    assert (target / "model.bin").read_text() == "second"
    assert not lock.exists()
    lock.touch()
    unlink = files_module.Path.unlink

    def sticky(path, missing_ok=False):
        if path == lock:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(files_module.Path, "unlink", sticky)
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("third")
    assert (target / "model.bin").read_text() == "third"
    assert lock.exists()


def test_a_directory_whose_files_this_user_may_not_delete_is_not_replaced(tmp_path, monkeypatch):
    """A colleague's export, written under a umask of 022 into a directory a group shares: the swap put the new
    one in place, then failed to delete the old one ("Permission denied: 'tokenizer.json'", exit 1) and left
    `.export.old`, on which every later replacement failed the same way."""
    target, old = tmp_path / "export", tmp_path / ".export.old"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("theirs")
    theirs = {target}
    access = os.access

    def as_another_user(path, mode, **kwargs):  # tests run as root, whom no permission stops
        return Path(path) not in theirs and access(path, mode, **kwargs)

    monkeypatch.setattr(files_module.os, "access", as_another_user)

    def refused_naming(blocked) -> None:
        message = (
            f"cannot replace {target}: this user may not delete what {blocked} holds (another user's files); have "
            "its owner remove it, or write into another directory (nothing was written)"
        )
        with pytest.raises(UnwritableError, match=f"^{re.escape(message)}$"):  # the early check: before the work
            check_replaceable(target, "model.bin", "an export")  # (train.py: averaged/, before training)
        with pytest.raises(UnwritableError, match=f"^{re.escape(message)}$"):
            with atomic_directory(target) as staging:
                (staging / "model.bin").write_text("ours")
        assert (target / "model.bin").read_text() == "theirs"
        assert not (tmp_path / "export.partial").exists()

    refused_naming(target)
    link = tmp_path / "latest"  # a link to their export: what it points to is what would be replaced
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(UnwritableError, match=rf"^cannot replace {re.escape(str(target))}: this user may not delete"):
        check_replaceable(link, "model.bin", "an export")
    link.unlink()
    shutil.copytree(target, old)  # what the swap left before: their old export, beside ours in its place
    theirs = {old}
    refused_naming(old)
    shutil.rmtree(old)
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("ours")
    assert (target / "model.bin").read_text() == "ours"


def test_a_directory_another_user_may_only_read_and_enter_is_not_replaced(tmp_path, monkeypatch):
    """A colleague's export written under a umask of 022 (drwxr-xr-x): this user may list it and enter it, but
    not delete its files, so the swap would leave it behind as `.export.old`."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("theirs")
    access = os.access

    def as_another_user(path, mode, **kwargs):  # tests run as root: judged by the permissions of others
        if Path(path) == target:
            return mode & ~target.stat().st_mode & 0o7 == 0
        return access(path, mode, **kwargs)

    monkeypatch.setattr(files_module.os, "access", as_another_user)
    target.chmod(0o755)
    assert undeletable(target) == target
    target.chmod(0o753)
    assert undeletable(target) == target, "writable but not listable"
    target.chmod(0o757)
    assert undeletable(target) is None


def test_another_users_directory_in_a_sticky_directory_is_not_replaced_and_ones_own_is(tmp_path, monkeypatch):
    """A colleague's export in a directory a group shares with the sticky bit (mode 3775), written under a umask of
    002: its files were this user's to delete, but not the export itself, which only its owner may rename. The work
    was done, then the swap failed ("Operation not permitted: 'export' -> '.export.old'"); and rotation, renaming
    a colleague's checkpoint aside there, stopped the training."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("theirs")
    tmp_path.chmod(tmp_path.stat().st_mode | stat.S_ISVTX)
    monkeypatch.setattr(files_module.os, "geteuid", lambda: 4242)  # tests run as root, whom no permission stops
    assert undeletable(target) == tmp_path
    with pytest.raises(UnwritableError, match=rf"^cannot replace {re.escape(str(target))}: this user may not delete"):
        with atomic_directory(target) as staging:
            raise AssertionError("the work began")
    assert (target / "model.bin").read_text() == "theirs"
    os.chown(target, 4242, -1)  # this user's own
    assert undeletable(target) is None
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("ours")
    assert (target / "model.bin").read_text() == "ours"


def test_guarding_a_path_below_directories_that_do_not_exist_creates_none(tmp_path):
    """A push of a mistyped path left the directories leading to it behind."""
    with sole_writer(tmp_path / "typo" / "sub" / "model"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_locks_the_lock_file_of_a_writer_since_finished_takes_a_new_one(tmp_path, monkeypatch):
    target = tmp_path / "export"
    lock = files_module.fcntl.flock
    opened = []

    def the_first_writer_finishes_between_open_and_lock(fd, operation):
        if not opened:
            opened.append(fd)
            with atomic_directory(target) as staging:  # it opens the same lock file, locks it, removes it
                (staging / "model.bin").write_text("first")
        return lock(fd, operation)

    monkeypatch.setattr(files_module.fcntl, "flock", the_first_writer_finishes_between_open_and_lock)
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("second")
        assert (tmp_path / ".export.lock").is_file(), "a lock file of its own, which a third writer would find"
    assert (target / "model.bin").read_text() == "second"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"]


def test_a_swap_whose_last_rename_fails_puts_the_old_directory_back(tmp_path, monkeypatch):
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("first")
    replace = os.replace

    def refuse_the_new_one(source, destination):
        if str(source).endswith(".partial"):
            raise OSError(errno.EXDEV, "cannot rename", str(source), str(destination))  # as os.replace names them
        replace(source, destination)

    monkeypatch.setattr(files_module.os, "replace", refuse_the_new_one)
    with pytest.raises(OSError, match="cannot rename"):
        with atomic_directory(target) as staging:
            (staging / "model.bin").write_text("second")
    assert (target / "model.bin").read_text() == "first"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"], "no .partial or .old left"


def test_files_move_into_a_shared_directory_config_last(tmp_path, monkeypatch):
    staging, target = tmp_path / ".final-model.partial", tmp_path / "run"
    staging.mkdir()
    target.mkdir()
    (target / "checkpoint-5").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (staging / name).write_text(name)
    order = []
    replace = os.replace
    monkeypatch.setattr(files_module.os, "replace", lambda a, b: order.append(os.path.basename(b)) or replace(a, b))
    replace_files(staging, target)
    assert order[-1] == "config.json" and sorted(order) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (target / "checkpoint-5").is_dir() and not staging.exists()


def test_files_written_by_a_saver_replace_the_old_ones_only_when_all_are_written(tmp_path):
    (tmp_path / "tokenizer.json").write_text("old")

    def saver_killed_halfway(staging):
        (staging / "tokenizer_config.json").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match=f"while writing {tmp_path}"):
        write_files_into(tmp_path, saver_killed_halfway, last=("tokenizer.json",), name="tokenizer")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tokenizer.json"]
    assert (tmp_path / "tokenizer.json").read_text() == "old"

    def saver(staging):
        (staging / "tokenizer.json").write_text("new")
        (staging / "tokenizer_config.json").write_text("new")

    moved = write_files_into(tmp_path, saver, last=("tokenizer.json",), name="tokenizer")
    assert [path.name for path in moved] == ["tokenizer_config.json", "tokenizer.json"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]

    def another_writer_meanwhile(staging):  # two scripts/train_tokenizer.py into one directory
        (staging / "tokenizer.json").write_text("first")
        with pytest.raises(UnwritableError, match=rf"^another process is writing {tmp_path / 'tokenizer'} \(it holds"):
            write_files_into(tmp_path, saver, last=("tokenizer.json",), name="tokenizer")
        assert (staging / "tokenizer.json").read_text() == "first", "its staging untouched"

    write_files_into(tmp_path, another_writer_meanwhile, last=("tokenizer.json",), name="tokenizer")
    assert (tmp_path / "tokenizer.json").read_text() == "first"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def test_replacing_directory_replaces_only_what_holds_its_marker(tmp_path):
    out = tmp_path / "out"
    for _ in range(2):  # absent, then a previous one (it holds the marker): both replaced
        with replacing_directory(out, "record.json", "a thing") as partial:
            write_json(partial / "record.json", {})
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("keep me too")
    for path, message in ((tmp_path / "mine", "is not a thing"), (tmp_path / "file", "is not a directory")):
        with pytest.raises(FileExistsError, match=message):
            with replacing_directory(path, "record.json", "a thing"):
                raise AssertionError("not reached: refused before anything is built")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert (tmp_path / "file").read_text() == "keep me too"
    late = tmp_path / "late"
    with pytest.raises(FileExistsError, match="is not a thing"):
        with replacing_directory(late, "record.json", "a thing") as partial:
            write_json(partial / "record.json", {})
            late.mkdir()
            (late / "notes.txt").write_text("appeared meanwhile")
    assert sorted(path.name for path in late.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "late.partial").exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("-", r"^cannot write -: it would be a file named '-', not standard output$"),
        ("news.de.gz", r"drop the \.gz"),
        ("NEWS.DE.GZ", r"drop the \.gz"),
    ],
)
def test_check_writable_refuses_names_that_would_mislead(tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnwritableError, match=message):
        check_writable(name)
    assert not list(tmp_path.iterdir())


def test_check_writable_names_what_stands_in_the_way_and_leaves_nothing(tmp_path, monkeypatch):
    check_writable(tmp_path / "new" / "deeper" / "hypotheses.de")  # missing parents are made, as a write makes them
    assert (tmp_path / "new" / "deeper").is_dir() and list((tmp_path / "new" / "deeper").iterdir()) == []
    (tmp_path / "old.de").write_text("kept\n")
    check_writable(tmp_path / "old.de")  # an existing file is replaced later, not now
    assert (tmp_path / "old.de").read_text() == "kept\n"

    afile = tmp_path / "afile"
    afile.write_text("")
    cases = (
        (afile / "out.de", f"cannot write {afile / 'out.de'}: {afile} is a file"),
        (afile / "sub" / "out.de", f"{afile} is a file, not a directory"),
        (tmp_path / "new", f"cannot write {tmp_path / 'new'}: it is a directory"),
    )
    for path, message in cases:
        with pytest.raises(UnwritableError) as error:
            check_writable(path)
        assert message in str(error.value) and "\n" not in str(error.value) and "Errno" not in str(error.value)

    def refused(*args, **kwargs):  # what a read-only file system or a directory without write permission answers
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files_module.os, "open", refused)
    with pytest.raises(UnwritableError, match=r"^cannot write .*out\.de: Permission denied$"):
        check_writable(tmp_path / "out.de")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile", "new", "old.de"]


def test_an_output_that_is_an_input_or_another_output_is_refused_however_it_is_named(tmp_path, monkeypatch):
    source = tmp_path / "news.en"
    source.write_text("a line\n")
    (tmp_path / "link.en").symlink_to(source)
    os.link(source, tmp_path / "hard.en")
    monkeypatch.chdir(tmp_path)
    for same in (source, "news.en", "./sub/../news.en", tmp_path / "link.en", tmp_path / "hard.en"):
        with pytest.raises(UnwritableError, match=f"--output-file {same} is --input-file {source}: writing it would"):
            check_distinct_outputs({"--output-file": same}, {"--input-file": source})
    with pytest.raises(UnwritableError, match="the hypotheses file and the metrics file are one file, out/x"):
        check_distinct_outputs({"the hypotheses file": "out/x", "the metrics file": tmp_path / "out" / "x"}, {})
    check_distinct_outputs({"--output-file": "news.de", "unused": None}, {"--input-file": source, "stdin": "-"})
    check_distinct_outputs({"--output-file": "-"}, {"--input-file": "-"})  # standard streams are no files
    assert source.read_text() == "a line\n"


def test_a_previous_directory_holding_more_than_a_build_writes_is_refused_and_kept(tmp_path):
    out = tmp_path / "out"
    with replacing_directory(out, "record.json", "a thing") as partial:
        write_json(partial / "record.json", {"build": 1})
        (partial / "weights.bin").write_text("old weights")
    (out / "eval").mkdir()  # what README's commands may put there: evaluate.py --output-dir OUT/eval, a card
    (out / "eval" / "hypotheses_test.de").write_text("hours of translating")
    (out / "README.md").write_text("a card of the old weights")
    with pytest.raises(FileExistsError, match=r"out holds \['README.md', 'eval'\] besides a thing, which replacing"):
        with replacing_directory(out, "record.json", "a thing") as partial:
            write_json(partial / "record.json", {"build": 2})
            (partial / "weights.bin").write_text("new weights")
    assert sorted(path.name for path in out.iterdir()) == ["README.md", "eval", "record.json", "weights.bin"]
    assert (out / "weights.bin").read_text() == "old weights" and (out / "eval" / "hypotheses_test.de").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"], "nothing left aside"
    shutil.rmtree(out / "eval")
    (out / "README.md").unlink()
    with replacing_directory(out, "record.json", "a thing") as partial:  # what a build writes: replaced
        write_json(partial / "record.json", {"build": 2})
        (partial / "weights.bin").write_text("new weights")
    assert (out / "weights.bin").read_text() == "new weights"
    (out / "README.md").write_text("a card, which the next push renders again")
    (out / ".README.md.tmp-4242-0123abcd").write_text("a card whose writer was killed before renaming it")
    with replacing_directory(out, "record.json", "a thing", regenerated=["README.md"]) as partial:
        write_json(partial / "record.json", {"build": 3})
        (partial / "weights.bin").write_text("newer weights")
    assert sorted(path.name for path in out.iterdir()) == ["record.json", "weights.bin"]


def test_a_directory_to_replace_is_refused_where_replacing_it_cannot_work(tmp_path, monkeypatch):
    """The current directory (it would be deleted under the user), a path below a file: named before any work."""
    monkeypatch.chdir(tmp_path)
    for here in (".", "sub/..", tmp_path, tmp_path.parent):
        with pytest.raises(UnwritableError, match="it holds the current directory, which would be deleted"):
            check_replaceable(here, "export.json", "an export")
    (tmp_path / "afile").write_text("")
    with pytest.raises(UnwritableError, match="cannot write afile/sub: afile is a file, not a directory"):
        check_replaceable("afile/sub", "export.json", "an export")
    with replacing_directory("out/../built", "export.json", "an export") as partial:  # no name of its own: fine
        (partial / "export.json").write_text("{}")
    assert (tmp_path / "built" / "export.json").is_file() and not (tmp_path / "built.partial").exists()


def test_a_directory_or_file_reached_through_a_link_is_replaced_where_the_link_points(tmp_path):
    """`out -> /scratch/run/out`, as clusters link output onto scratch space: the link stays, the directory it
    points to is replaced (before, the link itself was renamed aside, a new directory took its place on the link's
    file system, and removing the renamed link failed)."""
    scratch = tmp_path / "scratch" / "export"
    scratch.mkdir(parents=True)
    (scratch / "export.json").write_text("old")
    link = tmp_path / "out"
    link.symlink_to(scratch, target_is_directory=True)
    with replacing_directory(link, "export.json", "an export") as partial:
        (partial / "export.json").write_text("new")
    assert link.is_symlink() and link.resolve() == scratch.resolve()
    assert (scratch / "export.json").read_text() == "new"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "scratch"]
    assert sorted(path.name for path in scratch.parent.iterdir()) == ["export"], "no .partial or .old left"
    (tmp_path / "scratch" / "news.de").write_text("old")
    (tmp_path / "news.de").symlink_to(tmp_path / "scratch" / "news.de")
    with atomic_write(tmp_path / "news.de") as handle:
        handle.write("new")
    assert (tmp_path / "news.de").is_symlink() and (tmp_path / "scratch" / "news.de").read_text() == "new"
    dangling = tmp_path / "later"  # a link to where the output is still to be made
    dangling.symlink_to(tmp_path / "scratch" / "later", target_is_directory=True)
    with atomic_directory(dangling) as partial:
        (partial / "model.bin").write_text("made")
    assert dangling.is_symlink() and (dangling / "model.bin").read_text() == "made"


def test_the_checks_before_the_work_look_where_a_link_points_as_the_writers_do(tmp_path):
    """The writers follow a link; checks that looked at the link passed a destination the write then failed on,
    after the translation or the conversion, naming a path the user never gave."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "news.de").symlink_to(tmp_path / "afile" / "news.de")
    with pytest.raises(
        UnwritableError, match=r"^cannot write .*news\.de \(which leads to .*afile/news\.de\): .*afile is a file"
    ):
        check_writable(tmp_path / "news.de")
    (tmp_path / "out").symlink_to(tmp_path / "afile" / "export", target_is_directory=True)
    with pytest.raises(
        UnwritableError, match=r"^cannot write .*out \(which leads to .*afile/export\): .*afile is a file"
    ):
        check_replaceable(tmp_path / "out", "export.json", "an export")
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-dir").symlink_to(tmp_path / "dir", target_is_directory=True)
    with pytest.raises(UnwritableError, match=r"^cannot write .*to-dir \(which leads to .*dir\): it is a directory"):
        check_writable(tmp_path / "to-dir")
    (tmp_path / "up").symlink_to(tmp_path / "afile" / "sub", target_is_directory=True)  # a link higher up
    with pytest.raises(
        UnwritableError, match=r"^cannot write .*up/out \(which leads to .*afile/sub/out\): .*afile is"
    ):
        check_replaceable(tmp_path / "up" / "out", "export.json", "an export")
    with pytest.raises(UnwritableError, match=r"^cannot write .*up/news\.de \(which leads to .*\): .*afile is a file"):
        check_writable(tmp_path / "up" / "news.de")
    (tmp_path / "later.de").symlink_to(tmp_path / "made" / "later.de")  # dangling, its folder still to be made
    check_writable(tmp_path / "later.de")
    assert (tmp_path / "made").is_dir() and (tmp_path / "later.de").is_symlink()


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_permissions_the_umask_gives(tmp_path, umask, expected):
    """safetensors writes its files 0600 (through a private temporary file): a serving account could not read
    the weights of an export, a checkpoint or an average."""
    from safetensors.torch import save_file

    tensors = {"weight": torch.zeros(2)}
    previous = os.umask(umask)
    try:
        with atomic_path(tmp_path / "single.safetensors") as temporary:
            save_file(tensors, temporary)
        with atomic_directory(tmp_path / "whole") as partial:
            save_file(tensors, partial / "model.safetensors")
            (partial / "script.sh").write_text("")
            (partial / "script.sh").chmod(0o755)  # wider than the umask's: left as it is
        write_files_into(tmp_path / "into", lambda staging: save_file(tensors, staging / "model.safetensors"))
    finally:
        os.umask(previous)
    for path in (
        tmp_path / "single.safetensors",
        tmp_path / "whole/model.safetensors",
        tmp_path / "into/model.safetensors",
    ):
        assert path.stat().st_mode & 0o777 == expected, path
    assert (tmp_path / "whole/script.sh").stat().st_mode & 0o777 == 0o755 | expected
    assert sorted(path.name for path in (tmp_path / "whole").iterdir()) == ["model.safetensors", "script.sh"]


# --- reading text files ---------------------------------------------------------------------------------------


def test_iter_lines_plain_and_gzip(tmp_path):
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_bytes(b"one\r\ntwo\rstill two\n\nfour")  # only \n ends a line
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("über\nfünf\n")
    assert list(iter_lines(plain)) == ["one", "two\rstill two", "", "four"]
    assert list(iter_lines(packed)) == ["über", "fünf"]
    plain.write_bytes(b"Malcolm X\r\nvitamin C  \n")  # only the terminator goes: a line's last letters or spaces stay
    assert list(iter_lines(plain)) == ["Malcolm X", "vitamin C  "]


def test_iter_lines_names_unreadable_file(tmp_path):
    broken = tmp_path / "broken.en.gz"
    broken.write_bytes(gzip.compress(b"fine\n" * 100)[:-20])
    with pytest.raises(ValueError, match="broken.en.gz"):
        list(iter_lines(broken))
    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("grün\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.de:1: not valid UTF-8"):
        list(iter_lines(latin1))


def test_a_read_failing_in_the_file_system_names_the_file_and_how_far_it_was_read(tmp_path, monkeypatch):
    """An NFS server's EIO or a stale handle, hours into a file: the error was "[Errno 116] Stale file handle", no
    file named."""
    source = tmp_path / "news.en"
    source.write_bytes(b"a line\n" * 10)

    class StaleAfterThreeLines(io.BufferedReader):
        read_lines = 0

        def __next__(self):
            self.read_lines += 1
            if self.read_lines > 3:
                raise OSError(errno.ESTALE, "Stale file handle")
            return super().__next__()

    monkeypatch.setattr(files_module, "open", lambda path, mode: StaleAfterThreeLines(io.FileIO(path)), raising=False)
    with pytest.raises(OSError) as error:
        list(iter_lines(source))
    assert error.value.errno == errno.ESTALE
    assert str(error.value) == f"[Errno {errno.ESTALE}] Stale file handle after 3 lines: '{source}'"


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_an_invalid_utf8_byte_is_located_on_its_exact_line(tmp_path, suffix):
    """Text-mode reading decodes ahead in blocks: line by line from bytes names the very line, gzip too."""
    lines = [f"line {i} ist grün".encode() for i in range(1, 5000)]
    lines[4321] = "line 4322 ist grün".encode("latin-1")
    path = tmp_path / f"train.de{suffix}"
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(ValueError, match=rf"train\.de{suffix}:4322: not valid UTF-8") as error:
        list(iter_lines(path))
    assert "iconv" in str(error.value)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_byte_order_mark_is_dropped_at_the_start_of_the_file_only(tmp_path, suffix):
    # Windows editors write one: kept, it would open the first reference (lower BLEU) or join the vocabulary.
    path = tmp_path / f"refs.de{suffix}"
    data = b"\xef\xbb\xbfeins\nzwei \xef\xbb\xbf drei\n\xef\xbb\xbfvier\n"
    path.write_bytes(gzip.compress(data) if suffix else data)
    assert list(iter_lines(path)) == ["eins", "zwei \ufeff drei", "\ufeffvier"]  # later ones are text


def test_a_byte_order_mark_is_dropped_from_standard_input(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfone\ntwo\n"), encoding="utf-8"))
    assert list(iter_lines("-")) == ["one", "two"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_named_as_such(tmp_path, encoding):
    path = tmp_path / "train.en"
    path.write_bytes(("\ufeff" if encoding.endswith("be") else "").encode(encoding) + "a cat\n".encode(encoding))
    with pytest.raises(ValueError, match=r"^.*train\.en is UTF-16 text: convert it to UTF-8 \(e\.g\. iconv -f utf-16"):
        list(iter_lines(path))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_text_without_a_byte_order_mark_is_refused_not_read_as_letters_and_nul_bytes(tmp_path, encoding):
    """Valid UTF-8 byte for byte: read as 't\\x00h\\x00e\\x00', the line breaks' NUL bytes opening the next lines
    (and a last line of a NUL alone), every sentence a row of NULs and letters."""
    path = tmp_path / "train.en.gz"
    path.write_bytes(gzip.compress("the cat\na dog\n".encode(encoding)))
    with pytest.raises(
        ValueError,
        match=rf"^.*train\.en\.gz:1: holds a NUL byte, which no text does \(UTF-16 without a byte order mark\?\): "
        rf"convert the file to UTF-8 \(e\.g\. iconv -f utf-16{encoding[-2:]} -t utf-8\)$",
    ):
        list(iter_lines(path))
    path.write_bytes(gzip.compress(b"a cat\na \x00dog\n"))
    with pytest.raises(ValueError, match=r"train\.en\.gz:2: holds a NUL byte, which no text does \(a damaged file"):
        list(iter_lines(path))


def test_gzip_data_without_the_gz_suffix_is_read_as_gzip(tmp_path, monkeypatch):
    # Its first bytes, 1f 8b, cannot start UTF-8 text, so reading it as gzip cannot misread a text file.
    path = tmp_path / "train.txt"
    path.write_bytes(gzip.compress("\ufeffüber\nfünf\n".encode()))
    assert list(iter_lines(path)) == ["über", "fünf"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(b"one\ntwo\n")), encoding="utf-8"))
    assert list(iter_lines("-")) == ["one", "two"]
    path.write_bytes(gzip.compress(b"fine\n" * 100)[:-20])  # truncated: named as gzip, not as Latin-1
    with pytest.raises(ValueError, match=r"^cannot read .*train\.txt after \d+ lines"):
        list(iter_lines(path))


@pytest.mark.parametrize(("compress", "suffix"), [(lzma.compress, ".xz"), (bz2.compress, ".bz2")])
def test_xz_and_bzip2_data_are_read_decompressed_and_their_faults_named(tmp_path, compress, suffix):
    path = tmp_path / f"train.de{suffix}"
    lines = [f"Zeile {i} ist grün" for i in range(3000)]
    data = compress("\n".join(lines).encode() + b"\n")
    path.write_bytes(data)
    assert list(iter_lines(path)) == lines
    (tmp_path / "no-suffix").write_bytes(data)
    assert list(iter_lines(tmp_path / "no-suffix")) == lines
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match=rf"^cannot read .*train\.de{suffix} after \d+ lines"):
        list(iter_lines(path))
    corrupt = bytearray(data)
    corrupt[100:160] = b"x" * 60
    path.write_bytes(bytes(corrupt))
    with pytest.raises(ValueError, match=rf"^cannot read .*train\.de{suffix} after \d+ lines"):
        list(iter_lines(path))


def test_zstd_data_is_named_not_read_as_latin1(tmp_path):
    path = tmp_path / "train.en"
    path.write_bytes(b"\x28\xb5\x2f\xfd\x24\x05\x29\x00\x00")  # a zstd frame's header
    with pytest.raises(ValueError, match=r"^.*train\.en is zstd-compressed: decompress it first"):
        list(iter_lines(path))


def test_a_file_whose_lines_end_in_carriage_returns_alone_is_refused(tmp_path):
    # Read by "\n" alone it would be one sentence: an evaluation of 1 line, a translation of 1 line.
    path = tmp_path / "refs.de"
    path.write_bytes(b"eins\rzwei\rdrei\r")
    with pytest.raises(ValueError, match=r"refs\.de: its lines end in \\r alone .*tr '\\r' '\\n'"):
        list(iter_lines(path))
    path.write_bytes(b"eins\rzwei\rdrei")  # without the last one
    with pytest.raises(ValueError, match=r"its lines end in \\r alone"):
        list(iter_lines(path))
    for appended in (b"eins\rzwei\rdrei\n", b"eins\rzwei\rdrei\r\n"):  # a last line end added by another tool
        path.write_bytes(appended)
        with pytest.raises(ValueError, match=r"its lines end in \\r alone"):
            list(iter_lines(path))
    path.write_bytes(b"one sentence with a stray \r in a Windows file\r\n")
    assert list(iter_lines(path)) == ["one sentence with a stray \r in a Windows file"]
    path.write_bytes(b"eins\rzwei\rdrei\nvier\n")  # stray ones inside a file of several lines: text
    assert list(iter_lines(path)) == ["eins\rzwei\rdrei", "vier"]
    path.write_bytes(b"eins\r\nzwei\r\n")  # Windows' line ends stay fine
    assert list(iter_lines(path)) == ["eins", "zwei"]
    path.write_bytes(b"one sentence with a stray \r in it")  # one line, no newline: a stray character, kept
    assert list(iter_lines(path)) == ["one sentence with a stray \r in it"]
    path.write_bytes(b"one sentence\r")  # one line ended by one \r: that line, whichever way lines end
    assert list(iter_lines(path)) == ["one sentence"]


def test_standard_input_with_carriage_returns_alone_is_refused_with_a_command_that_runs(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"eins\rzwei\r"), encoding="utf-8"))
    with pytest.raises(ValueError, match=r"^<stdin>: its lines end in \\r alone .*\(e\.g\. tr '\\r' '\\n'\)$"):
        list(iter_lines("-"))


def test_one_byte_and_empty_files_are_not_mistaken_for_gzip(tmp_path):
    (tmp_path / "one").write_bytes(b"\x1f")
    (tmp_path / "empty").write_bytes(b"")
    assert list(iter_lines(tmp_path / "one")) == ["\x1f"]
    assert list(iter_lines(tmp_path / "empty")) == []


@pytest.mark.parametrize("compress", [gzip.compress, lzma.compress, bz2.compress])
def test_empty_compressed_files_read_as_empty(tmp_path, compress):
    # bzip2's empty stream has no block, only its end marker: once read as text, "not valid UTF-8 ... iconv".
    path = tmp_path / "empty.de"
    path.write_bytes(compress(b""))
    assert list(iter_lines(path)) == []


@pytest.mark.parametrize("name", ["news.de.gz", "NEWS.DE.GZ"])
def test_a_gz_name_over_plain_text_says_so(tmp_path, name):
    # What a browser or `curl --compressed` leaves: the text decompressed, the name kept. Once "Not a gzipped file".
    path = tmp_path / name
    path.write_bytes(b"Ein Satz.\n")
    with pytest.raises(
        ValueError, match=rf"{re.escape(name)} is named \.gz but holds no gzip data \(it starts with b'Ein Satz'\): "
    ):
        list(iter_lines(path))
    path.write_bytes(b"")  # an empty file holds no text either way
    assert list(iter_lines(path)) == []


def test_iter_lines_reads_standard_input_as_it_reads_files(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(b"one\r\ntwo\rstill two\n\nvier"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert list(iter_lines("-")) == ["one", "two\rstill two", "", "vier"]
    assert not stdin.closed, "standard input stays open for whoever reads it next"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("grün\n".encode("latin-1")), encoding="utf-8"))
    with pytest.raises(ValueError, match=r"^<stdin>:1: not valid UTF-8"):
        list(iter_lines("-"))


def test_the_early_check_refuses_another_users_leftover_beside_a_directory_not_there(tmp_path, monkeypatch):
    """train.py's averaged/ absent, but `.averaged.old` (or `averaged.partial`) a colleague's killed average left:
    `check_replaceable` let the run train, and the average after training was refused on the leftover."""
    target, access = tmp_path / "averaged", os.access
    for leftover in (tmp_path / ".averaged.old", tmp_path / "averaged.partial"):
        leftover.mkdir()
        (leftover / "model.safetensors").write_text("theirs")

        def as_another_user(path, mode, *, theirs=leftover, **kwargs):  # tests run as root, whom nothing stops
            return Path(path) != theirs and access(path, mode, **kwargs)

        monkeypatch.setattr(files_module.os, "access", as_another_user)
        with pytest.raises(UnwritableError, match=rf"may not delete what {re.escape(str(leftover))} holds"):
            check_replaceable(target, "averaging.json", "an average")
        monkeypatch.undo()
        shutil.rmtree(leftover)
    check_replaceable(target, "averaging.json", "an average")


def test_atomic_write_refuses_a_mode_that_would_not_write_the_whole_file(tmp_path):
    """'a' would append to an empty temporary file, which then replaced the file: its old content lost."""
    path = write_text(tmp_path / "hypotheses.de", "old\n")
    with pytest.raises(ValueError, match=r"^atomic_write writes whole files: mode 'w' or 'wb', not 'a'\.$"):
        with atomic_write(path, "a") as handle:
            handle.write("new\n")
    assert path.read_text() == "old\n"
    assert leftovers(tmp_path) == []
    with atomic_write(path, "wb") as handle:
        handle.write("grün\n".encode())
    assert path.read_bytes() == "grün\n".encode()


def test_what_a_killed_writer_left_does_not_block_the_next_one(tmp_path):
    """A kill between the swap's two renames leaves `.NAME.old`, one during the build `NAME.partial` (or a
    saver's `.NAME.partial` staging): the next writer clears them rather than failing on them."""
    target = tmp_path / "averaged"
    with atomic_directory(target) as staging:
        (staging / "model.safetensors").write_text("first")
    for leftover in (tmp_path / ".averaged.old", tmp_path / "averaged.partial"):
        leftover.mkdir()
        (leftover / "stale.bin").write_text("killed")
    with atomic_directory(target) as staging:
        assert list(staging.iterdir()) == [], "the killed build's files are not part of this one"
        (staging / "model.safetensors").write_text("second")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged"]
    assert sorted(path.name for path in target.iterdir()) == ["model.safetensors"]
    assert (target / "model.safetensors").read_text() == "second"

    shared = tmp_path / "run"
    (shared / ".tokenizer.partial").mkdir(parents=True)
    (shared / ".tokenizer.partial" / "stale.json").write_text("killed")
    write_files_into(shared, lambda staging: (staging / "tokenizer.json").write_text("new"), name="tokenizer")
    assert sorted(path.name for path in shared.iterdir()) == ["tokenizer.json"]


def test_a_directory_whose_parents_do_not_exist_yet_is_locked_while_it_is_built(tmp_path):
    """The lock file goes beside the directory: without its parents there, the first writer took no lock and a
    second one deleted its partial directory."""
    target = tmp_path / "runs" / "new" / "averaged"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("first")
        with pytest.raises(UnwritableError, match=r"^another process is writing "):
            with atomic_directory(target):
                pass
        assert (staging / "model.bin").read_text() == "first"
    assert (target / "model.bin").read_text() == "first"


def test_writes_reach_the_disk_before_they_replace_anything(tmp_path, monkeypatch):
    """A power cut after a rename whose file (or directory entry) was still in the page cache leaves an empty or
    missing file in place of the old one: each file is flushed before it is renamed into place, and the
    directory that holds it after."""
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(
        files_module.os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd)
    )
    monkeypatch.setattr(
        files_module.os, "replace", lambda a, b: events.append(("replace", os.fspath(b))) or replace(a, b)
    )
    descriptors = len(os.listdir("/proc/self/fd"))

    write_text(tmp_path / "record.json", "{}\n")
    (kind, temporary), *rest = events
    assert kind == "fsync" and re.fullmatch(r"\.record\.json\.tmp-\d+-[0-9a-f]{8}", Path(temporary).name)
    assert rest == [("replace", str(tmp_path / "record.json")), ("fsync", str(tmp_path))]

    events.clear()
    target = tmp_path / "averaged"
    with atomic_directory(target) as partial:
        (partial / "sub").mkdir()
        (partial / "sub" / "model.bin").write_text("weights")
        (partial / "config.json").write_text("{}")
    flushed = {path for kind, path in events[:-2] if kind == "fsync"}
    assert flushed == {
        str(partial),
        str(partial / "sub"),
        str(partial / "sub" / "model.bin"),
        str(partial / "config.json"),
    }
    assert events[-2:] == [("replace", str(target)), ("fsync", str(tmp_path))]

    events.clear()
    staging, shared = tmp_path / ".final.partial", tmp_path / "run"
    staging.mkdir()
    shared.mkdir()
    (staging / "config.json").write_text("{}")
    replace_files(staging, shared)
    assert events == [
        ("fsync", str(staging / "config.json")),
        ("replace", str(shared / "config.json")),
        ("fsync", str(shared)),
    ]
    assert len(os.listdir("/proc/self/fd")) == descriptors, "every descriptor opened to flush is closed"


def test_a_full_disk_error_already_named_keeps_its_file(tmp_path):
    """A nested write's DiskFullError names the file it was writing; naming the outer one instead would hide it."""
    nested = DiskFullError(tmp_path / "model.safetensors", free=0)
    assert disk_full_error(nested, tmp_path / "export") is nested


def test_a_directory_below_that_cannot_be_listed_or_guards_another_users_files_is_named(tmp_path, monkeypatch):
    """`shutil.rmtree` fails on a directory it cannot list, and on another user's entry in a sticky directory: the
    old export would stay as `.export.old`, blocking every later replacement."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "listed").mkdir()
        (staging / "unlisted").mkdir()
    scandir = os.scandir

    def unlistable(path="."):  # tests run as root, whom no permission stops
        if Path(path) == target / "unlisted":
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", unlistable)
    assert undeletable(target) == target / "unlisted"
    monkeypatch.undo()
    (target / "unlisted").rmdir()
    (target / "listed" / "theirs.bin").write_text("")
    (target / "listed").chmod(0o1777)
    monkeypatch.setattr(files_module.os, "geteuid", lambda: 4242)
    assert undeletable(target) == target / "listed"


def test_only_a_sticky_directory_guards_its_entries_and_from_anyone_but_root(tmp_path, monkeypatch):
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "model.bin").write_text("theirs")
    monkeypatch.setattr(files_module.os, "geteuid", lambda: 4242)
    assert undeletable(target) is None, "without the sticky bit, write permission on the directory is enough"
    tmp_path.chmod(tmp_path.stat().st_mode | stat.S_ISVTX)
    os.chown(tmp_path, 4242, -1)
    os.chown(target, 4343, -1)
    monkeypatch.setattr(files_module.os, "geteuid", lambda: 0)
    assert undeletable(target) is None, "root renames anyone's directory"


def test_reads_once_tells_pipes_from_files(tmp_path):
    fifo, plain = tmp_path / "fifo", write_text(tmp_path / "news.de", "Ein Satz.\n")
    os.mkfifo(fifo)
    assert reads_once("-") and reads_once(Path("-")) and reads_once(fifo)
    assert not reads_once(plain) and not reads_once(tmp_path / "missing")
    # standard input a service manager or ssh connected to a socket: `/dev/stdin` leads to it
    first, second = socket.socketpair()
    with first, second:
        assert reads_once(f"/dev/fd/{first.fileno()}")


def test_file_states_change_when_a_file_is_rewritten_and_sha256_reads_every_chunk(tmp_path):
    path = write_text(tmp_path / "train.de", "ein\n")
    states = file_states([path])
    assert file_states([path]) == states
    write_text(path, "zwei\n")
    assert file_states([path]) != states
    data = bytes(range(10))
    path.write_bytes(data)
    assert file_sha256(path, chunk_size=3) == hashlib.sha256(data).hexdigest()


def test_writes_create_the_missing_directories_above_them(tmp_path):
    write_json(tmp_path / "runs" / "new" / "record.json", {"bleu": 27.3})
    write_files_into(tmp_path / "runs" / "final" / "model", lambda staging: (staging / "config.json").write_text("{}"))
    assert (tmp_path / "runs" / "new" / "record.json").is_file()
    assert (tmp_path / "runs" / "final" / "model" / "config.json").is_file()


def test_a_full_disk_is_found_in_the_error_that_caused_the_writers_or_that_it_handled(tmp_path):
    """safetensors and torch raise their own error, from the file system's or while handling it."""
    for chained_by in ("cause", "context"):
        failure = RuntimeError("Error while serializing")
        setattr(failure, f"__{chained_by}__", OSError(errno.ENOSPC, "No space left on device"))
        with pytest.raises(DiskFullError, match=rf"^No space left on device while writing {tmp_path / 'model'}"):
            with atomic_path(tmp_path / "model"):
                raise failure


def test_a_first_swap_whose_rename_fails_raises_the_renames_error(tmp_path, monkeypatch):
    """With no old directory to put back, the error is the rename's own, not one about the missing old one."""
    new = tmp_path / "export.partial"
    new.mkdir()
    refusal, replace = OSError(errno.EXDEV, "Invalid cross-device link"), os.replace

    def refused(source, destination):
        if Path(source) == new:
            raise refusal
        replace(source, destination)

    monkeypatch.setattr(files_module.os, "replace", refused)
    with pytest.raises(OSError) as error:
        swap_directory(new, tmp_path / "export")
    assert error.value is refusal


def test_a_file_system_without_locks_is_warned_about_and_the_write_goes_on(tmp_path, monkeypatch, caplog):
    def no_locks(fd, operation):  # an NFS mount without a lock daemon
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files_module.fcntl, "flock", no_locks)
    with caplog.at_level("WARNING", logger="modeling.files"):
        with sole_writer(tmp_path / "export"):
            pass
    assert f"a second writer of {tmp_path / 'export'} is not refused" in caplog.text


def test_a_file_that_cannot_be_opened_raises_the_error_of_open_naming_it(tmp_path):
    """Not "cannot read it after 0 lines", which reads as a corrupt file."""
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*missing\.de"):
        list(iter_lines(tmp_path / "missing.de"))


def test_a_write_error_where_the_free_space_cannot_be_read_is_the_file_systems(tmp_path, monkeypatch):
    """A dead NFS mount fails the write (EIO) and the free-space query too: the error is the file system's, named
    in one line, not a TypeError from comparing no free space with the threshold."""

    def no_statvfs(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(shutil, "disk_usage", no_statvfs)
    assert disk_full_error(RuntimeError("write failed"), tmp_path / "model.safetensors") is None
    with pytest.raises(UnwritableError, match=r"^Input/output error while writing .*model\.safetensors$") as error:
        with atomic_path(tmp_path / "model.safetensors"):
            raise OSError(errno.EIO, "Input/output error")
    assert not isinstance(error.value, DiskFullError)


def test_a_disk_with_a_hundred_mib_free_is_not_full(tmp_path, monkeypatch):
    """Only almost no free space (under 16 MiB) blames a bare 'write failed' on a full disk."""
    # the line itself too: 16 MiB free is not full, a byte less is
    for free, full in ((100 * 2**20, False), (15 * 2**20, True), (16 * 2**20, False), (16 * 2**20 - 1, True)):
        monkeypatch.setattr(shutil, "disk_usage", lambda path, free=free: shutil._ntuple_diskusage(2**40, 2**40, free))
        error = disk_full_error(RuntimeError("write failed"), tmp_path / "optimizer.pt")
        assert isinstance(error, DiskFullError) if full else error is None, free


def test_a_second_writer_naming_the_directory_through_a_link_is_refused(tmp_path):
    """`out -> /scratch/out`: one job names the link, another the directory; one lock beside what is written."""
    target, link = tmp_path / "export", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target)
    with sole_writer(target):
        with pytest.raises(UnwritableError, match="^another process is writing "):
            with sole_writer(str(link)):
                pass
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export", "link"]


def test_an_empty_directory_may_be_replaced_without_the_marker(tmp_path):
    """A directory made ahead of the run (`mkdir out`) holds nothing to lose."""
    (tmp_path / "out").mkdir()
    check_replaceable(tmp_path / "out", "export.json", "an export")
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"is not an export \(no export\.json\)"):
        check_replaceable(tmp_path / "out", "export.json", "an export")


def test_a_terminal_can_be_read_only_once(tmp_path):
    """`translate.py --input-file /dev/tty`, or /dev/stdin on a terminal: a character device, read once."""
    leader, follower = os.openpty()
    try:
        assert reads_once(os.ttyname(follower))
    finally:
        os.close(leader)
        os.close(follower)


def test_json_records_hold_their_text_as_utf8_not_escapes(tmp_path):
    """Records a user reads (run identity, results) show "grün" as written, not "gr\\u00fcn"."""
    path = write_json(tmp_path / "record.json", {"data": "grün"})
    assert '"data": "grün"' in path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("data", "refusal"),
    [(b"\x28\xb5\x2f\xfd\x24\x05\x29\x00\x00", "is zstd-compressed"), ("Satz\n".encode("utf-16"), "is UTF-16 text")],
)
def test_compressed_or_utf16_standard_input_is_named_as_stdin(monkeypatch, data, refusal):
    """`zstdcat`-less `cat train.zst | translate.py`: the refusal names <stdin>, not a file called "-"."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    with pytest.raises(ValueError, match=f"^<stdin> {refusal}"):
        list(iter_lines("-"))


def test_files_moved_into_a_directory_not_there_yet_create_it(tmp_path):
    staging = tmp_path / ".model.partial"
    staging.mkdir()
    (staging / "config.json").write_text("{}")
    moved = replace_files(staging, tmp_path / "runs" / "final")
    assert moved == [tmp_path / "runs" / "final" / "config.json"] and not staging.exists()


def test_a_full_disk_error_tells_its_path(tmp_path):
    """For a caller that cleans up where the write failed."""
    error = DiskFullError(tmp_path / "optimizer.pt", free=0)
    assert error.path == str(tmp_path / "optimizer.pt") and error.errno == errno.ENOSPC


def test_compressed_data_through_a_pipe_is_read_decompressed(tmp_path):
    """`<(cat train.de.gz)` or `/dev/stdin` fed by a pipe: no seek back over the bytes that tell the compression,
    which are peeked at instead; read as text, they were "not valid UTF-8" on the first line."""
    for compress in (gzip.compress, lzma.compress, bz2.compress):
        read_end, write_end = os.pipe()
        os.write(write_end, compress("über\nfünf\n".encode()))  # far below a pipe's buffer: no reader needed yet
        os.close(write_end)
        try:
            assert list(iter_lines(f"/dev/fd/{read_end}")) == ["über", "fünf"]
        finally:
            os.close(read_end)


def test_a_full_disk_names_a_path_given_as_a_string(tmp_path):
    """A caller's destination from the command line is a `str`: the error names it, not an AttributeError raised
    while handling the full disk."""
    full = disk_full_error(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path / "out.de"))
    assert isinstance(full, DiskFullError)
    assert str(full).startswith(f"No space left on device while writing {tmp_path / 'out.de'}")
    assert re.search(r"\(\d+\.\d MiB free\)$", str(full)), "the free space of the directory it was to be written in"


def test_a_link_to_a_directory_is_deletable_whatever_its_target_holds(tmp_path, monkeypatch):
    """Replacing or rotating a link removes the link, not what it leads to: another user's files there do not
    block it."""
    target = tmp_path / "export"
    with atomic_directory(target) as staging:
        (staging / "listed").mkdir()
        (staging / "listed" / "theirs.bin").write_text("")
    (target / "listed").chmod(0o1777)
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    monkeypatch.setattr(files_module.os, "geteuid", lambda: 4242)
    assert undeletable(target) == target / "listed", "the directory itself is blocked"
    assert undeletable(tmp_path / "link") is None


def test_a_savers_files_move_into_the_directory_config_last_by_default(tmp_path, monkeypatch):
    """`save_pretrained`'s files: a write killed while they move in leaves no config.json beside weights of
    another model (the loader reads config.json first)."""
    order = []
    replace = os.replace
    monkeypatch.setattr(files_module.os, "replace", lambda a, b: order.append(os.path.basename(b)) or replace(a, b))

    def saver(staging):
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (staging / name).write_text(name)

    write_files_into(tmp_path / "model", saver)
    assert order[-1] == "config.json" and sorted(order) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_records_are_written_as_utf8_whatever_the_locale_encoding(tmp_path, ascii_locale):
    """A job started under LANG=C writes its records in UTF-8, as every reader reads them (it failed in
    UnicodeEncodeError on a non-ASCII note or path)."""
    path = write_json(tmp_path / "record.json", {"data": "grün"})
    assert path.read_bytes() == '{\n  "data": "grün"\n}\n'.encode()
    with atomic_write(tmp_path / "hypotheses.de") as handle:
        handle.write("Grüße\n")
    assert (tmp_path / "hypotheses.de").read_bytes() == "Grüße\n".encode()


def test_files_move_between_directories_given_as_strings(tmp_path):
    """A caller's directories from the command line are `str`s: the files move and the paths returned are Paths."""
    staging = tmp_path / ".model.partial"
    staging.mkdir()
    (staging / "model.safetensors").write_text("weights")
    moved = replace_files(str(staging), str(tmp_path / "final"))
    assert moved == [tmp_path / "final" / "model.safetensors"] and not staging.exists()
    assert moved[0].read_text() == "weights"


def test_standard_input_that_can_neither_peek_nor_seek_is_read_as_plain_text(monkeypatch):
    """A raw (unbuffered) pipe standing in for standard input: no bytes to look at for compression, so its lines
    are read as they are."""
    read_end, write_end = os.pipe()
    os.write(write_end, "über\nfünf\n".encode())
    os.close(write_end)
    with io.FileIO(read_end, "rb") as raw:  # no `peek`, and a pipe cannot seek
        monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=raw))
        assert list(iter_lines("-")) == ["über", "fünf"]


def test_records_are_read_as_utf8_whatever_the_locale_encoding(tmp_path, ascii_locale):
    """A job started under LANG=C reads the records it and others wrote in UTF-8 (it would read ASCII)."""
    path = tmp_path / "record.json"
    path.write_bytes('{"data": "grün"}'.encode())
    assert read_json(path) == {"data": "grün"}


def test_an_error_without_errno_caused_by_the_file_systems_is_the_file_systems(tmp_path, monkeypatch):
    """A writer that wraps the file system's EIO in an OSError of its own, without errno: the cause's reason is
    the one line, not the wrapper raised as it is."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    with pytest.raises(UnwritableError, match=r"^Input/output error while writing .*model\.safetensors$"):
        with atomic_path(tmp_path / "model.safetensors"):
            try:
                raise OSError(errno.EIO, "Input/output error")
            except OSError as error:
                raise OSError("saving the weights failed") from error
    assert leftovers(tmp_path) == []


def test_a_writer_that_removed_the_temporary_file_before_failing_raises_its_own_error(tmp_path):
    """Its error is what the caller sees, not a FileNotFoundError from removing what is no longer there."""
    (tmp_path / "out.de").write_text("old\n")
    with pytest.raises(RuntimeError, match="^the writer failed$"):
        with atomic_path(tmp_path / "out.de") as temporary:
            temporary.unlink()
            raise RuntimeError("the writer failed")
    assert (tmp_path / "out.de").read_text() == "old\n" and leftovers(tmp_path) == []


def test_a_directory_given_as_strings_is_swapped_into_place(tmp_path):
    """A caller's paths from the command line are `str`s: the new directory takes the old one's place."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "old.bin").write_text("old")
    (tmp_path / "export.partial").mkdir()
    (tmp_path / "export.partial" / "new.bin").write_text("new")
    swap_directory(str(tmp_path / "export.partial"), str(tmp_path / "export"))
    assert [path.name for path in (tmp_path / "export").iterdir()] == ["new.bin"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"], "no partial or old directory is left"
