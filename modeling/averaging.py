"""Checkpoint averaging (Vaswani et al. 2017, Sec. 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were written at
10-minute intervals. For the big models, we averaged the last 20 checkpoints." Averaging the weights of nearby
points of one training run smooths out the noise of the last updates, for free at inference time.

Works on the checkpoint directories the Trainer writes (`checkpoint-<step>/model.safetensors`, or sharded with
`model.safetensors.index.json`), one checkpoint at a time, so memory holds one model plus the float64 sums. Weights
tied to others are stored once by `save_pretrained` and therefore averaged once; `from_pretrained` ties them again.

Only complete checkpoints are averaged (`modeling.checkpoints`: incomplete ones are skipped with a warning naming
them), only checkpoints of one run (same config, tokenizer and run identity: mixed ones are refused, naming the two
checkpoints and what differs), and the result is built in `OUTPUT.partial` and swapped into place whole.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.utils import GENERATION_CONFIG_NAME

from .checkpoints import (
    CHECKPOINT_RE,
    COMPLETE_MARKER,
    MODEL_CARD_FILES,
    PICKLED_STATE_RE,
    TRAINER_STATE_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    IncompleteCheckpointError,
    RunMismatchError,
    checkpoint_problems,
    checkpoint_step,
    complete_checkpoints,
    describe_problems,
    identity_differences,
    list_checkpoints,
    marker_record,
    model_differences,
    read_run_identity,
    removed_by_rotation,
    saved_training_arguments,
    weight_files,
)
from .files import check_replaceable, read_json, replacing_directory, write_json

logger = logging.getLogger(__name__)

AVERAGING_RECORD_NAME = "checkpoint_averaging.json"
REPLACEABLE = "an average of checkpoints"  # what a directory holding that record is
# Not copied from the newest checkpoint: the Trainer state of one point of training (besides the pickled states of
# PICKLED_STATE_RE), and what describes that checkpoint's own weights.
_NOT_COPIED = {TRAINER_STATE_NAME, "training_args.bin", WEIGHTS_INDEX_NAME, COMPLETE_MARKER}
_Layout = dict[str, tuple[torch.Size, torch.dtype]]  # every tensor's shape and dtype, by name


def last_checkpoints(
    checkpoint_dir: str | os.PathLike,
    n: int,
    *,
    identity: Mapping[str, Any] | None = None,
    at_most: bool = False,
) -> list[Path]:
    """The `n` newest complete checkpoints of `checkpoint_dir`, oldest first; an error if there are fewer, or if
    they are not the run's last `n` saves: an old best checkpoint that rotation kept (`_best_kept_by_rotation`).

    Incomplete checkpoints (an interrupted save, a truncated file) are skipped with a warning naming them, and so,
    given a run's `identity` (its `run_identity.json`), are checkpoints that record another run's.

    With `at_most=True` (a run averaging its own checkpoints at its end: it averages what it has) neither is an
    error: fewer checkpoints are taken with a warning, none at all is an empty list, and an old best kept by
    rotation is left out with those before it, with a warning."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    checkpoints = complete_checkpoints(checkpoint_dir)
    if identity is not None:
        checkpoints = [checkpoint for checkpoint in checkpoints if _same_run(checkpoint, identity)]
    last = checkpoints[-n:]
    if len(last) < n:
        names = [path.name for path in checkpoints]
        if not at_most:
            itself = " (it is itself a checkpoint: give the run's directory, which holds it)"
            raise ValueError(
                f"Asked for the last {n} checkpoints of {checkpoint_dir}, found {len(names)} complete: {names}"
                f"{itself if not checkpoints and CHECKPOINT_RE.match(Path(checkpoint_dir).name) else ''}."
            )
        logger.warning("Averaging the %d checkpoints in %s rather than %d", len(last), checkpoint_dir, n)
    kept = _best_kept_by_rotation(last) if last else None
    if kept is not None:
        best, following, save_steps = kept
        newer = len(last) - 1 - last.index(best)
        problem = (
            f"{best} is not one of the last {n} saves: the Trainer's rotation (save_total_limit) kept it as the "
            f"run's best checkpoint (best_model_checkpoint in {last[-1].name}/{TRAINER_STATE_NAME}) and deleted "
            f"the saves of the {checkpoint_step(following) - checkpoint_step(best)} updates up to {following.name} "
            f"(saves every {save_steps})"
        )
        if not at_most:
            raise ValueError(f"{problem}: average the last {newer} at most, or name the checkpoints to average")
        logger.warning("%s: averaging the last %d only", problem, newer)
        last = last[last.index(best) + 1 :]
    return last


