"""Which checkpoints of a run exist, which are complete, and which run they belong to.

One definition serves resuming, averaging and rotating checkpoints:

- **complete**: `checkpoint_complete.json` exists and lists files that all exist with the sizes it gives. The
  trainer (`modeling.trainer`) writes every checkpoint in a hidden staging directory, flushes it, writes this
  marker, then renames the directory into place, so a killed save never leaves a `checkpoint-N` behind.
  A checkpoint without the marker (written before this project had it) counts as complete only if its files are
  intact: `config.json` and `trainer_state.json` parse, every safetensors file's header parses and its size
  matches the header, and the pickled states (`optimizer.pt`, `scheduler.pt`, `rng_state*.pth`, ...) are
  readable zip archives.
- **provenance**: `run_identity.json`, written by `modeling.training.train` into the output directory and into
  every checkpoint, describes what makes two checkpoints part of the same run: architecture, tokenizer, data,
  seed, preset. `identity_differences` names the fields that differ.

Only the standard library is needed here: deployment tools (`modeling.translation`) use the weight checks too.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import pickle
import re
import struct
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .files import file_sha256, read_json, require_directory, write_json

logger = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# What an interrupted save (.partial), replacement (.old) or rotation (.deleting) leaves: never matches CHECKPOINT_RE.
STAGING_RE = re.compile(r"^\.checkpoint-(\d+)\.(partial|old|deleting)$")
COMPLETE_MARKER = "checkpoint_complete.json"
RUN_IDENTITY_FILE = "run_identity.json"
PREEMPTED_FILE = "preempted.json"
# Written by modeling.fairseq.convert_fairseq into a converted model's directory (a directory holding it may be
# replaced by a new conversion); a run fine-tuning such a model copies it into its training record.
CONVERSION_FILE = "fairseq_conversion.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TRAINER_STATE_NAME = "trainer_state.json"
# A training run's records beside its model, which the model card reads (`modeling.model_card`).
TRAINING_ARGS_FILE = "training_args.json"
# The model card and its figure, rendered into a model directory from records (`modeling.model_card`): a directory
# replaced by a new build (a conversion, an average) loses them, and the next push renders them again.
CURVES_FILE = "training_curves.png"
# Where the card's figure is drawn before it is moved in: a killed render leaves it, which a replacement takes too.
MODEL_CARD_STAGING = ".model_card.partial"
MODEL_CARD_FILES = ("README.md", CURVES_FILE, MODEL_CARD_STAGING)
DATA_STATS_FILE = "data_stats.json"
# Held by a training run for as long as it writes into its output directory (`modeling.training.training_lock`).
TRAINING_LOCK_FILE = ".training.lock"
PICKLED_STATE_RE = re.compile(r"^(optimizer|scheduler|scaler)\.pt$|^rng_state(_\d+)?\.pth$")
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "source.spm", "target.spm", "merges.txt", "spm.model")
# Config fields that change without the model changing: library version, where it was loaded from, dtype.
VOLATILE_CONFIG_FIELDS = frozenset(
    {"transformers_version", "_name_or_path", "_commit_hash", "architectures", "auto_map", "dtype", "torch_dtype"}
    | {"output_attentions", "output_hidden_states", "return_dict", "use_cache", "_attn_implementation"}
)


class IncompleteCheckpointError(ValueError):
    """An explicitly named checkpoint is incomplete; the message says what is missing."""


class RunMismatchError(ValueError):
    """Checkpoints, or a checkpoint and the run about to use it, belong to different runs."""


# --- listing -------------------------------------------------------------------------------------------------


def checkpoint_step(path: str | os.PathLike) -> int:
    """The update number of a Trainer checkpoint directory `.../checkpoint-<step>`."""
    match = CHECKPOINT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a Trainer checkpoint directory (checkpoint-<step>).")
    return int(match[1])


def saved_update(checkpoint: str | os.PathLike) -> int:
    """The update a complete checkpoint holds, by its `trainer_state.json`: also for one renamed or copied under
    another name than `checkpoint-<step>`."""
    return int(json.loads((Path(checkpoint) / TRAINER_STATE_NAME).read_text(encoding="utf-8"))["global_step"])


def removed_by_rotation(subject: str, while_: str, advice: str) -> FileNotFoundError:
    """The error of a checkpoint or model directory gone while it was read (`subject` "was removed while `while_`"),
    most likely deleted by the save_total_limit rotation of a run still training beside it."""
    return FileNotFoundError(
        f"{subject} was removed while {while_} (by the save_total_limit rotation of a run still training there?): "
        f"{advice}"
    )


@contextmanager
def named_if_removed(directory: str | os.PathLike, removed: FileNotFoundError) -> Iterator[None]:
    """Raise `removed` (a `removed_by_rotation` error) for whatever failed inside, if `directory` is gone: a
    directory removed while it is read fails as whatever its reader met first ("is not a directory", a missing
    README.md, "Repo id must be in the form ..."), saying neither what happened nor what to do."""
    try:
        yield
    except Exception as error:
        if os.path.isdir(directory):
            raise
        raise removed from error


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Every `checkpoint-<step>` directory in `directory`, complete or not, by step (checkpoint-900 before -1000)."""
    directory = require_directory(directory, "Checkpoint directory")
    found = [path for path in directory.iterdir() if path.is_dir() and CHECKPOINT_RE.match(path.name)]
    return sorted(found, key=checkpoint_step)


