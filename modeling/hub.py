"""Pushing a saved model directory to the Hugging Face Hub, by hand (`scripts/push_to_hub.py`) or at the end of
training (`modeling.training.train` with `push_to_hub`), with this project's model card (`modeling.model_card`).

Before any upload the directory is checked whole: the files a repo needs, every safetensors file read tensor by
tensor and every JSON parsed, so that a truncated `model.safetensors` is refused, named, rather than published.

Every Hub request goes through `modeling.hub_client`: a timeout, retries on transient failures, and `HubError`,
one line naming the URL and the cause.
"""

import glob
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from huggingface_hub import HfApi, get_token
from huggingface_hub.utils import validate_repo_id
from safetensors import safe_open
from transformers import AutoTokenizer, TrainingArguments

from .checkpoints import (
    CURVES_FILE,
    DATA_STATS_FILE,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_FILE,
    VOCABULARY_FILES,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    index_shards,
    list_checkpoints,
    named_if_removed,
    removed_by_rotation,
    safetensors_problem,
)
from .export.common import refuse_an_export
from .files import read_json, require_directory, sole_writer
from .hub_client import hub_call
from .model_card import EVAL_RESULTS_GLOB, write_model_card
from .tokenization import missing_tokenizer_files

logger = logging.getLogger(__name__)

# The remote-code files that config.json's auto_map names; the siblings they import come with them (see
# `_missing_siblings`): a model saved by an older release of this project holds the siblings its own code imports.
AUTO_MAP_CODE_FILES = ("configuration_transformer.py", "modeling_transformer.py")

# Files a repo needs so that `from_pretrained(repo_id, trust_remote_code=True)` works without this package.
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", *AUTO_MAP_CODE_FILES)
# What a push uploads: the top-level weights, configs, code, tokenizer, card and figures; never pickles,
# optimizer states or checkpoint subdirectories (fnmatch's "*" also matches "/", hence the ignore pattern). "*.spm":
# a MarianTokenizer's source.spm and target.spm (a fine-tuned MarianMT model keeps its tokenizer).
UPLOAD_PATTERNS = ("*.safetensors", "*.json", "*.py", "*.md", "*.png", "*.txt", "*.model", "*.spm")
IGNORE_PATTERNS = ("*/*",)


class MissingHubTokenError(PermissionError):
    """Raised before any network call when a push has no Hugging Face token."""


def resolve_token(token: str | None = None) -> str:
    """The token to push with: the argument, else `HF_TOKEN`, else the one saved by `hf auth login`."""
    token = token or get_token()
    if not token:
        raise MissingHubTokenError(
            "No Hugging Face token found: set the HF_TOKEN environment variable to a token with write access "
            "(https://huggingface.co/settings/tokens) or run `hf auth login`, then push again."
        )
    return token


def check_model_dir(model_dir: str | Path) -> Path:
    """Refuse a directory that would give an unusable repo: missing weights, remote code or tokenizer."""
    model_dir = require_directory(model_dir, "Model directory")
    refuse_an_export(model_dir)
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()] + _missing_siblings(model_dir)
    missing += _missing_tokenizer_code(model_dir) + _missing_shards(model_dir)
    if not any(model_dir.glob("*.safetensors")):
        missing.append("*.safetensors")
    if "config.json" in missing and (held := list_checkpoints(model_dir)):
        # a run still training, whose final model is saved at its end: no save_pretrained advice applies
        raise FileNotFoundError(
            f"{model_dir} lacks {', '.join(missing)}: a training run's directory, its final model not saved yet. "
            f"Push one of its checkpoints ({held[-1]}), or the directory once the run has ended."
        )
    if missing:
        raise FileNotFoundError(
            f"{model_dir} lacks {', '.join(missing)}. Save the model with `import modeling` done first "
            "(so that save_pretrained copies the remote code and writes auto_map) and save the tokenizer "
            "into the same directory."
        )
    _check_one_set_of_weights(model_dir)
    verify_model_files(model_dir)
    if "auto_map" not in read_json(model_dir / "config.json"):
        raise ValueError(f"{model_dir}/config.json has no auto_map: save the model with `import modeling` done.")
    _check_tokenizer(model_dir)
    return model_dir


