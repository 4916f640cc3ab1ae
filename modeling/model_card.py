"""The model card and its training curves, rendered from files that earlier steps wrote.

The card is rendered from files, never from numbers typed by hand: whatever is missing is shown as "not measured"
/ "not recorded". It carries `model-index` metadata with the BLEU results, which `Trainer.push_to_hub` cannot
produce for translation (its task table has no "translation"). The template ships inside the package
(`modeling/templates/model_card.md`), so an installed copy renders cards as a checkout does.

Files read from the `card_from` directories (any subset may be missing):
- `eval_results_{split}.json`: written by `scripts/evaluate.py` (`modeling.evaluation`), one per split;
- `trainer_state.json`: the Trainer's state, whose `log_history` gives the curves and the training length;
- `training_args.json`: training hyperparameters, e.g. `TrainingArguments.to_dict()` plus project extras;
- `data_stats.json`: data statistics (sentence counts, cleaning), any nesting of numbers and strings.

From the model directory itself: `config.json`, `generation_config.json` (the decoding the card describes, and
against which each evaluation's decoding is compared), the safetensors headers, `fairseq_conversion.json` when
the model was converted from fairseq (`modeling.fairseq.convert_fairseq`): the card then says where it came from;
`checkpoint_averaging.json` of an average (the card names the checkpoints averaged) and a checkpoint's
`trainer_state.json`: the run's log is shown up to the update the weights are of, not beyond.
"""

import contextlib
import dataclasses
import math
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from safetensors import safe_open
from transformers import GenerationConfig, Seq2SeqTrainingArguments

from .averaging import AVERAGING_RECORD_NAME
from .checkpoints import (
    CHECKPOINT_RE,
    CONVERSION_FILE,
    CURVES_FILE,
    DATA_STATS_FILE,
    MODEL_CARD_STAGING,
    RUN_IDENTITY_FILE,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_FILE,
    checkpoint_step,
    describe_differences,
    identity_differences,
    read_run_identity,
    weight_files,
    weights_record,
)
from .evaluation import DECODING_SETTINGS
from .files import atomic_path, fsync_path, read_json, remove_tree, require_directory
from .generation_transformer import set_paper_decoding, unset_decoding_defaults

DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "model_card.md"
EVAL_RESULTS_GLOB = "eval_results_*.json"
TRAINING_RECORDS = (TRAINER_STATE_NAME, TRAINING_ARGS_FILE, DATA_STATS_FILE)  # a run's, read from `card_from`
# What fairseq reports for its published WMT Transformers on newstest2014 (Ott et al., 2018; fairseq's README for
# examples/scaling_nmt): tokenised BLEU as the paper computes it (compounds split into German), and sacreBLEU.
FAIRSEQ_PUBLISHED_BLEU = (
    ("transformer.wmt16.en-de", "wmt16.en-de.joined-dict.transformer.tar.bz2", "en-de", 29.3, 28.6),
    ("transformer.wmt14.en-fr", "wmt14.en-fr.joined-dict.transformer.tar.bz2", "en-fr", 43.2, 41.4),
)


# Training hyperparameters worth a reader's attention, in display order; keys that are not the trainer's fields
# (project extras such as a token budget) are shown after them.
SHOWN_TRAINING_ARGS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "optim",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "label_smoothing_factor",
    "seed",
    "data_seed",
    "bf16",
    "fp16",
)
# The trainer's own fields, Seq2SeqTrainingArguments' among them (the validation's decoding, a sampler that token
# batching replaces), and the project's --overwrite_output_dir: not shown as extras, they say nothing of how the
# weights were trained.
_TRAINER_FIELDS = {field.name for field in dataclasses.fields(Seq2SeqTrainingArguments)} | {"overwrite_output_dir"}

# Shown as "Architecture" from config.json, with the paper's name for each setting.
ARCHITECTURE_FIELDS = (
    ("d_model", "d_model"),
    ("encoder_layers", "N (encoder layers)"),
    ("decoder_layers", "N (decoder layers)"),
    ("encoder_attention_heads", "h (encoder attention heads)"),
    ("decoder_attention_heads", "h (decoder attention heads)"),
    ("encoder_ffn_dim", "d_ff (encoder)"),
    ("decoder_ffn_dim", "d_ff (decoder)"),
    ("activation_function", "feed-forward activation"),
    ("dropout", "P_drop"),
    ("attention_dropout", "dropout on attention weights"),
    ("activation_dropout", "dropout after the activation"),
    ("vocab_size", "shared vocabulary"),
    ("positional_encoding_layout", "positional encoding layout"),
    ("positional_encoding_frequencies", "positional encoding frequencies"),
    ("positional_encoding_offset", "position of the first token"),
    ("scale_embedding", "embeddings scaled by sqrt(d_model)"),
    ("attention_bias", "biases on the attention projections"),
    ("layer_norm_eps", "layer norm epsilon"),
    ("tie_word_embeddings", "tied embeddings / pre-softmax projection"),
)