def model_card_files(directory: str | os.PathLike) -> list[Path]:
    """The model card files in `directory` (`MODEL_CARD_FILES`, those there): README.md only where it begins with a
    card's metadata block (a user's notes do not)."""
    found = [Path(directory) / name for name in MODEL_CARD_FILES if os.path.lexists(Path(directory) / name)]
    card = Path(directory) / "README.md"
    if card in found:
        with open(card, "rb") as handle:
            if handle.read(4) != b"---\n":
                found.remove(card)
    return found


def staging_directories(directory: str | os.PathLike) -> list[Path]:
    """Hidden `.checkpoint-<step>.partial` (`.old`, `.deleting`) directories: what saves, replacements and
    rotations that were interrupted left (or those under way)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.iterdir() if path.is_dir() and STAGING_RE.match(path.name))


def complete_checkpoints(directory: str | os.PathLike, *, warn: bool = True) -> list[Path]:
    """The complete checkpoints of `directory`, by step; incomplete ones are skipped with a warning naming them."""
    complete = []
    for checkpoint in list_checkpoints(directory):
        problems = checkpoint_problems(checkpoint)
        if problems:
            if warn:
                logger.warning("Skipping the incomplete checkpoint %s: %s", checkpoint, describe_problems(problems))
        else:
            complete.append(checkpoint)
    return complete


def latest_complete_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of `directory` (incomplete newer ones skipped with a warning), or None."""
    if not Path(directory).is_dir():
        return None
    for checkpoint in reversed(list_checkpoints(directory)):
        problems = checkpoint_problems(checkpoint)
        if not problems:
            return checkpoint
        logger.warning("Skipping the incomplete checkpoint %s: %s", checkpoint, describe_problems(problems))
    return None


def require_complete_checkpoint(path: str | os.PathLike) -> Path:
    """`path` if it is a complete checkpoint, else `IncompleteCheckpointError` saying what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise IncompleteCheckpointError(f"Checkpoint {path} does not exist.")
    problems = checkpoint_problems(path)
    if problems:
        raise IncompleteCheckpointError(f"Checkpoint {path} is incomplete: {describe_problems(problems)}.")
    return path


# --- completeness --------------------------------------------------------------------------------------------


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """Why a safetensors file is unusable (missing, truncated, a header that does not parse), or None.

    Reads only the header: its length, its JSON, and the data offsets, whose end must be the file's end."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                return f"{path.name} is truncated ({size} bytes, not even a header)"
            (header_size,) = struct.unpack("<Q", prefix)
            if 8 + header_size > size:
                return f"{path.name} is truncated ({size} bytes, its header alone needs {8 + header_size})"
            header = json.loads(handle.read(header_size))
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, ValueError) as error:
        return f"{path.name} cannot be read ({type(error).__name__}: {error})"
    if not isinstance(header, dict):
        return f"{path.name} has no valid safetensors header"
    tensors = [entry for name, entry in header.items() if name != "__metadata__"]
    # an edited or foreign header that parses: a tensor's entry without its two data offsets
    if not all(isinstance(entry, dict) and _is_offset_pair(entry.get("data_offsets")) for entry in tensors):
        return f"{path.name} has no valid safetensors header"
    expected = 8 + header_size + max((entry["data_offsets"][1] for entry in tensors), default=0)
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        return f"{path.name} is {state} ({size} bytes, expected {expected})"
    return None