def _missing_tokenizer_code(model_dir: Path) -> list[str]:
    """The code files that tokenizer_config.json's auto_map names (a converted fairseq model's tokenizer) and that
    are not there: `_missing_siblings` only sees the files present, and loading would fail on the Hub's side."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return []  # named by REQUIRED_FILES
    try:
        auto_map = read_json(path).get("auto_map") or {}
    except (AttributeError, ValueError):
        return []  # verify_model_files names a JSON that does not parse
    references = auto_map.get("AutoTokenizer", []) if isinstance(auto_map, dict) else auto_map
    references = [references] if isinstance(references, str) else references
    # "module.Class", or "other/repo--module.Class" for code kept in another repo (not ours to check)
    modules = {ref.rsplit(".", 1)[0] for ref in references if isinstance(ref, str) and "--" not in ref}
    return [
        f"{name}.py (named by tokenizer_config.json's auto_map)"
        for name in sorted(modules)
        if not (model_dir / f"{name}.py").is_file()
    ]


def _missing_shards(model_dir: Path) -> list[str]:
    """The shards that `model.safetensors.index.json` maps weights to and that are not there: each remaining shard
    reads well, so only the index tells that weights are missing."""
    index = model_dir / "model.safetensors.index.json"
    if not index.is_file():
        return []
    try:
        shards = index_shards(index)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:  # cut short, or not a text file
        raise ValueError(f"{index} does not parse ({error}): refusing to push it.") from None
    except ValueError as error:  # parses, but maps no tensors to file names
        raise ValueError(f"{error}: refusing to push it.") from None
    return [f"{name} (named by {index.name})" for name in shards if not (model_dir / name).is_file()]


def _check_one_set_of_weights(model_dir: Path) -> None:
    """Refuse a directory holding both a `model.safetensors` and a sharded index: `save_pretrained` with shards
    leaves an earlier single file in place (it deletes earlier shards only), and `from_pretrained` loads the single
    file and ignores the index, so the repo would serve the earlier weights."""
    single, index = model_dir / WEIGHTS_NAME, model_dir / WEIGHTS_INDEX_NAME
    if single.is_file() and index.is_file():
        newer = max((single, index), key=lambda path: path.stat().st_mtime)
        raise ValueError(
            f"{model_dir} holds both {single.name} and {index.name}: the weights of two saves, of which "
            f"from_pretrained loads {single.name} only. Delete the earlier save's weights (the newer file is "
            f"{newer.name}), then push again."
        )


def _check_tokenizer(model_dir: Path) -> None:
    """Load the tokenizer as a user of the repo would; refuse it when it does not load (missing vocabulary files
    name themselves) or when it has more tokens than the model's vocabulary (another model's tokenizer: its ids
    would index the wrong embeddings, or none)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    except Exception as error:  # tokenizers fail with anything from OSError to TypeError on missing files
        missing = missing_tokenizer_files(model_dir)
        cause = ", ".join(f"{name} is missing" for name in missing) if missing else " ".join(str(error).split())
        raise ValueError(f"{model_dir}: its tokenizer cannot be loaded: {cause}. Save the tokenizer again.") from None
    vocab_size = read_json(model_dir / "config.json").get("vocab_size")
    if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
        raise ValueError(
            f"{model_dir}: its tokenizer has {len(tokenizer)} tokens, more than config.json's vocab_size "
            f"{vocab_size}: it is not this model's tokenizer. Save the model's own tokenizer there."
        )