# (JSON key, model-index metric type, display name) for each score of an evaluation JSON.
CARD_METRICS = (
    ("sacrebleu", "bleu", "sacreBLEU"),
    ("paper_bleu", "bleu", "BLEU (tokenised as in the paper)"),
    ("tokenized_bleu_lc", "bleu", "BLEU (tokenised, lowercased)"),
    ("chrf", "chrf", "chrF"),
)

_EXAMPLE_SENTENCES = {
    "en": "The small dog sees a red ball.",
    "de": "Der kleine Hund sieht einen roten Ball.",
    "fr": "Le petit chien voit une balle rouge.",
}


# --- reading what earlier steps wrote -------------------------------------------------------------------------


def collect_card_inputs(directories: Iterable[str | Path], model_dir: str | Path | None = None) -> dict[str, Any]:
    """Gather evaluation results, trainer log history, training arguments and data statistics.

    Evaluation results accumulate over all directories, each distinct result once; for the other files the first
    directory that has one wins. Missing files simply leave their entry empty: the card then says the item was not
    measured. Each evaluation JSON is checked (`check_eval_result`), and with `model_dir` one that scored another
    local model directory, or weights `model_dir` no longer holds, is refused; so are training records of another
    run than `model_dir`'s (`run_identity.json`).
    """
    inputs: dict[str, Any] = {"eval_results": [], "log_history": None, "training_args": None, "data_stats": None}
    current_weights = None  # model_dir's weight files, hashed once for every result that records its own
    for directory in directories:
        directory = require_directory(directory, "Card input directory")
        for path in sorted(directory.glob(EVAL_RESULTS_GLOB)):
            result = check_eval_result(path, read_json(path), model_dir)
            if model_dir is not None and result.get("model_weights") is not None:
                current_weights = weights_record(model_dir) if current_weights is None else current_weights
                if result["model_weights"] != current_weights:
                    raise ValueError(
                        f"{path} scored other weights than {model_dir} holds now (trained, averaged or converted "
                        "again since): evaluate it again."
                    )
            elif model_dir is not None and _scored_dir(result) is not None and _weights_written_after(model_dir, path):
                # a result of scripts/evaluate.py before 2026-12-03: the model directory it scored, not the weights
                raise ValueError(
                    f"{path} does not record the weights it scored, and {model_dir}'s weights were written after it "
                    "(trained again or averaged since?): evaluate it again."
                )
            if result not in inputs["eval_results"]:  # the same file copied into two of the directories
                inputs["eval_results"].append(result)
        if model_dir is not None and any((directory / name).is_file() for name in TRAINING_RECORDS):
            _check_same_run(directory, model_dir)
        state = directory / TRAINER_STATE_NAME
        if inputs["log_history"] is None and state.is_file():
            inputs["log_history"] = check_log_history(state, read_record(state).get("log_history"))
        for key, name in (("training_args", TRAINING_ARGS_FILE), ("data_stats", DATA_STATS_FILE)):
            if inputs[key] is None and (directory / name).is_file():
                inputs[key] = read_record(directory / name)
        for key, example in (("language_pair", "en-de"), ("source_lang", "en"), ("target_lang", "de")):
            if not isinstance((inputs["data_stats"] or {}).get(key, ""), str):
                raise ValueError(f'{directory / DATA_STATS_FILE}: {key!r} is not a string such as "{example}".')
    return inputs