def _same_run(checkpoint: Path, identity: Mapping[str, Any]) -> bool:
    """Whether `checkpoint` is of the run `identity` describes; one that records no identity is taken as such."""
    recorded = read_run_identity(checkpoint)
    if recorded is not None and identity_differences(recorded, identity):
        logger.warning("Not averaging %s: it belongs to another run", checkpoint)
        return False
    return True


def named_checkpoints(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The checkpoints (or model directories) named, each complete: an incomplete one is refused saying what is
    missing, not skipped as `average_checkpoints` skips those it finds."""
    checkpoints = [Path(path) for path in paths]
    for checkpoint in checkpoints:
        if not checkpoint.exists():
            raise IncompleteCheckpointError(f"{checkpoint} does not exist")
        if not checkpoint.is_dir():
            raise IncompleteCheckpointError(f"{checkpoint} is not a directory")
        if held := list_checkpoints(checkpoint):
            # its final model, averaged alone (a copy) or counted beside its own checkpoints, without a word
            raise ValueError(
                f"{checkpoint} is a run's directory, not a checkpoint: name its checkpoints ({held[-1]}, ...), or "
                f"average its last N (--checkpoint-dir {checkpoint} --last N)"
            )
        if problems := checkpoint_problems(checkpoint, training_state=False):
            raise IncompleteCheckpointError(f"{checkpoint} is incomplete: {describe_problems(problems)}")
    return checkpoints


def _best_kept_by_rotation(checkpoints: Sequence[Path]) -> tuple[Path, Path, int] | None:
    """(best, the checkpoint after it, save_steps) when the run's best checkpoint is among `checkpoints` only
    because transformers' rotation kept it: with `metric_for_best_model` set, rotation deletes the oldest
    checkpoints but the best, so an early best stays before the newest ones with the saves between them deleted.

    With `save_strategy="steps"` saves come every `save_steps` updates or closer (a preemption's, a timed one, the
    last update's in between): a longer gap after the best is saves that rotation deleted. The strategy is read
    from the newest checkpoint (this project's `checkpoint_complete.json`, or the Trainer's `training_args.bin`
    read without running its pickle); where neither tells it, such a gap that is also longer than the others is
    only warned of. Other strategies save at epochs or at new bests, at no fixed distance. None when the run
    records no best."""
    newest = checkpoints[-1]
    try:
        state = json.loads((newest / TRAINER_STATE_NAME).read_text(encoding="utf-8"))
        best_name, save_steps = Path(state["best_model_checkpoint"]).name, int(state["save_steps"])
    except (OSError, ValueError, KeyError, TypeError):  # no state, no best recorded: nothing was kept for it
        return None
    names = [path.name for path in checkpoints]
    if best_name not in names[:-1] or save_steps < 1:
        return None
    steps = [checkpoint_step(path) for path in checkpoints]
    position = names.index(best_name)
    gaps = [later - earlier for earlier, later in zip(steps, steps[1:], strict=False)]
    after_best = gaps.pop(position)
    kept = checkpoints[position], checkpoints[position + 1], save_steps
    strategy = _save_strategy(newest)
    if strategy == "steps":
        return kept if after_best > save_steps else None
    if strategy is None and after_best > max([save_steps, *gaps]):
        logger.warning(
            "%s, the run's best checkpoint, is %d updates before %s where saves came every %d: if save_total_limit "
            "deleted the saves between them, it is not one of the last saves",
            kept[0],
            after_best,
            kept[1].name,
            save_steps,
        )
    return None


def _save_strategy(checkpoint: Path) -> str | None:
    """The run's `save_strategy` ("steps", "epoch", "best", "no"): recorded by this project's trainer in the
    completeness marker, else found in the Trainer's pickled arguments; None where neither says."""
    recorded = marker_record(checkpoint).get("save_strategy")
    if recorded is not None:
        return str(recorded)
    strategy = (saved_training_arguments(checkpoint) or {}).get("save_strategy")
    return None if strategy is None else str(strategy)


def _removed_while_averaging(path: Path) -> FileNotFoundError:
    return removed_by_rotation(str(path), "the checkpoints were averaged", "average again, or once the run has ended")


def _load_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    weights = {}
    files = weight_files(checkpoint) if checkpoint.is_dir() else []
    if not files:  # it was complete when listed
        raise _removed_while_averaging(checkpoint)
    for path in files:
        try:
            with safe_open(path, framework="pt") as shard:
                weights.update({name: shard.get_tensor(name) for name in shard.keys()})
        except FileNotFoundError:
            raise _removed_while_averaging(path) from None
        except Exception as error:  # safetensors' own errors are not OSErrors
            raise ValueError(f"Cannot read the weights {path}: {error}") from error
    return weights


def _check_finite(weights: dict[str, torch.Tensor], checkpoint: Path) -> None:
    """A checkpoint of a run that diverged (saved before training stopped on it, or by an fp16 run whose scaler gave
    up) would make every averaged weight NaN."""
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not tensor.isfinite().all():
            raise ValueError(
                f"{checkpoint}: {name} holds NaN or infinite values (its run had diverged): average checkpoints saved "
                "before it."
            )


def _check_compatible(layout: _Layout, weights: dict[str, torch.Tensor], checkpoint: Path) -> None:
    if weights.keys() != layout.keys():
        difference = sorted(weights.keys() ^ layout.keys())
        raise ValueError(f"{checkpoint} does not hold the same tensors as the others; differing: {difference[:10]}.")
    for name, tensor in weights.items():
        shape, dtype = layout[name]
        if tensor.shape != shape or tensor.dtype != dtype:
            raise ValueError(
                f"{checkpoint}: {name} is {tuple(tensor.shape)} {tensor.dtype}, elsewhere {tuple(shape)} {dtype}."
            )


def _add_checkpoint(
    checkpoint: Path, sums: dict[str, torch.Tensor], others: dict[str, torch.Tensor], layout: _Layout
) -> None:
    """Add the checkpoint's floating-point tensors to their float64 `sums`, check its other tensors equal to
    `others` and every tensor's shape and dtype to `layout` (filling them from the first checkpoint). It is let go
    before the next one loads: memory holds one checkpoint and the sums (the first checkpoint was kept to the end
    beside them, and each one until the next had loaded: 5 times a model's size at the peak, not 3)."""
    weights = _load_weights(checkpoint)
    _check_finite(weights, checkpoint)
    if layout:
        _check_compatible(layout, weights, checkpoint)
    else:
        layout.update({name: (tensor.shape, tensor.dtype) for name, tensor in weights.items()})
    while weights:
        name, tensor = weights.popitem()  # each tensor let go once added
        if not tensor.is_floating_point():
            if not torch.equal(others.setdefault(name, tensor), tensor):
                raise ValueError(f"{checkpoint}: the non-float tensor {name} differs from the other checkpoints'.")
        elif name in sums:
            sums[name] += tensor  # float64 += float32 converts exactly, as tensor.double() did, without the copy
        else:
            sums[name] = tensor.double()


def _newest(checkpoints: Sequence[Path]) -> Path:
    """The checkpoint with the highest step; the last one given when names carry no step."""
    if all(CHECKPOINT_RE.match(path.name) for path in checkpoints):
        return max(checkpoints, key=checkpoint_step)
    return checkpoints[-1]


def _warn_of_other_generation_configs(checkpoints: Sequence[Path], newest: Path) -> None:
    """Warn of a checkpoint whose generation config differs from the newest's, which alone the average takes: a
    user's edit of an older one (its beam size, length penalty) was dropped without a word."""
    kept = newest / GENERATION_CONFIG_NAME
    if not kept.is_file():
        return
    settings = _generation_settings(kept)
    for checkpoint in checkpoints:
        path = checkpoint / GENERATION_CONFIG_NAME
        if checkpoint == newest or not path.is_file():
            continue
        other = _generation_settings(path)
        if differences := sorted(key for key in settings.keys() | other.keys() if settings.get(key) != other.get(key)):
            logger.warning(
                "%s differs from %s's in %s: the average decodes with the newest checkpoint's",
                path,
                newest.name,
                ", ".join(differences),
            )


def _generation_settings(path: Path) -> dict[str, Any]:
    """A generation config's settings: without the version of transformers that wrote it, which decodes nothing."""
    return {key: value for key, value in read_json(path).items() if key != "transformers_version"}


def _relative(checkpoint: Path, output_dir: Path) -> str:
    """`checkpoint` as the record of an average in `output_dir` names it: relative to that directory (the record
    travels with the averaged model, to the Hub too, where the writer's absolute paths have no business)."""
    try:
        return os.path.relpath(checkpoint.resolve(), output_dir.resolve())
    except ValueError:  # another drive (Windows): no relative path
        return checkpoint.name


def usable_checkpoints(checkpoint_paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The complete checkpoints among `checkpoint_paths` (others skipped with a warning naming them), checked to
    belong to one run: two that differ in config, tokenizer or run identity are refused, both named, and so are a
    checkpoint given twice (it would weigh double) and one that no longer exists (removed since it was chosen)."""
    usable = []
    seen: dict[Path, Path] = {}
    for path in map(Path, checkpoint_paths):
        if (earlier := seen.setdefault(path.resolve(), path)) is not path:
            raise ValueError(f"{path} is given twice ({earlier} is the same directory): it would weigh double")
        if not path.exists():  # chosen, then rotated out: skipped, `--last 5` averaged 4 and named 5 as averaged
            raise _removed_while_averaging(path)
        problems = checkpoint_problems(path, training_state=False)
        if problems:
            logger.warning("Not averaging the incomplete checkpoint %s: %s", path, describe_problems(problems))
        else:
            usable.append(path)
    pairs = list(zip(usable, usable[1:], strict=False))
    # each neighbour alike was not all alike: one recording no run identity, between two of different runs, passed
    recording = [path for path in usable if read_run_identity(path) is not None]
    pairs += [(recording[0], path) for path in recording[1:] if (recording[0], path) not in pairs]
    for first, second in pairs:
        differences = model_differences(first, second)
        if differences:
            raise RunMismatchError(
                f"{first} and {second} are not checkpoints of one run, they differ in {', '.join(differences[:8])}:"
                " average checkpoints of one run only."
            )
    return usable


def average_checkpoints(checkpoint_paths: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the element-wise mean of the checkpoints' weights to `output_dir`, a directory `from_pretrained` loads.

    Floating-point tensors are summed in float64 and cast back to their dtype; other tensors (integer buffers) must
    be equal and are kept. Everything else of the newest checkpoint is copied (config, generation config, tokenizer
    files, remote code, run identity), but not its optimizer, scheduler or Trainer state.
    `checkpoint_averaging.json` records the checkpoints averaged, relative to `output_dir`. Incomplete checkpoints
    are skipped with a warning; checkpoints of different runs are refused (`usable_checkpoints`). `output_dir` is
    built aside and swapped into place whole: a failure leaves the old one intact; only a previous average (or an
    empty directory) is ever replaced, never a run's directory given by mistake. Returns `output_dir`.
    """
    if not checkpoint_paths:
        raise ValueError("No checkpoints to average.")
    output_dir = Path(output_dir)
    if any(output_dir.resolve() == Path(checkpoint).resolve() for checkpoint in checkpoint_paths):
        raise ValueError(f"The output directory {output_dir} is one of the checkpoints to average.")
    check_replaceable(output_dir, AVERAGING_RECORD_NAME, REPLACEABLE)  # before the averaging's work
    checkpoints = usable_checkpoints(checkpoint_paths)
    if not checkpoints:
        raise ValueError(f"None of the checkpoints to average is complete: {[str(p) for p in checkpoint_paths]}.")
    newest = _newest(checkpoints)
    _warn_of_other_generation_configs(checkpoints, newest)

    sums: dict[str, torch.Tensor] = {}
    others: dict[str, torch.Tensor] = {}
    layout: _Layout = {}
    for checkpoint in checkpoints:
        _add_checkpoint(checkpoint, sums, others, layout)
    averaged = {  # each sum let go once divided
        name: others[name] if name in others else sums.pop(name).div_(len(checkpoints)).to(dtype)
        for name, (_, dtype) in layout.items()
    }

    with replacing_directory(output_dir, AVERAGING_RECORD_NAME, REPLACEABLE, regenerated=MODEL_CARD_FILES) as staging:
        try:
            for path in newest.iterdir():
                copied = path.name not in _NOT_COPIED and not PICKLED_STATE_RE.match(path.name)
                if path.is_file() and path.suffix != ".safetensors" and copied:
                    # the content only: copy2's permissions were the checkpoint's (0666 from a run under a umask of
                    # 000, remote code among them), where every file written here has those this user's umask gives
                    shutil.copyfile(path, staging / path.name)
        except FileNotFoundError:
            raise _removed_while_averaging(newest) from None
        if not newest.is_dir():  # rotated out once listed: its files, no longer there, were skipped as not files
            raise _removed_while_averaging(newest)
        contiguous = {name: tensor.contiguous() for name, tensor in averaged.items()}
        save_file(contiguous, staging / WEIGHTS_NAME, metadata={"format": "pt"})  # "pt": what from_pretrained expects
        record = {
            "checkpoints": [_relative(path, output_dir) for path in checkpoints],
            "configuration_from": _relative(newest, output_dir),
        }
        write_json(staging / AVERAGING_RECORD_NAME, record)
    return output_dir


__all__ = [
    "average_checkpoints",
    "last_checkpoints",
    "named_checkpoints",
    "list_checkpoints",
    "checkpoint_step",
    "usable_checkpoints",
]