def _is_offset_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(type(offset) is int for offset in value)


def weight_files(directory: str | os.PathLike) -> list[Path]:
    """The safetensors files of a model directory that `from_pretrained` loads: model.safetensors where there is
    one, even beside an index (a sharded save leaves an earlier single file in place), else the shards of the
    index (ValueError where the index maps no tensors to file names)."""
    directory = Path(directory)
    if (directory / WEIGHTS_NAME).is_file():
        return [directory / WEIGHTS_NAME]
    index = directory / WEIGHTS_INDEX_NAME
    if index.is_file():
        return [directory / shard for shard in index_shards(index)]
    return sorted(directory.glob("*.safetensors"))


def index_shards(index: str | os.PathLike) -> list[str]:
    """The shard files a `model.safetensors.index.json` maps tensors to, sorted; ValueError naming the index where it
    parses but maps no tensors to file names (edited by hand, another tool's)."""
    record = json.loads(Path(index).read_text(encoding="utf-8"))
    weight_map = record.get("weight_map") if isinstance(record, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(shard, str) for shard in weight_map.values()):
        raise ValueError(f"{index} has no weight_map of tensor names to shard files")
    return sorted(set(weight_map.values()))


def weights_problems(directory: str | os.PathLike, *, missing_ok: bool = False) -> list[str]:
    """What is wrong with a model directory's weights: none found, or a truncated or unreadable file. With
    `missing_ok` (a Hub cache's snapshot, where files not yet downloaded are absent), only those there are judged."""
    directory = Path(directory)
    try:
        files = weight_files(directory)
    except (OSError, ValueError, KeyError) as error:
        return [f"{WEIGHTS_INDEX_NAME} cannot be read ({type(error).__name__}: {error})"]
    if missing_ok:
        files = [path for path in files if path.exists()]
    elif not files:
        # complete, in another format: "no weights" had averaging call an older transformers' checkpoint incomplete
        if pickled := sorted(path.name for path in directory.glob("pytorch_model*.bin")):
            return [
                f"no weights in safetensors ({WEIGHTS_NAME}), only {pickled[0]} (an older transformers' pickle): "
                "load it with from_pretrained and save_pretrained it to convert it"
            ]
        return [f"no weights ({WEIGHTS_NAME})"]
    return [problem for path in files if (problem := safetensors_problem(path))]


def _json_problem(path: Path) -> str | None:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, ValueError) as error:
        return f"{path.name} does not parse ({type(error).__name__}: {error})"
    return None