def read_record(path: Path) -> dict[str, Any]:
    """A JSON object a run recorded, read from `path`; anything else (edited by hand?) refused naming the file."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds a JSON {type(record).__name__}, not an object.")
    return record


# Numbers of the trainer's log that the card reads (`training_summary`, the curves' steps).
LOGGED_NUMBERS = ("step", "epoch", "loss", "updates_logged", "eval_loss", "train_runtime")


def check_log_history(path: Path, log_history: Any) -> list[dict[str, Any]] | None:
    """`trainer_state.json`'s `log_history` if the card can read it: a list of objects whose steps, epochs, losses
    and runtimes are numbers; else a ValueError naming the file and the entry."""
    if log_history is None:
        return None
    if not isinstance(log_history, list):
        raise ValueError(f"{path}: 'log_history' is a JSON {type(log_history).__name__}, not a list of log entries.")
    for index, entry in enumerate(log_history):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: log_history[{index}] is a JSON {type(entry).__name__}, not an object.")
        for key in LOGGED_NUMBERS:
            value = entry.get(key)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
                raise ValueError(f"{path}: log_history[{index}][{key!r}] is {value!r}, not a number.")
    return log_history


def _check_same_run(directory: Path, model_dir: str | Path) -> None:
    """Refuse training records (`TRAINING_RECORDS`) of another run than the one that trained `model_dir`: both
    record their run (`run_identity.json`, which training writes into its output directory, every checkpoint and
    the average); where either does not, nothing tells."""
    records, model = read_run_identity(directory), read_run_identity(model_dir)
    if records is None or model is None:
        return
    if differences := identity_differences(model, records):
        raise ValueError(
            f"{directory / RUN_IDENTITY_FILE} is of another run than {model_dir} "
            f"({describe_differences(model, records, differences)}, the model's vs theirs): refusing to put its "
            "training records on the model's card."
        )


def _scored_dir(result: dict[str, Any]) -> Path | None:
    """The local model directory an evaluation result names as scored (`check_eval_result` made sure it is the
    card's), if any."""
    scored = result.get("model")
    return Path(scored) if isinstance(scored, str) and Path(scored).is_dir() else None


def _weights_written_after(model_dir: str | Path, path: Path) -> bool:
    written = path.stat().st_mtime
    return any(weights.stat().st_mtime > written for weights in weight_files(model_dir) if weights.is_file())


def check_eval_result(path: Path, result: Any, model_dir: str | Path | None = None) -> dict[str, Any]:
    """`result`, read from `path`, if the card can show it: an object with the fields the card prints, of their
    types; else a ValueError naming the file and the field. With `model_dir`, the result's `"model"` (what
    scripts/evaluate.py scored), when a local directory, must be `model_dir`: another model's scores never reach
    the card. A result that records the weights it scored is judged by them instead (`collect_card_inputs` compares
    them with those `model_dir` holds now): a run copied (`cp -r`, `rsync`) or its link pointed elsewhere names
    the directory it was evaluated in, which may hold those same weights or another run's."""
    if not isinstance(result, dict):
        raise ValueError(f"{path} holds a JSON {type(result).__name__}, not an object of evaluation results.")
    fields = [("num_sentences", int, False), ("source_lang", str, False), ("target_lang", str, False)]
    fields += [("limit", int, True), ("sentences_in_split", int, True)]
    fields += [(key, str, True) for key in ("dataset", "split", "language_pair", "dataset_commit")]
    fields += [(key, int | float, True) for key, _, _ in CARD_METRICS]
    fields += [(f"{key}_signature", str, True) for key, _, _ in CARD_METRICS]
    fields += [("int8", bool, True)]
    for key, kind, optional in fields:
        value = result.get(key)
        if value is None and optional:
            continue
        if value is None:
            raise ValueError(f"{path} has no {key!r}: it is not an evaluation JSON written by scripts/evaluate.py.")
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            expected = {str: "string", bool: "boolean"}.get(kind, "number")
            raise ValueError(f"{path}: {key!r} is {value!r}, not a {expected}.")
        if isinstance(value, float) and not math.isfinite(value):  # json reads NaN; the Hub would list it as a score
            raise ValueError(f"{path}: {key!r} is {value!r}, not a score: evaluate again, or remove it from the file.")
    scored = _scored_dir(result) if result.get("model_weights") is None else None
    if model_dir is not None and scored is not None:
        if scored.resolve() != Path(model_dir).resolve():
            raise ValueError(
                f"{path} scored the model {scored}, not {model_dir}: refusing to put another model's scores on "
                "its card."
            )
    return result


def count_parameters(model_dir: str | Path) -> int | None:
    """Number of stored parameters, read from the safetensors headers (tied matrices are stored once) of the files
    `from_pretrained` loads: a sharded save leaves an earlier model.safetensors beside its shards, counted twice."""
    total = 0
    files = weight_files(model_dir)
    for path in files:
        with safe_open(path, framework="pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    return total if files else None


# --- training curves ------------------------------------------------------------------------------------------


def _series(log_history: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
    return [step for step, _ in points], [value for _, value in points]


def _bleu_keys(log_history: Sequence[dict[str, Any]]) -> list[str]:
    """Numeric eval metrics with "bleu" in their name (`eval_bleu`, `eval_sacrebleu`, ...), not signatures."""
    keys = {key for entry in log_history for key in entry if key.startswith("eval_") and "bleu" in key}
    return sorted(k for k in keys if all(isinstance(e.get(k, 0.0), int | float) for e in log_history))


def plot_training_curves(log_history: Sequence[dict[str, Any]], output_png: str | Path) -> Path:
    """Plot train and eval loss, and every logged eval BLEU, against the optimizer step.

    `log_history` is `trainer_state.json`'s list of log entries. Uses a bare matplotlib `Figure` (Agg canvas),
    so it neither needs a display nor changes the pyplot backend of the caller.
    """
    from matplotlib.figure import Figure

    losses = {label: _series(log_history, key) for key, label in (("loss", "train"), ("eval_loss", "eval"))}
    losses = {label: series for label, series in losses.items() if series[0]}
    bleus = {key.removeprefix("eval_"): _series(log_history, key) for key in _bleu_keys(log_history)}
    if not losses and not bleus:
        raise ValueError("The log history holds no train loss, eval loss or eval BLEU to plot.")

    panels = [(title, series) for title, series in (("Loss", losses), ("BLEU", bleus)) if series]
    figure = Figure(figsize=(6 * len(panels), 4), layout="constrained")
    for axes, (title, series) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        for label, (steps, values) in series.items():
            axes.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
        axes.set(title=title, xlabel="step")
        axes.grid(alpha=0.3)
        axes.legend()
    output_png = Path(output_png)
    with atomic_path(output_png) as temporary:  # a killed render never leaves half a PNG
        figure.savefig(temporary, dpi=120, format="png")
    return output_png


def training_summary(log_history: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """Training length as logged by the Trainer: last step and epoch; the training loss of the whole run, the
    mean of the logged losses weighted by the updates each covers (`updates_logged`, else the steps since the last
    log); the runtime of the last launch.

    The Trainer's own `train_loss` and `train_runtime` cover its last `train()` call only: after a resume, the
    updates since the checkpoint. The log itself is the whole run's (it travels in the checkpoints)."""
    if not log_history:
        return {}
    summary = {"steps": max((e["step"] for e in log_history if "step" in e), default=None)}
    summary["epochs"] = max((e["epoch"] for e in log_history if "epoch" in e), default=None)
    covered, weighted, updates = 0, 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry.get("step", 0) > covered:
            # A log after a resume covers the updates since the checkpoint only (`updates_logged`, where logged):
            # the killed launch's losses since the last log before it were never logged.
            logged = entry.get("updates_logged", entry["step"] - covered)
            weighted, updates, covered = weighted + entry["loss"] * logged, updates + logged, entry["step"]
    summary["mean_train_loss"] = weighted / updates if updates else None
    runtimes = [entry["train_runtime"] for entry in log_history if "train_runtime" in entry]
    summary["last_launch_runtime_s"] = runtimes[-1] if runtimes else None
    return {k: v for k, v in summary.items() if v is not None}


# --- the card -------------------------------------------------------------------------------------------------


def _public(value: Any) -> Any:
    """A local path as a public card shows it, by its last component (`/home/alice/wmt14/data` says nothing to the
    card's readers, and more than its writer may want); anything else as it is. Relative paths count: README's own
    `--data-dir ../shared/data/multi30k` reached the card's `datasets` metadata, which names Hub datasets."""
    if isinstance(value, str) and _is_local_path(value):
        return Path(value).expanduser().resolve().name or value
    return value


def _is_local_path(value: str) -> bool:
    """`value` names a path of this machine: absolute, from the home or the current directory, or a relative path
    that exists here (a Hub id, `org/name`, does not)."""
    if value.startswith(("/", "~", "./", "../")) or value in (".", "..") or Path(value).is_absolute():
        return True
    return "/" in value and Path(value).exists()


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _shown_training_args(training_args: dict[str, Any] | None) -> dict[str, Any]:
    """The hyperparameters the card shows; `num_train_epochs` not where `max_steps` set the length instead (the
    Trainer ignores it then: a run of 52 epochs showed "num_train_epochs 3.0"); `data_seed` where set, since the
    batches' order then comes from it and not from `seed` (a card of seed 0 alone did not reproduce them)."""
    if not training_args:
        return {}
    shown = {key: training_args[key] for key in SHOWN_TRAINING_ARGS if key in training_args}
    if shown.get("data_seed") is None:
        shown.pop("data_seed", None)
    max_steps = shown.get("max_steps")
    if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
        shown.pop("num_train_epochs", None)
    extras = {  # an extra left unset (None) is no setting: "tokens_per_update None" only puzzled a reader
        key: value for key, value in training_args.items() if key not in _TRAINER_FIELDS and value is not None
    }
    return {**shown, **_flatten(extras)}


def model_decoding(generation_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The decoding settings an evaluation records (`modeling.evaluation.DECODING_SETTINGS`) as the model's
    `generation_config.json` (`generation_config`, as JSON) holds them; None for a field it leaves out (transformers
    5 leaves such a field unset, and `generate()` takes its own default). None without the file."""
    if generation_config is None:
        return None
    return {name: generation_config.get(name) for name in DECODING_SETTINGS}


def _decoding_differences(result: dict[str, Any], decoding: dict[str, Any] | None) -> list[str]:
    """`name value` of each decoding setting of `result` other than the model's own (`decoding`). A field left
    unset on either side is what `generate()` takes then (`unset_decoding_defaults`): `--num-beams 1` on a model
    that leaves num_beams unset is its own greedy decoding, `--num-beams 4` on it is not."""
    if decoding is None:
        return []
    defaults = unset_decoding_defaults()

    def effective(settings: dict[str, Any], name: str) -> Any:
        return defaults.get(name) if settings[name] is None else settings[name]

    differing = [name for name in DECODING_SETTINGS if name in result]
    return [f"{name} {result[name]!r}" for name in differing if effective(result, name) != effective(decoding, name)]


def result_caveats(
    result: dict[str, Any], decoding: dict[str, Any] | None = None, direction: tuple[str, str] | None = None
) -> list[str]:
    """Why an evaluation result is not this model's score on its whole split, in the card's words (none where it
    is): scored on part of the split (`evaluate.py --limit`), on the model quantised to int8 (`--int8`), with
    decoding other than the model's own `decoding` (`model_decoding`: `--num-beams 1`, or a generation config
    edited since), or translating the other way than the model's (source, target) `direction` (its training's or
    conversion's pair). Such a result is shown with these words and kept out of the `model-index` metadata, which
    the Hub reads as the model's own scores on the split."""
    caveats = []
    if direction is not None and (result["source_lang"], result["target_lang"]) != direction:
        caveats.append(
            f"translation {result['source_lang']} → {result['target_lang']}, not the {' → '.join(direction)} this "
            "model was made for"
        )
    scored, limit, split = result["num_sentences"], result.get("limit"), result.get("sentences_in_split")
    # evaluate.py scores min(limit, split): without the split's size (older JSONs), fewer than the limit is all of it
    if limit is not None and (scored < split if split is not None else scored >= limit):
        of = f" of {split:,}" if split is not None else ""
        caveats.append(f"the first {scored:,}{of} sentences only (`--limit`)")
    if result.get("int8"):
        caveats.append("the model quantised to int8 (`--int8`), not these weights as they load")
    if differences := _decoding_differences(result, decoding):
        caveats.append(
            f"other decoding than its generation_config.json's ({', '.join(differences)}), not what `generate()` "
            "does with this model"
        )
    return caveats


def _paper_decoding() -> dict[str, Any]:
    """Sec. 6.1's decoding, as `set_paper_decoding` writes it and `generate()` applies it without a generation
    config, in `model_decoding`'s form."""
    generation_config = GenerationConfig()
    set_paper_decoding(generation_config)
    return model_decoding(generation_config.to_dict())


def describe_decoding(generation_config: dict[str, Any] | None) -> dict[str, Any]:
    """What the card says of the model's decoding, from its `generation_config.json` (None: the paper's, which
    `generate()` applies to a checkpoint saved without one): whether it is the paper's, whether its length penalty
    is the GNMT form, and its settings in words, e.g. "beam 4, GNMT length penalty 0.6, max length source + 50"."""
    paper_decoding = _paper_decoding()
    settings = model_decoding(generation_config) or paper_decoding
    gnmt = settings["length_penalty_type"] == "gnmt"  # unset: generate() ranks by score / length^α, transformers'
    length_penalty = settings["length_penalty"] if settings["length_penalty"] is not None else 1.0  # transformers'
    words = [
        f"beam {settings['num_beams'] or 1}",
        f"{'GNMT' if gnmt else 'score / length^α'} length penalty {length_penalty}",
    ]
    if settings["max_length_offset"] is not None:
        words.append(f"max length source + {settings['max_length_offset']}")
    if settings.get("max_length_a") is not None or settings.get("max_length_b") is not None:
        words.append(f"max length {settings['max_length_a'] or 0} · source width + {settings['max_length_b'] or 0}")
    if settings.get("max_new_tokens") is not None:
        words.append(f"at most {settings['max_new_tokens']} new tokens")
    max_length = (generation_config or {}).get("max_length")  # transformers' default (20) applies only when set
    if max_length is not None:
        words.append(f"at most {max_length} tokens in all")
    paper = max_length is None and settings == paper_decoding
    return {"paper": paper, "gnmt": gnmt, "words": ", ".join(words)}


def _conversion_decoding_changed(conversion: dict[str, Any] | None, generation_config: dict[str, Any] | None) -> bool:
    """Whether the model's `generation_config.json` no longer holds the fairseq decoding its conversion wrote there
    (`fairseq_conversion.json`'s `decoding`): edited since, it is what `generate()` does, not fairseq's command."""
    if not conversion or generation_config is None:
        return False
    return any(generation_config.get(name) != value for name, value in conversion["decoding"].items())


def _eval_results_metadata(results: Sequence[dict[str, Any]], dataset_name: str | None) -> list[EvalResult]:
    """The `model-index` entries of `results`, each the model's own score on its whole split (no `result_caveats`)."""
    metadata: list[EvalResult] = []
    slots: dict[tuple[str | None, ...], dict[str, Any]] = {}
    for result in results:
        dataset = result.get("dataset") or dataset_name or "unknown"
        pair = result.get("language_pair") or f"{result['source_lang']}-{result['target_lang']}"
        # the Hub lists each as the model's score on that split: two of them gave it two numbers, neither said which
        slot = (dataset, pair, result.get("language_pair"), result.get("split"), result.get("dataset_commit"))
        if (other := slots.setdefault(slot, result)) is not result:
            if all(other.get(key) == result.get(key) for key, _, _ in CARD_METRICS):
                continue  # the same scores, evaluated again (in a copy of the run): listed once
            raise ValueError(
                f"Two evaluations score the model on {dataset} {pair}, split {result.get('split', '?')}, with its "
                f"own decoding ({other['num_sentences']:,} sentences, sacreBLEU {other.get('sacrebleu')}; "
                f"{result['num_sentences']:,} sentences, sacreBLEU {result.get('sacrebleu')}): remove the "
                "eval_results JSON of the one the card should not report."
            )
        for key, metric_type, metric_name in CARD_METRICS:
            if result.get(key) is None:
                continue
            metadata.append(
                EvalResult(
                    task_type="translation",
                    task_name="Translation",
                    dataset_type=dataset,
                    dataset_name=f"{dataset} {pair}",
                    dataset_config=result.get("language_pair"),
                    dataset_split=result.get("split"),
                    dataset_revision=result.get("dataset_commit"),
                    metric_type=metric_type,
                    metric_name=metric_name,
                    metric_value=round(float(result[key]), 2),
                    metric_config=result.get(f"{key}_signature"),
                )
            )
    return metadata


def render_model_card(
    template_path: str | Path | None = None,
    *,
    model_name: str,
    repo_id: str,
    source_lang: str | None = None,
    target_lang: str | None = None,
    dataset_name: str | None = None,
    eval_results: Sequence[dict[str, Any]] = (),
    training_args: dict[str, Any] | None = None,
    log_history: Sequence[dict[str, Any]] | None = None,
    data_stats: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
    num_parameters: int | None = None,
    curve_png: str | None = None,
    license: str | None = None,
    conversion: dict[str, Any] | None = None,
    generation_config: dict[str, Any] | None = None,
    averaged_checkpoints: Sequence[str] = (),
    best_checkpoint: str | None = None,
) -> ModelCard:
    """Fill the card template with measured values only, and build its `model-index` metadata.

    `eval_results` are the JSON dicts written by `scripts/evaluate.py`; the languages default to theirs;
    `dataset_name` is the training data (`data_stats.json`'s), which the card says the model was trained on and
    lists in its `datasets` metadata: never an evaluation's dataset; `conversion` is a converted fairseq model's
    `fairseq_conversion.json`; `generation_config` the model's `generation_config.json`, whose decoding the card
    describes (without it, the paper's, which `generate()` then applies) and whose settings an evaluation must have
    used to reach `model-index`; `averaged_checkpoints` the names of the checkpoints whose average the weights are
    (`checkpoint_averaging.json`); `best_checkpoint` the checkpoint whose weights the run's final model holds
    (`load_best_model_at_end`). `license` defaults to this
    project's, Apache-2.0, and for a converted fairseq model (or a fine-tune of one) to fairseq's, MIT, under which
    its weights were published. `template_path` is a Jinja2
    template (default: the package's `templates/model_card.md`) rendered with `StrictUndefined`, so a misspelt
    variable fails instead of silently printing nothing.
    """
    eval_results = [{**result, "dataset": _public(result.get("dataset"))} for result in eval_results]
    first = eval_results[0] if eval_results else {}
    known = (source_lang, target_lang) if source_lang and target_lang else None  # training's pair, if given
    if known is None and conversion and conversion.get("source_lang") and conversion.get("target_lang"):
        known = (conversion["source_lang"], conversion["target_lang"])
    source_lang = source_lang or first.get("source_lang") or (conversion or {}).get("source_lang")
    target_lang = target_lang or first.get("target_lang") or (conversion or {}).get("target_lang")
    dataset_name = _public(dataset_name)
    decoding = model_decoding(generation_config) or _paper_decoding()  # without the file, generate() does the paper's
    caveats = [result_caveats(result, decoding, known) for result in eval_results]
    own_scores = [result for result, said in zip(eval_results, caveats, strict=True) if not said]
    # model-index groups scores by dataset and split, not by direction: a de → en score was listed as en → de's
    if len(directions := list(dict.fromkeys((r["source_lang"], r["target_lang"]) for r in own_scores))) > 1:
        raise ValueError(
            f"The evaluations translate {' and '.join(' → '.join(pair) for pair in directions)}, and no record says "
            "which way the model translates (data_stats.json's source_lang and target_lang): give the card the "
            "evaluations of its direction only."
        )
    metadata = _eval_results_metadata(own_scores, dataset_name)
    fine_tuned_from = _public((training_args or {}).get("model_name_or_path"))
    card_data = ModelCardData(
        model_name=model_name if metadata else None,
        eval_results=metadata or None,
        language=[lang for lang in (source_lang, target_lang) if lang] or None,
        license=license or ("mit" if conversion else "apache-2.0"),
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "transformer", "vaswani-transformer", "custom_code", *(["fairseq"] * bool(conversion))],
        datasets=[dataset_name] if dataset_name and "/" in dataset_name else None,
        metrics=["bleu", "chrf"] if metadata else None,
        base_model=(training_args or {}).get("base_model"),  # a Hub repo fine-tuned, as training recorded it
    )
    config = model_config or {}
    context = {
        "model_name": model_name,
        "repo_id": repo_id,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "dataset_name": dataset_name,
        "example_sentence": _EXAMPLE_SENTENCES.get(source_lang or "", "A sentence to translate."),
        "eval_results": list(eval_results),
        "eval_caveats": caveats,
        "decoding": describe_decoding(generation_config),
        "metrics": [(key, name) for key, _, name in CARD_METRICS],
        "architecture": [(label, config[key]) for key, label in ARCHITECTURE_FIELDS if key in config],
        "tied_embeddings": config.get("tie_word_embeddings", True),
        "activation": config.get("activation_function", "relu"),
        "num_parameters": f"{num_parameters:,}" if num_parameters else None,
        "training_args": {key: _public(value) for key, value in _shown_training_args(training_args).items()},
        "training_summary": training_summary(log_history),
        "data_stats": {key: _public(value) for key, value in _flatten(data_stats or {}).items()},
        "curve_png": curve_png,
        "conversion": conversion,
        "conversion_decoding_changed": _conversion_decoding_changed(conversion, generation_config),
        "fine_tuned_from": fine_tuned_from,
        "averaged_checkpoints": list(averaged_checkpoints),
        "best_checkpoint": best_checkpoint,
        "metric_for_best_model": (training_args or {}).get("metric_for_best_model"),
        "fairseq_published_bleu": FAIRSEQ_PUBLISHED_BLEU,
    }
    template = Path(template_path) if template_path is not None else DEFAULT_TEMPLATE
    if template.is_dir():
        raise IsADirectoryError(f"Model card template {template} is a directory: give the template file.")
    if not template.is_file():
        raise FileNotFoundError(f"Model card template {template} does not exist.")
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["table_cell"] = _table_cell
    try:
        content = environment.from_string(template.read_text(encoding="utf-8")).render(
            card_data=card_data.to_yaml(), **context
        )
    except jinja2.TemplateSyntaxError as error:
        raise ValueError(f"Model card template {template}, line {error.lineno}: {error.message}") from None
    except jinja2.TemplateError as error:  # StrictUndefined's UndefinedError among them
        raise ValueError(f"Model card template {template} cannot be rendered: {error}") from None
    return ModelCard(content)


def _table_cell(value: Any) -> str:
    """`value` as a markdown table cell: a `|` in a recorded value (a run name, a path) ended the cell, a newline
    the table."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def write_model_card(
    model_dir: str | Path,
    *,
    repo_id: str,
    card_from: Sequence[str | Path] = (),
    template_path: str | Path | None = None,
) -> Path:
    """Render README.md (and `training_curves.png` when a log history exists) into `model_dir`.

    Returns the path of the card.
    """
    model_dir = Path(model_dir)
    inputs = collect_card_inputs(card_from, model_dir)
    averaged = _averaged_checkpoints(model_dir)
    best = _best_checkpoint_loaded(model_dir)
    step = checkpoint_step(best) if best is not None else _weights_step(model_dir, averaged)
    if step is not None and inputs["log_history"]:  # the weights of an earlier update than the run's last
        inputs["log_history"] = [entry for entry in inputs["log_history"] if entry.get("step", 0) <= step]
    # A converted model's record; a model fine-tuned from one has it in its training record.
    fine_tuned_conversion = (inputs["training_args"] or {}).pop("fairseq_conversion", None)
    conversion = read_record(model_dir / CONVERSION_FILE) if (model_dir / CONVERSION_FILE).is_file() else None
    conversion = conversion or fine_tuned_conversion
    # The curves are plotted aside and moved in (a rename, in the same directory) with the card: a template that
    # fails leaves nothing written. Aside under one name, a killed render's removed here: a new name each time left
    # one more directory in the model's at every kill, which a new average or conversion refused to replace.
    staging = model_dir / MODEL_CARD_STAGING
    remove_tree(staging)
    staging.mkdir()
    try:
        curves = None
        if inputs["log_history"]:
            # a history without losses or BLEU: the card says there are no curves
            with contextlib.suppress(ValueError):
                curves = plot_training_curves(inputs["log_history"], staging / CURVES_FILE)
        weights = {"averaged_checkpoints": averaged, "best_checkpoint": best}
        card = _render_card_of(model_dir, repo_id, inputs, template_path, conversion, curves is not None, weights)
        with atomic_path(model_dir / "README.md") as written:
            written.write_text(str(card), encoding="utf-8")
            # On disk before the curves move in: a disk that filled while the card was written kept the earlier
            # card beside the new curves, which a push without --card-from then uploaded together.
            fsync_path(written)
            if curves is not None:
                shutil.move(curves, model_dir / CURVES_FILE)
    finally:
        remove_tree(staging)
    return model_dir / "README.md"


def _render_card_of(
    model_dir: Path,
    repo_id: str,
    inputs: dict[str, Any],
    template_path: str | Path | None,
    conversion: dict[str, Any] | None,
    with_curves: bool,
    weights: dict[str, Any],
) -> ModelCard:
    source_lang, target_lang = _trained_languages(inputs["data_stats"] or {})
    return render_model_card(
        template_path,
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        source_lang=source_lang or None,
        target_lang=target_lang or None,
        dataset_name=(inputs["data_stats"] or {}).get("dataset"),
        eval_results=inputs["eval_results"],
        training_args=inputs["training_args"],
        log_history=inputs["log_history"],
        data_stats=inputs["data_stats"],
        model_config=read_record(model_dir / "config.json"),
        num_parameters=count_parameters(model_dir),
        curve_png=CURVES_FILE if with_curves else None,
        conversion=conversion,
        generation_config=read_record(path) if (path := model_dir / "generation_config.json").is_file() else None,
        **weights,
    )


def _trained_languages(data_stats: dict[str, Any]) -> tuple[str | None, str | None]:
    """The pair a run trained on, from its data_stats.json, for the card's language tags even unevaluated: its
    `source_lang` and `target_lang`, or in a record older than them its `language_pair` split at its hyphen where it
    has only one ("pt-BR-en" may be pt-BR → en or pt → BR-en: None then, and the evaluations' languages are used)."""
    if data_stats.get("source_lang") and data_stats.get("target_lang"):
        return data_stats["source_lang"], data_stats["target_lang"]
    pair = data_stats.get("language_pair", "").split("-")
    return (pair[0], pair[1]) if len(pair) == 2 and all(pair) else (None, None)


def _best_checkpoint_loaded(model_dir: Path) -> str | None:
    """The name of the checkpoint whose weights a run's final model holds under `load_best_model_at_end` (its
    `trainer_state.json`'s `best_model_checkpoint`), where that is not the last update: the Trainer loads the best
    checkpoint before saving the final model. None for a checkpoint itself, which holds its own weights."""
    state_path, args_path = model_dir / TRAINER_STATE_NAME, model_dir / TRAINING_ARGS_FILE
    if CHECKPOINT_RE.match(model_dir.resolve().name) or not (state_path.is_file() and args_path.is_file()):
        return None
    if read_record(args_path).get("load_best_model_at_end") is not True:
        return None
    state = read_record(state_path)
    best = state.get("best_model_checkpoint")
    if not isinstance(best, str) or not CHECKPOINT_RE.match(Path(best).name):
        return None
    return Path(best).name if checkpoint_step(best) != state.get("global_step") else None


def _averaged_checkpoints(model_dir: Path) -> list[str]:
    """The names of the checkpoints averaged into `model_dir` (its `checkpoint_averaging.json`), if it is an
    average."""
    if not (model_dir / AVERAGING_RECORD_NAME).is_file():
        return []
    checkpoints = read_record(model_dir / AVERAGING_RECORD_NAME).get("checkpoints")
    if not isinstance(checkpoints, list) or not checkpoints or not all(isinstance(p, str) for p in checkpoints):
        raise ValueError(f"{model_dir / AVERAGING_RECORD_NAME} does not list the checkpoints averaged.")
    return [Path(path).name for path in checkpoints]


def _weights_step(model_dir: Path, averaged_checkpoints: Sequence[str]) -> int | None:
    """The update `model_dir`'s weights are of: a checkpoint's (or the run's final model's) `trainer_state.json`
    says; an average's, that of the newest checkpoint averaged. None where nothing says (a model directory of
    another kind)."""
    if (model_dir / TRAINER_STATE_NAME).is_file():
        step = read_record(model_dir / TRAINER_STATE_NAME).get("global_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None
    steps = [CHECKPOINT_RE.match(name) for name in averaged_checkpoints]
    return max(int(match[1]) for match in steps) if steps and all(steps) else None