def _missing_siblings(model_dir: Path) -> list[str]:
    """The files that the directory's remote code imports from beside itself (`from .name import ...`, as
    transformers' loader follows them) and that are not there, each with the file importing it."""
    missing = []
    for code in sorted(model_dir.glob("*.py")):
        for name in re.findall(r"^\s*from \.(\w+) import", code.read_text(encoding="utf-8"), flags=re.MULTILINE):
            if not (model_dir / f"{name}.py").is_file():
                missing.append(f"{name}.py (imported by {code.name})")
    return missing


def verify_model_files(model_dir: str | Path) -> None:
    """Read what a push would upload: every safetensors file, tensor by tensor, and every JSON file; a truncated
    or corrupt one is refused, named, and so are weights holding NaN or infinite values."""
    model_dir = Path(model_dir)
    for path in sorted(model_dir.glob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem is None:
            try:
                with safe_open(path, framework="pt") as weights:
                    diverged = [
                        name
                        for name in weights.keys()
                        if (tensor := weights.get_tensor(name)).is_floating_point() and not tensor.isfinite().all()
                    ]
            except Exception as error:  # safetensors' errors are not OSErrors
                problem = f"{path.name} cannot be read ({error})"
            else:
                if diverged:
                    raise ValueError(
                        f"{path}: {diverged[0]} holds NaN or infinite values (its run had diverged): refusing to push "
                        "it."
                    )
        if problem is not None:
            raise ValueError(f"{model_dir}: {problem}: refusing to push it. Save the model again.")
    for path in sorted(model_dir.glob("*.json")):
        try:
            read_json(path)
        except ValueError as error:
            raise ValueError(f"{error}: refusing to push it.") from None


def _check_token_not_in_files(model_dir: Path, token: str) -> None:
    # Bytes, not text: a user's notes in Latin-1 are theirs to keep, and the ASCII token's bytes are the same in
    # every ASCII-compatible encoding.
    for path in model_dir.iterdir():
        if path.is_file() and path.suffix in {".json", ".md", ".py", ".txt"} and token.encode() in path.read_bytes():
            raise ValueError(f"{path} contains the Hugging Face token: remove it before pushing.")


def push_model_dir(
    model_dir: str | Path,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload Transformer (Vaswani et al., 2017) translation model",
    verify: bool = True,
) -> str:
    """Create `repo_id` if needed and upload the model directory to it; return the repo URL.

    Uploads weights, config (with auto_map), the remote-code files (a converted fairseq model's tokenizer code
    among them), tokenizer, generation config, card and figures; pickles, optimizer states and checkpoint
    subdirectories are left out. The repo's top-level files of those kinds that the directory does not hold (an
    earlier model's) are deleted in the same commit (`_stale_repo_files`). `upload_folder` has the Hub validate the
    card's metadata (`/api/validate-yaml`) before uploading anything. The directory is checked first
    (`check_model_dir`; `verify=False` when the caller just did). Hub failures raise `HubError`.
    """
    model_dir = check_model_dir(model_dir) if verify else Path(model_dir)
    token = resolve_token(token)
    _check_token_not_in_files(model_dir, token)
    api = HfApi(token=token)
    repo_url = hub_call(api.create_repo, repo_id, private=private, exist_ok=True, repo_type="model")
    ignore_patterns = list(IGNORE_PATTERNS)  # a fresh list: upload_folder extends it in place
    card = model_dir / "README.md"
    if card.is_file() and CURVES_FILE.encode() not in card.read_bytes():
        # Curves that the card does not show are an earlier card's: left out of the upload rather than deleted
        # here (the file may be the user's); an earlier push's copy leaves the repo with the other stale files.
        ignore_patterns.append(CURVES_FILE)
    removed = removed_by_rotation(
        str(model_dir), "it was pushed", "the repo is unchanged; push a checkpoint the run keeps, or a copy."
    )
    with named_if_removed(model_dir, removed):
        stale = _stale_repo_files(api, repo_url.repo_id, _uploaded_names(model_dir, ignore_patterns))
        if stale:
            logger.warning(
                "Deleting from %s the files of its previous model that this push does not replace: %s",
                repo_url.repo_id,
                ", ".join(stale),
            )
        hub_call(
            api.upload_folder,
            repo_id=repo_url.repo_id,
            folder_path=model_dir,
            allow_patterns=list(UPLOAD_PATTERNS),
            ignore_patterns=ignore_patterns,
            delete_patterns=[glob.escape(name) for name in stale] or None,
            commit_message=commit_message,
        )
    return str(repo_url)


def _uploaded_names(model_dir: Path, ignore_patterns: list[str]) -> set[str]:
    """The names of the top-level files that `upload_folder` uploads from `model_dir` with these patterns."""
    return {
        path.name
        for path in model_dir.iterdir()
        if path.is_file()
        and any(fnmatch(path.name, pattern) for pattern in UPLOAD_PATTERNS)
        and not any(fnmatch(path.name, pattern) for pattern in ignore_patterns)
    }


# The project's remote-code modules, which save_pretrained copies into a model directory (the model's, and a
# converted fairseq model's tokenizer): an earlier model's copies are the only `.py` files a push deletes (a user's
# own example.py stays).
REMOTE_CODE_MODULES = frozenset(
    path.name
    for path in Path(__file__).parent.glob("*.py")
    if path.stem.endswith("_transformer") or path.stem.startswith("tokenization_")
)


# Weights of the other formats that transformers loads (`use_safetensors=False`, TensorFlow, Flax), single or
# sharded: a push never uploads them, so an earlier model's stayed beside the new safetensors and were loaded instead.
OTHER_WEIGHTS_PATTERNS = ("pytorch_model*.bin", "tf_model*.h5", "flax_model*.msgpack")


def _is_model_file(name: str) -> bool:
    """Whether a repo's top-level file is of what a model directory is made of, which loading reads or which
    describes the model: weights (any format), JSON (configs, tokenizer files, records, scores), a tokenizer's
    vocabulary, the project's remote code, the card's curves. Not a user's own pages, figures, notes or code."""
    return (
        fnmatch(name, "*.safetensors")
        or any(fnmatch(name, pattern) for pattern in OTHER_WEIGHTS_PATTERNS)
        or fnmatch(name, "*.json")
        or fnmatch(name, "*.model")
        or name in VOCABULARY_FILES
        or name in REMOTE_CODE_MODULES
        or name == CURVES_FILE
    )


def _stale_repo_files(api: HfApi, repo_id: str, uploaded: set[str]) -> list[str]:
    """The repo's top-level model files (`_is_model_file`) that this push does not replace: an earlier model's,
    deleted in the push's commit. Left in place, they describe or even are another model: a `model.safetensors`
    beside a new sharded index is what `from_pretrained` loads, and an earlier conversion's record, scores or
    tokenizer files would stand beside the new model. Subfolders (a user's exports) stay, and so do a user's own
    pages, figures, notes and code (`USAGE.md`, `requirements.txt`, `example.py`), which no loading reads."""
    return sorted(
        name
        for name in hub_call(api.list_repo_files, repo_id)
        if "/" not in name and name not in uploaded and _is_model_file(name)
    )


def full_repo_id(repo_id: str, token: str) -> str:
    """`repo_id` validated (`HFValidationError`, a ValueError), with the token owner's namespace when it has none:
    the Hub puts the repo there, and the model card must name it as users will load it."""
    validate_repo_id(repo_id)
    if "/" not in repo_id:
        repo_id = f"{hub_call(HfApi(token=token).whoami)['name']}/{repo_id}"
    return repo_id


# --- pushing at the end of training -------------------------------------------------------------------------


@dataclass(frozen=True)
class HubTarget:
    """The repo to push to, and the token checked before training (kept out of reprs and logs)."""

    repo_id: str
    token: str = field(repr=False)


def prepare_push(training_args: TrainingArguments) -> HubTarget | None:
    """Before training, on the main process: the token and the repo of the push at the end, checked now.

    A push that cannot happen (no token: `MissingHubTokenError`; an invalid repo name; a revision; no right to
    create the repo) fails here rather than after the whole run. The repo is `hub_model_id`, else output_dir's name
    as the Trainer names it; a name without namespace gets the token owner's (asked of the Hub now), which the model
    card needs. Returns None without `push_to_hub`, and on the other processes (only the main one pushes).
    """
    if not training_args.push_to_hub:
        return None
    if training_args.hub_revision is not None:
        raise ValueError("The push at the end of training goes to the main branch: --hub_revision is not supported.")
    if training_args.process_index != 0:
        return None
    token = resolve_token(training_args.hub_token)  # the argument, else HF_TOKEN, else `hf auth login`
    repo_id = full_repo_id(training_args.hub_model_id or Path(training_args.output_dir).absolute().name, token)
    api = HfApi(token=token)
    # Creating the repo now proves the token may write there, before hours of training rather than after.
    private = bool(training_args.hub_private_repo)
    hub_call(api.create_repo, repo_id, private=private, exist_ok=True, repo_type="model")
    if training_args.hub_strategy in ("checkpoint", "all_checkpoints"):
        logger.warning("hub_strategy=%s is not used: checkpoints are not pushed.", training_args.hub_strategy.value)
    logger.info("The model will be pushed to %s at the end of training", repo_id)
    return HubTarget(repo_id, token)


def stage_card_inputs(model_dir: Path, output_dir: Path, staging: Path) -> None:
    """Copy what the card is rendered from into `staging`: the run's records (output_dir), and evaluation JSONs of
    `model_dir` (in it or in its `eval/`, where `scripts/evaluate.py --output-dir` usually puts them).

    Only `model_dir`'s own are searched: those of the final model never describe the averaged one. An evaluation
    JSON older than the weights scored an earlier model (a previous run in this output_dir): it is left out of the
    card with a warning.
    """
    for name in (TRAINER_STATE_NAME, TRAINING_ARGS_FILE, DATA_STATS_FILE):
        if (output_dir / name).is_file():
            shutil.copy(output_dir / name, staging / name)
    weights_time = min(path.stat().st_mtime for path in model_dir.glob("*.safetensors"))
    found = sorted(path for directory in (model_dir, model_dir / "eval") for path in directory.glob(EVAL_RESULTS_GLOB))
    fresh = [path for path in found if path.stat().st_mtime >= weights_time]
    stale = [str(path) for path in found if path not in fresh]
    if stale:
        logger.warning(
            "Left out of the model card, older than the weights of %s: %s. Evaluate this model with "
            "scripts/evaluate.py and push again with scripts/push_to_hub.py --card-from to add its scores.",
            model_dir,
            ", ".join(stale),
        )
    for index, path in enumerate(fresh):  # distinct names: eval/ may hold a file of the same name
        shutil.copy(path, staging / f"eval_results_{index}_{path.name.removeprefix('eval_results_')}")


def push_trained_model(
    target: HubTarget, model_dir: Path, output_dir: Path, description: str, private: bool | None
) -> str:
    """Write the model card into `model_dir` and push it as `scripts/push_to_hub.py` does (no other process
    replacing `model_dir` meanwhile: `sole_writer`); return the repo URL."""
    with sole_writer(model_dir):
        check_model_dir(model_dir)
        with tempfile.TemporaryDirectory() as staging:
            stage_card_inputs(model_dir, output_dir, Path(staging))
            card = write_model_card(model_dir, repo_id=target.repo_id, card_from=[staging])
        logger.info("Pushing %s (%s, model card %s) to %s", description, model_dir, card, target.repo_id)
        try:
            url = push_model_dir(model_dir, target.repo_id, token=target.token, private=bool(private), verify=False)
        except Exception:
            logger.error(
                "The push failed; the model is saved. Retry with: python scripts/push_to_hub.py --model %s --repo-id "
                "%s",
                model_dir,
                target.repo_id,
            )
            raise
    logger.info("Pushed %s to %s", model_dir, url)
    return url