def _zip_problem(path: Path) -> str | None:
    """torch.save writes zip archives, whose directory sits at the end: a truncated file has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        return f"{path.name} is not a readable archive ({error})"
    return None


def _marker_problems(checkpoint: Path) -> list[str]:
    try:
        marker = json.loads((checkpoint / COMPLETE_MARKER).read_text(encoding="utf-8"))
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"{COMPLETE_MARKER} cannot be read ({type(error).__name__}: {error})"]
    if not isinstance(files, dict) or not all(isinstance(size, int) for size in files.values()):
        return [f"{COMPLETE_MARKER} does not list files and sizes"]
    problems = []
    for name, size in sorted(files.items()):
        path = checkpoint / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size != size:
            problems.append(f"{name} has {path.stat().st_size} bytes, {COMPLETE_MARKER} says {size}")
    return problems


def checkpoint_problems(checkpoint: str | os.PathLike, *, training_state: bool = True) -> list[str]:
    """What makes `checkpoint` incomplete, as short phrases; an empty list for a complete checkpoint.

    With the marker, its list of files and sizes decides. Without it (older checkpoints), the required files
    must be intact: config.json, the weights, trainer_state.json (unless `training_state=False`, for plain
    model directories) and any pickled training state.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return [f"{checkpoint} does not exist"]
    if (checkpoint / COMPLETE_MARKER).is_file():
        return _marker_problems(checkpoint)
    problems = [problem for problem in [_json_problem(checkpoint / "config.json")] if problem]
    problems += weights_problems(checkpoint)
    if training_state:
        problems += [problem for problem in [_json_problem(checkpoint / TRAINER_STATE_NAME)] if problem]
    for path in sorted(checkpoint.iterdir()):
        if PICKLED_STATE_RE.match(path.name) and (problem := _zip_problem(path)):
            problems.append(problem)
    return [f"no {COMPLETE_MARKER}, and", *problems] if problems else []


def describe_problems(problems: list[str]) -> str:
    """The phrases of `checkpoint_problems` as one clause."""
    if problems and problems[0].endswith(", and"):
        return f"{problems[0]} {'; '.join(problems[1:])}"
    return "; ".join(problems)


def write_completeness_marker(checkpoint: str | os.PathLike, **extra: Any) -> Path:
    """List every file below `checkpoint` with its size in `checkpoint_complete.json` (written last)."""
    checkpoint = Path(checkpoint)
    files = {
        path.relative_to(checkpoint).as_posix(): path.stat().st_size
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != COMPLETE_MARKER
    }
    return write_json(checkpoint / COMPLETE_MARKER, {**extra, "files": files})


