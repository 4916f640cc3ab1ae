"""Checkpoint averaging (Vaswani et al. 2017, Sec. 6.1).

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were written at
10-minute intervals. For the big models, we averaged the last 20 checkpoints." Averaging the weights of nearby
points of one training run smooths out the noise of the last updates, for free at inference time.

Works on the checkpoint directories the Trainer writes (`checkpoint-<step>/model.safetensors`, or sharded with
`model.safetensors.index.json`), one checkpoint at a time, so memory holds one model plus the float64 sums. Weights
tied to others are stored once by `save_pretrained` and therefore averaged once; `from_pretrained` ties them again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
AVERAGING_RECORD_NAME = "checkpoint_averaging.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Trainer state that belongs to one point of training, not to the averaged model.
_TRAINING_STATE_RE = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|trainer_state\.json|training_args\.bin|rng_state(_\d+)?\.pth)$"
)


def checkpoint_step(path: str | os.PathLike) -> int:
    """The update number of a Trainer checkpoint directory `.../checkpoint-<step>`."""
    match = _CHECKPOINT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a Trainer checkpoint directory (checkpoint-<step>).")
    return int(match[1])


def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[Path]:
    """Every `checkpoint-<step>` directory in `checkpoint_dir`, by step number (checkpoint-900 before -1000)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise FileNotFoundError(f"Checkpoint directory {checkpoint_dir} does not exist.")
    found = [path for path in checkpoint_dir.iterdir() if path.is_dir() and _CHECKPOINT_RE.match(path.name)]
    return sorted(found, key=checkpoint_step)


def last_checkpoints(checkpoint_dir: str | os.PathLike, n: int) -> list[Path]:
    """The `n` newest checkpoints of `checkpoint_dir`, oldest first; an error if there are fewer."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    checkpoints = list_checkpoints(checkpoint_dir)
    if len(checkpoints) < n:
        names = [path.name for path in checkpoints]
        raise ValueError(f"Asked for the last {n} checkpoints of {checkpoint_dir}, found {len(names)}: {names}.")
    return checkpoints[-n:]


def _weight_files(checkpoint: Path) -> list[Path]:
    index = checkpoint / WEIGHTS_INDEX_NAME
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [checkpoint / shard for shard in shards]
    if (checkpoint / WEIGHTS_NAME).is_file():
        return [checkpoint / WEIGHTS_NAME]
    raise FileNotFoundError(f"{checkpoint} holds neither {WEIGHTS_NAME} nor {WEIGHTS_INDEX_NAME}.")


def _load_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    weights = {}
    for path in _weight_files(checkpoint):
        with safe_open(path, framework="pt") as shard:
            weights.update({name: shard.get_tensor(name) for name in shard.keys()})
    return weights


def _check_compatible(reference: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], checkpoint: Path) -> None:
    if weights.keys() != reference.keys():
        difference = sorted(weights.keys() ^ reference.keys())
        raise ValueError(f"{checkpoint} does not hold the same tensors as the others; differing: {difference[:10]}.")
    for name, tensor in weights.items():
        if tensor.shape != reference[name].shape or tensor.dtype != reference[name].dtype:
            raise ValueError(
                f"{checkpoint}: {name} is {tuple(tensor.shape)} {tensor.dtype}, elsewhere "
                f"{tuple(reference[name].shape)} {reference[name].dtype}."
            )


def _newest(checkpoints: Sequence[Path]) -> Path:
    """The checkpoint with the highest step; the last one given when names carry no step."""
    if all(_CHECKPOINT_RE.match(path.name) for path in checkpoints):
        return max(checkpoints, key=checkpoint_step)
    return checkpoints[-1]


def average_checkpoints(checkpoint_paths: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> Path:
    """Write the element-wise mean of the checkpoints' weights to `output_dir`, a directory `from_pretrained` loads.

    Floating-point tensors are summed in float64 and cast back to their dtype; other tensors (integer buffers) must
    be equal and are kept. Everything else of the newest checkpoint is copied (config, generation config, tokenizer
    files, remote code), but not its optimizer, scheduler or Trainer state. `checkpoint_averaging.json` records the
    checkpoints averaged. Returns `output_dir`.
    """
    checkpoints = [Path(path) for path in checkpoint_paths]
    if not checkpoints:
        raise ValueError("No checkpoints to average.")
    output_dir = Path(output_dir)
    if any(output_dir.resolve() == checkpoint.resolve() for checkpoint in checkpoints):
        raise ValueError(f"The output directory {output_dir} is one of the checkpoints to average.")

    reference: dict[str, torch.Tensor] = {}
    sums: dict[str, torch.Tensor] = {}
    for checkpoint in checkpoints:
        weights = _load_weights(checkpoint)
        if not reference:
            reference = weights
            sums = {name: tensor.double() for name, tensor in weights.items() if tensor.is_floating_point()}
            continue
        _check_compatible(reference, weights, checkpoint)
        for name, tensor in weights.items():
            if name in sums:
                sums[name] += tensor.double()
            elif not torch.equal(tensor, reference[name]):
                raise ValueError(f"{checkpoint}: the non-float tensor {name} differs from the other checkpoints'.")
    averaged = {
        name: (sums[name] / len(checkpoints)).to(tensor.dtype) if name in sums else tensor
        for name, tensor in reference.items()
    }

    output_dir.mkdir(parents=True, exist_ok=True)
    newest = _newest(checkpoints)
    for path in newest.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != WEIGHTS_INDEX_NAME:
            if not _TRAINING_STATE_RE.match(path.name):
                shutil.copy2(path, output_dir / path.name)
    contiguous = {name: tensor.contiguous() for name, tensor in averaged.items()}
    save_file(contiguous, output_dir / WEIGHTS_NAME, metadata={"format": "pt"})  # "pt": what from_pretrained expects
    record = {"checkpoints": [str(path) for path in checkpoints], "configuration_from": str(newest)}
    (output_dir / AVERAGING_RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return output_dir


__all__ = ["average_checkpoints", "last_checkpoints", "list_checkpoints", "checkpoint_step"]