def marker_record(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """What `write_completeness_marker` recorded of `checkpoint` (its `extra` among it); empty where there is no
    readable marker (a checkpoint of another Trainer, or of an older release)."""
    try:
        record = json.loads((Path(checkpoint) / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def saved_training_arguments(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The fields of the Trainer's arguments pickled in `checkpoint/training_args.bin`, read without importing or
    calling anything the pickle names (an enum field gives its value); None where there is no such file or it does
    not read as one."""
    try:
        with zipfile.ZipFile(Path(checkpoint) / "training_args.bin") as archive:
            data = next(name for name in archive.namelist() if name.endswith("data.pkl"))
            fields = vars(_InertUnpickler(io.BytesIO(archive.read(data))).load())
    except Exception:  # no file, an older format, a pickle of something else
        return None
    return {key: _enum_value(value) for key, value in fields.items()}


def _enum_value(value: Any) -> Any:
    """An enum member pickled as a call of its class with its value (`IntervalStrategy("steps")`): that value."""
    arguments = getattr(value, "args", ()) if isinstance(value, _Inert) else ()
    return arguments[0] if len(arguments) == 1 else value


class _Inert:
    """What `_InertUnpickler` makes of every class and function a pickle names: a record of its arguments."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)


class _InertUnpickler(pickle.Unpickler):
    """Reads a pickle without importing or calling anything it names: every global is `_Inert`."""

    def find_class(self, module, name):
        return _Inert

    def persistent_load(self, pid):
        return None


# --- provenance ----------------------------------------------------------------------------------------------


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """A model config (`config.to_dict()` or config.json) without the fields that change with no model change,
    as JSON gives it back (string keys), so that a recorded one and a fresh one compare equal."""
    kept = {key: value for key, value in config.items() if key not in VOLATILE_CONFIG_FIELDS}
    return json.loads(json.dumps(kept, default=str))


def vocabulary_fingerprint(vocab: Mapping[str, int]) -> str:
    """sha256 of a tokenizer's vocabulary (token → id): what must match for two models to read the same ids."""
    canonical = json.dumps(sorted(vocab.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def saved_vocabulary_fingerprint(directory: str | os.PathLike) -> str | None:
    """The vocabulary of the tokenizer saved in `directory`, read without loading it: `vocabulary_fingerprint` of
    tokenizer.json's vocabulary (the same as of the loaded tokenizer's `get_vocab()`), else sha256 of the other
    vocabulary files; None without any."""
    directory = Path(directory)
    path = directory / "tokenizer.json"
    if path.is_file():
        state = read_json(path)  # a copy cut short: averaging named no file
        vocab = (state.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [piece, score] pairs, the id being the position
            vocab = {piece: index for index, (piece, _) in enumerate(vocab)}
        vocab = {**vocab, **{token["content"]: token["id"] for token in state.get("added_tokens", [])}}
        return vocabulary_fingerprint(vocab)
    digest, found = hashlib.sha256(), False
    for name in VOCABULARY_FILES[1:]:
        if (directory / name).is_file():
            digest.update(name.encode() + b"\0" + (directory / name).read_bytes())
            found = True
    return digest.hexdigest() if found else None


def describe_files(paths: Iterable[str | os.PathLike]) -> list[dict[str, Any]]:
    """Name, size and sha256 of each file: what identifies a corpus wherever it is copied."""
    return [
        {"name": Path(path).name, "size": os.path.getsize(path), "sha256": file_sha256(path)}
        for path in sorted(map(str, paths))
    ]


def weights_record(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Name, size and sha256 of a model directory's weight files: which weights a result was measured on."""
    return describe_files(weight_files(directory))


def read_run_identity(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The `run_identity.json` of an output directory or checkpoint, or None where there is none."""
    path = Path(directory) / RUN_IDENTITY_FILE
    if not path.is_file():
        return None
    return read_json(path)


# Run-identity fields added since runs were first recorded (2026-12-05: `model_revision`, `model_weights`,
# `fairseq_conversion`, `dataset_commit`; 2026-12-07: `model_commit`).
IDENTITY_FIELDS_ADDED_LATER = (
    "model_revision",
    "model_weights",
    "fairseq_conversion",
    "dataset_commit",
    "model_commit",
)


def identity_differences(
    first: Mapping[str, Any], second: Mapping[str, Any], prefix: str = "", *, shared_only: bool = False
) -> list[str]:
    """Dotted names of the fields that differ between two run identities (`config.d_model`, `data.files`).

    In `config`, only the fields both have are compared: a field that a newer transformers adds to every config
    (with its default) does not make a checkpoint another run's. Nor does a field of `IDENTITY_FIELDS_ADDED_LATER`
    that one of them lacks (recorded before it existed). A model directory both fine-tuned is compared by its
    weights (`model_weights`) or its path: moved, copied to another node or named from another working
    directory, it is the same model under another path; averaged again in place (the base of a fine-tune whose
    checkpoints hold their own weights), the same directory, as it was before the field."""
    differences = []
    keys = set(first) & set(second) if shared_only else set(first) | set(second)
    if not prefix:  # a field an identity recorded before it existed does not make that run another
        keys -= {key for key in IDENTITY_FIELDS_ADDED_LATER if key not in first or key not in second}
        model = ("model_name_or_path", "model_weights")
        if first.get("model_weights") and second.get("model_weights"):  # the same model: moved, or changed in place
            if any(first.get(key) is not None and first.get(key) == second.get(key) for key in model):
                keys -= set(model)
    for key in sorted(keys, key=str):
        a, b = first.get(key), second.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            lenient = shared_only or (not prefix and key == "config")
            differences += identity_differences(a, b, f"{prefix}{key}.", shared_only=lenient)
        elif a != b:
            differences.append(f"{prefix}{key}")
    return differences


def describe_differences(first: Mapping[str, Any], second: Mapping[str, Any], fields: Sequence[str]) -> str:
    """`field: A vs B` for each differing field, values shortened; for lists of named files (`data.files`), the
    files that differ, by name."""

    def value(identity: Mapping[str, Any], dotted: str) -> Any:
        for part in dotted.split("."):
            identity = identity.get(part) if isinstance(identity, Mapping) else None
        return identity

    def shown(item: Any) -> str:
        text = json.dumps(item, ensure_ascii=False)
        return text if len(text) <= 80 else text[:77] + "..."

    def described(field: str) -> str:
        a, b = value(first, field), value(second, field)
        files_a, files_b = _files_by_name(a), _files_by_name(b)
        if files_a is None or files_b is None:
            return f"{field}: {shown(a)} vs {shown(b)}"
        changed = [
            f"{name} {'changed' if name in files_a and name in files_b else 'only in one'}"
            for name in sorted(files_a.keys() | files_b.keys())
            if files_a.get(name) != files_b.get(name)
        ]
        return f"{field}: {', '.join(changed)}"

    return "; ".join(map(described, fields))


def _files_by_name(value: Any) -> dict[str, Any] | None:
    """A list of file records (`describe_files`) by name; None for anything else."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) and "name" in item for item in value):
        return None
    return {item["name"]: item for item in value}


def model_differences(first: str | os.PathLike, second: str | os.PathLike) -> list[str]:
    """What differs between two saved models or checkpoints: config fields, tokenizer, run identity fields."""
    first, second = Path(first), Path(second)
    differences = []
    configs = []
    for directory in (first, second):
        try:
            configs.append(config_identity(json.loads((directory / "config.json").read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            configs.append({})
    differences += [f"config.{name}" for name in identity_differences(*configs, shared_only=True)]
    if saved_vocabulary_fingerprint(first) != saved_vocabulary_fingerprint(second):
        differences.append("tokenizer")
    identities = read_run_identity(first), read_run_identity(second)
    if None not in identities:
        differences += [
            f"run_identity.{name}"
            for name in identity_differences(*identities)
            if not name.startswith("config.")  # already compared above
        ]
    return differences


# --- a run still training in a directory ---------------------------------------------------------------------


def training_lock_holder(handle: IO[str]) -> str:
    """Who holds a training lock, as its holder wrote it into the file (`pid N on HOST, since ...`)."""
    handle.seek(0)
    return handle.readline().strip() or "a process that has not said who it is"


def training_run_in(directory: str | os.PathLike) -> str | None:
    """The training run that holds `directory`'s lock (`pid N on HOST, since ...`), None where none does (no lock
    file, or a file system without locks). Its final model is saved there file by file when it ends."""
    try:
        with open(Path(directory) / TRAINING_LOCK_FILE, encoding="utf-8") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the file, at once
            except BlockingIOError:
                return training_lock_holder(lock)
    except OSError:
        return None
    return None


def check_outside_live_checkpoints(path: str | os.PathLike, what: str) -> None:
    """Refuse `what` written at `path` inside a checkpoint of a run still training (`runs/x/checkpoint-N/eval`):
    rotating its checkpoints (`--save_total_limit`) deletes that directory with all it holds, an evaluation's
    hypotheses and scores, or a translation resumable from its partial file, with them."""
    resolved = Path(path).resolve()
    for checkpoint in resolved.parents:
        if CHECKPOINT_RE.match(checkpoint.name) and (holder := training_run_in(checkpoint.parent)):
            raise ValueError(
                f"{what} {path} lies inside {checkpoint}, which the training run in {checkpoint.parent} ({holder}) "
                "deletes when it rotates its checkpoints: write it outside that directory"
            )


__all__ = [
    "COMPLETE_MARKER",
    "CURVES_FILE",
    "DATA_STATS_FILE",
    "MODEL_CARD_FILES",
    "MODEL_CARD_STAGING",
    "IncompleteCheckpointError",
    "PREEMPTED_FILE",
    "RUN_IDENTITY_FILE",
    "RunMismatchError",
    "TRAINING_ARGS_FILE",
    "TRAINING_LOCK_FILE",
    "check_outside_live_checkpoints",
    "checkpoint_problems",
    "checkpoint_step",
    "complete_checkpoints",
    "identity_differences",
    "index_shards",
    "model_card_files",
    "latest_complete_checkpoint",
    "list_checkpoints",
    "marker_record",
    "model_differences",
    "read_run_identity",
    "require_complete_checkpoint",
    "safetensors_problem",
    "training_lock_holder",
    "training_run_in",
    "weights_record",
    "write_completeness_marker",
]
