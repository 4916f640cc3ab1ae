"""Training speed of this project's pipeline against eole and fairseq: same data, model, tokens per update.

Run by hand, on a quiet machine (never in CI: the peers live in their own virtual environments):

    python benchmarks/train_peers.py --fairseq-python /work/fairseq-env/bin/python \\
        --eole-python /work/eole-env/bin/python
    python benchmarks/train_peers.py ... --updates 20 --warmup-updates 5 --repeats 1 --threads 1 --limit 3000  # smoke
    python benchmarks/train_peers.py --dry-run      # prepares the data and prints each trainer's command

What is the same for the three trainers:

- data: the first `--limit` Multi30k en→de training pairs (default: all 29,000), encoded once with this project's
  shared BPE (`modeling.tokenization.train_shared_bpe`) and given to each tool as its tokens, with the vocabulary
  exported to fairseq's `dict.txt` and eole's vocabulary file: the three see the same tokens;
- model: the tiny preset's (or `--size issue`: the benchmarks' d_model 256, 3 + 3 layers, 4 heads, d_ff 1024),
  post-LayerNorm, ReLU, sinusoidal positions, embeddings shared three ways, dropout 0.1, no attention dropout;
- recipe: label smoothing 0.1, Adam (0.9, 0.98, 1e-9), no clipping, no weight decay, the warm-up-then-inverse-
  square-root schedule with the same warm-up and peak (fairseq's `inverse_sqrt` from 0 is the paper's formula);
- batches: `--max-tokens` padded tokens per batch (count × the longest sequence, on the longer side: each tool's
  own definition, the same one), one batch per update, a fixed number of updates, no validation, no checkpoints.

Each run is one process of the tool's own training command (`scripts/train.py`, `fairseq-train`, `eole train`),
with its own batching, data loading and loop, and a wrapper around its update function that records, after each
update, the time and the non-padding source and target tokens of the batch it consumed. Tokens/s is measured from
the end of update `--warmup-updates` to the end of the last one: start-up, data preparation and binarisation,
and the first updates are excluded. Each configuration runs `--repeats` times, the tools alternating; the table
gives medians, min–max, and ratios to this project at the same thread count.
"""

from __future__ import annotations

# Only the standard library at the top: the same file runs as the worker inside the peers' environments.
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

from harness import positive_int

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "multi30k"
DEFAULT_WORK_DIR = BENCHMARKS_DIR / ".cache" / "peers"
TOOLS = ("ours", "eole", "fairseq")
DISPLAY = {"ours": "this project (scripts/train.py)", "eole": "eole", "fairseq": "fairseq"}
SOURCE, TARGET = "en", "de"
# Special tokens of the shared BPE (modeling.tokenization), ids 0, 1, 2.
PAD, UNK, EOS = "<pad>", "<unk>", "</s>"


@dataclass(frozen=True)
class Recipe:
    """Everything the three trainers share; written into each worker's job file."""

    d_model: int
    layers: int
    heads: int
    ffn_dim: int
    vocab_size: int
    max_tokens: int
    warmup_steps: int
    learning_rate: float  # the multiplier of d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
    dropout: float = 0.1
    label_smoothing: float = 0.1
    seed: int = 1

    @property
    def peak_learning_rate(self) -> float:
        """The schedule's value at the end of the warm-up: fairseq's `--lr`."""
        return self.learning_rate * self.d_model**-0.5 * self.warmup_steps**-0.5


def recipe_for(size: str, max_tokens: int | None, vocab_size: int | None) -> Recipe:
    """The tiny preset (this project's CPU demo) or the benchmarks' size, with the tiny preset's recipe."""
    sys.path.insert(0, str(REPO_ROOT))
    from modeling.presets import get_preset

    tiny = get_preset("tiny")
    if size == "tiny":
        dims = {key: tiny.model[key] for key in ("d_model", "encoder_layers", "encoder_attention_heads")}
        d_model, layers, heads = dims.values()
        ffn_dim, default_vocab = tiny.model["encoder_ffn_dim"], tiny.vocab_size
    else:
        sys.path.insert(0, str(BENCHMARKS_DIR))
        from fixtures import ISSUE_SIZE

        d_model, layers, heads, ffn_dim = ISSUE_SIZE.d_model, ISSUE_SIZE.layers, ISSUE_SIZE.heads, ISSUE_SIZE.ffn_dim
        default_vocab = ISSUE_SIZE.vocab_size
    return Recipe(
        d_model=d_model,
        layers=layers,
        heads=heads,
        ffn_dim=ffn_dim,
        vocab_size=vocab_size or default_vocab,
        max_tokens=max_tokens or tiny.max_tokens_per_device,
        warmup_steps=tiny.warmup_steps,
        learning_rate=tiny.learning_rate,
    )


# --------------------------------------------------------------------------------------------------------------
# Data: one sample, one BPE, each tool's vocabulary format
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """Where the prepared sample lives; every tool's inputs are in `directory`."""

    directory: Path

    @property
    def tokenizer(self) -> Path:
        return self.directory / "tokenizer"

    @property
    def text(self) -> Path:  # plain text, for this project's pipeline (which tokenises with `tokenizer`)
        return self.directory / "text"

    def tokens(self, split: str, lang: str) -> Path:  # BPE tokens separated by spaces, for the peers
        return self.directory / f"{split}.tok.{lang}"

    @property
    def fairseq_dict(self) -> Path:
        return self.directory / "dict.txt"

    @property
    def eole_vocab(self) -> Path:
        return self.directory / "eole.vocab"

    @property
    def fairseq_bin(self) -> Path:
        return self.directory / "fairseq-bin"

    @property
    def stats(self) -> Path:
        return self.directory / "stats.json"


def read_lines(path: Path, limit: int | None) -> list[str]:
    """The first `limit` lines of `path` (all: None) as this project's training reads them (`iter_lines`: "\\n" alone
    ends a line). open()'s universal newlines ended one at a stray "\\r" inside a sentence too (web text holds them):
    the pairs after it misaligned, silently where the other side held one further on (the counts agreed)."""
    sys.path.insert(0, str(REPO_ROOT))
    from modeling.files import iter_lines

    return list(islice(iter_lines(path), limit))


def find_split(data_dir: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(f"no {split}.{lang}[.gz] in {data_dir}")


def peer_spelling(token: str) -> str:
    """The token as the peers read it, in text separated by spaces: whitespace inside it (Multi30k has a tab, which
    the BPE keeps as a token of its own) spelled <0xNN>. The peers only count and embed tokens, never detokenise."""
    return "".join(f"<0x{ord(character):02X}>" if character.isspace() else character for character in token)


def vocabulary_files(tokens: list[str], counts: Counter) -> tuple[str, str]:
    """fairseq's dict.txt and eole's vocabulary file for the BPE's tokens in id order (ids 0-2 are <pad>, <unk>,
    </s>, which each tool adds itself as its own specials): the same tokens, in the same order, as `peer_spelling`
    writes them."""
    spelled = [(peer_spelling(token), counts[token]) for token in tokens[3:]]
    if len({spelling for spelling, _ in spelled}) != len(spelled) or not all(spelling for spelling, _ in spelled):
        raise ValueError("the BPE's tokens do not have distinct, non-empty spellings for the peers")
    fairseq = "".join(f"{spelling} {count}\n" for spelling, count in spelled)
    eole = "".join(f"{spelling}\t{count}\n" for spelling, count in spelled)
    return fairseq, eole


def prepare(data_dir: Path, work_dir: Path, limit: int | None, vocab_size: int) -> Prepared:
    """The sample, its shared BPE, its tokens and the vocabularies, once (cached under `work_dir`)."""
    source = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:8]  # another data directory: another cache
    prepared = Prepared(work_dir / f"{data_dir.name}-{source}-{limit or 'all'}-v{vocab_size}")
    if prepared.stats.is_file():
        return prepared
    sys.path.insert(0, str(REPO_ROOT))
    from modeling.tokenization import train_shared_bpe

    building = prepared.directory.with_name(prepared.directory.name + ".partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    partial = Prepared(building)
    splits = {}
    for split, split_limit in (("train", limit), ("val", 500)):
        splits[split] = {lang: read_lines(find_split(data_dir, split, lang), split_limit) for lang in (SOURCE, TARGET)}
        if len(splits[split][SOURCE]) != len(splits[split][TARGET]):
            raise ValueError(f"{split}: the {SOURCE} and {TARGET} files have different line counts")
    tokenizer = train_shared_bpe(splits["train"][SOURCE] + splits["train"][TARGET], vocab_size)
    tokenizer.save_pretrained(partial.tokenizer)
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    if vocabulary[:3] != [PAD, UNK, EOS]:
        raise ValueError(f"expected the shared BPE's specials {PAD}, {UNK}, {EOS} first, got {vocabulary[:3]}")
    counts: Counter = Counter()
    stats = {"pairs": len(splits["train"][SOURCE]), "vocabulary": len(tokenizer)}
    partial.text.mkdir()
    for split, sides in splits.items():
        for lang, lines in sides.items():
            (partial.text / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
            token_lines = [" ".join(map(peer_spelling, tokenizer.convert_ids_to_tokens(ids))) for ids in encoded]
            if split == "train":
                for ids in encoded:
                    counts.update(tokenizer.convert_ids_to_tokens(ids))
                # Tokens per side with </s>, as this project's tokenizer gives them (and fairseq's binariser).
                stats[f"train_tokens_{lang}"] = sum(len(ids) + 1 for ids in encoded)
            partial.tokens(split, lang).write_text("".join(line + "\n" for line in token_lines), encoding="utf-8")
    fairseq, eole = vocabulary_files(vocabulary, counts)
    partial.fairseq_dict.write_text(fairseq, encoding="utf-8")
    partial.eole_vocab.write_text(eole, encoding="utf-8")
    partial.stats.write_text(json.dumps(stats, indent=2) + "\n")
    os.replace(building, prepared.directory)
    return prepared


def binarize_for_fairseq(prepared: Prepared, fairseq_python: str) -> Path:
    """fairseq-preprocess with the shared dictionary (once; not timed)."""
    if (prepared.fairseq_bin / "train.en-de.en.bin").is_file():
        return prepared.fairseq_bin
    destination = prepared.fairseq_bin.with_name("fairseq-bin.partial")
    shutil.rmtree(destination, ignore_errors=True)
    command = [
        fairseq_python,
        "-c",
        "import sys; from fairseq_cli.preprocess import cli_main; sys.argv[0] = 'fairseq-preprocess'; cli_main()",
        "--source-lang", SOURCE, "--target-lang", TARGET,
        "--trainpref", str(prepared.directory / "train.tok"),
        "--validpref", str(prepared.directory / "val.tok"),
        "--destdir", str(destination),
        "--srcdict", str(prepared.fairseq_dict), "--joined-dictionary",
        "--workers", "1",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, env=peer_env(1, fairseq=True))
    os.replace(destination, prepared.fairseq_bin)
    return prepared.fairseq_bin


# --------------------------------------------------------------------------------------------------------------
# Each tool's command
# --------------------------------------------------------------------------------------------------------------


def peer_env(threads: int, fairseq: bool = False) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if fairseq:
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # fairseq 0.12 loads its own files with torch.load
    return env


def ours_argv(recipe: Recipe, prepared: Prepared, output_dir: Path, updates: int) -> list[str]:
    """scripts/train.py as a user runs it, with the tiny preset's recipe and the shared sizes."""
    return [
        "--preset", "tiny",
        "--data_dir", str(prepared.text), "--source_lang", SOURCE, "--target_lang", TARGET,
        "--tokenizer_name_or_path", str(prepared.tokenizer), "--clean", "false",  # the peers' data, uncleaned
        "--d_model", str(recipe.d_model), "--num_layers", str(recipe.layers), "--num_heads", str(recipe.heads),
        "--ffn_dim", str(recipe.ffn_dim), "--dropout", str(recipe.dropout),
        "--output_dir", str(output_dir),
        "--max_steps", str(updates), "--warmup_steps", str(recipe.warmup_steps),
        "--learning_rate", str(recipe.learning_rate), "--label_smoothing_factor", str(recipe.label_smoothing),
        "--max_tokens_per_device", str(recipe.max_tokens),
        "--save_strategy", "no", "--eval_strategy", "no", "--average_last_checkpoints", "1",
        "--bleu_sample_size", "0", "--logging_steps", str(10**6), "--report_to", "none",
        "--dataloader_num_workers", "0", "--use_cpu", "true", "--seed", str(recipe.seed),
        "--disable_tqdm", "true",
    ]  # fmt: skip


def fairseq_argv(recipe: Recipe, binarized: Path, updates: int) -> list[str]:
    """fairseq-train's `transformer` (post-LayerNorm, scaled embeddings, sinusoidal positions) at the shared size."""
    size = []
    for side in ("encoder", "decoder"):
        size += [f"--{side}-embed-dim", str(recipe.d_model), f"--{side}-ffn-embed-dim", str(recipe.ffn_dim)]
        size += [f"--{side}-layers", str(recipe.layers), f"--{side}-attention-heads", str(recipe.heads)]
    return [
        str(binarized), "--task", "translation", "--source-lang", SOURCE, "--target-lang", TARGET,
        "--arch", "transformer", *size, "--share-all-embeddings", "--activation-fn", "relu",
        "--dropout", str(recipe.dropout), "--attention-dropout", "0", "--activation-dropout", "0",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(recipe.label_smoothing),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9",
        "--weight-decay", "0", "--clip-norm", "0",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(recipe.warmup_steps), "--warmup-init-lr", "0",
        "--lr", repr(recipe.peak_learning_rate),
        "--max-tokens", str(recipe.max_tokens), "--required-batch-size-multiple", "1", "--update-freq", "1",
        "--max-update", str(updates), "--disable-validation", "--no-save", "--num-workers", "0",
        "--cpu", "--seed", str(recipe.seed), "--log-format", "simple", "--log-interval", str(10**6),
        "--no-progress-bar",
    ]  # fmt: skip


def eole_config(recipe: Recipe, prepared: Prepared, output_dir: Path, updates: int) -> dict:
    """eole's `transformer` at the shared size. Its decoder layers are pre-LayerNorm (eole has no post-LN
    decoder; its encoder takes `encoder_layer_style: postnorm`): the same LayerNorms, placed differently."""
    # The BPE's tokens plus eole's <s>: as many as fairseq's dictionary.
    vocabulary = json.loads(prepared.stats.read_text())["vocabulary"] + 1
    return {
        "src_vocab": str(prepared.eole_vocab),
        "tgt_vocab": str(prepared.eole_vocab),
        "share_vocab": True,
        "src_vocab_size": vocabulary,
        "tgt_vocab_size": vocabulary,
        "vocab_size_multiple": 1,
        "pad_token": PAD,
        "unk_token": UNK,
        "eos_token": EOS,
        "save_data": str(output_dir / "data"),
        "overwrite": True,
        "report_every": 10**6,
        "seed": recipe.seed,
        "data": {
            "corpus_1": {
                "path_src": str(prepared.tokens("train", SOURCE)),
                "path_tgt": str(prepared.tokens("train", TARGET)),
                "transforms": [],
            },
        },
        "model": {
            "architecture": "transformer",
            "hidden_size": recipe.d_model,
            "share_embeddings": True,
            "share_decoder_embeddings": True,
            "mlp_activation_fn": "relu",
            "add_qkvbias": False,
            "add_ffnbias": True,
            "embeddings": {
                "word_vec_size": recipe.d_model,
                "position_encoding": True,
                "position_encoding_type": "SinusoidalConcat",
            },
            "encoder": {
                "layers": recipe.layers,
                "heads": recipe.heads,
                "transformer_ff": recipe.ffn_dim,
                "encoder_layer_style": "postnorm",
                "final_encoder_layer_norm": False,
            },
            "decoder": {"layers": recipe.layers, "heads": recipe.heads, "transformer_ff": recipe.ffn_dim},
        },
        "training": {
            "model_path": str(output_dir / "model"),
            "train_steps": updates,
            "valid_steps": 10**9,
            "save_checkpoint_steps": 10**9,
            "batch_type": "tokens",
            "batch_size": recipe.max_tokens,
            "batch_size_multiple": 1,
            "normalization": "tokens",
            "accum_count": [1],
            "accum_steps": [0],
            "optim": "adam",
            "adam_beta1": 0.9,
            "adam_beta2": 0.98,
            "adam_eps": 1e-9,
            "learning_rate": recipe.learning_rate,
            "decay_method": "noam",
            "warmup_steps": recipe.warmup_steps,
            "label_smoothing": recipe.label_smoothing,
            "dropout": [recipe.dropout],
            "attention_dropout": [0.0],
            "dropout_steps": [0],
            "max_grad_norm": 0.0,
            "param_init_method": "xavier_uniform",
            "num_workers": 0,
            "world_size": 1,
            "gpu_ranks": [],
            "compute_dtype": "fp32",
        },
    }


# --------------------------------------------------------------------------------------------------------------
# Workers: one process per run, in the tool's own environment
# --------------------------------------------------------------------------------------------------------------


class UpdateClock:
    """Records, after each update, the time and the tokens of the batches it consumed."""

    def __init__(self):
        self.pending = [0, 0, 0, 0, 0]  # real source, real target, padded source, padded target, sentences
        self.updates: list[list[float]] = []

    def add(self, source_real, target_real, source, target) -> None:
        """One batch: boolean masks of its real source and target positions, and its padded token tensors."""
        counts = (int(source_real.sum()), int(target_real.sum()), source.numel(), target.numel(), source.shape[0])
        self.pending = [total + count for total, count in zip(self.pending, counts, strict=True)]

    def tick(self) -> None:
        self.updates.append([time.perf_counter(), *self.pending])
        self.pending = [0, 0, 0, 0, 0]


def run_ours(job: dict, clock: UpdateClock) -> None:
    """scripts/train.py in this process, with the trainer's micro-batch and update ends recorded."""
    import runpy

    from transformers import TrainerCallback

    from modeling.trainer import TokenBudgetSeq2SeqTrainer

    class Tick(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick()

    training_step = TokenBudgetSeq2SeqTrainer.training_step
    init = TokenBudgetSeq2SeqTrainer.__init__

    def counting_training_step(self, model, inputs, *args, **kwargs):
        labels = inputs["labels"]
        clock.add(inputs["attention_mask"].bool(), labels.ne(-100), inputs["input_ids"], labels)
        return training_step(self, model, inputs, *args, **kwargs)

    def init_with_clock(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_callback(Tick())

    TokenBudgetSeq2SeqTrainer.training_step = counting_training_step
    TokenBudgetSeq2SeqTrainer.__init__ = init_with_clock
    sys.argv = [str(REPO_ROOT / "scripts" / "train.py"), *job["argv"]]
    runpy.run_path(sys.argv[0], run_name="__main__")


def run_fairseq(job: dict, clock: UpdateClock) -> None:
    """fairseq-train in this process, `Trainer.train_step` wrapped."""
    from fairseq.trainer import Trainer
    from fairseq_cli.train import cli_main

    train_step = Trainer.train_step

    def counting_train_step(self, samples, *args, **kwargs):
        pad = self.task.source_dictionary.pad()
        for sample in samples:
            if sample:
                source, target = sample["net_input"]["src_tokens"], sample["target"]
                clock.add(source.ne(pad), target.ne(pad), source, target)
        output = train_step(self, samples, *args, **kwargs)
        clock.tick()
        return output

    Trainer.train_step = counting_train_step
    sys.argv = ["fairseq-train", *job["argv"]]
    cli_main()


def run_eole(job: dict, clock: UpdateClock) -> None:
    """eole train in this process, `Trainer._train_step` (one update over its accumulated batches) wrapped."""
    from eole.bin.main import main
    from eole.trainer import Trainer

    train_step = Trainer._train_step

    def counting_train_step(self, batches, *args, **kwargs):
        pad = self.train_loss.padding_idx
        for batch in batches:
            source, target = batch["src"], batch["tgt"][:, 1:]  # the target's first position is <s>
            clock.add(source.ne(pad), target.ne(pad), source, target)
        output = train_step(self, batches, *args, **kwargs)
        clock.tick()
        return output

    Trainer._train_step = counting_train_step
    sys.argv = ["eole", "train", "-config", job["config"]]
    main()


def worker_main(job_file: Path) -> None:
    job = json.loads(job_file.read_text())
    import torch

    torch.set_num_threads(job["threads"])
    clock = UpdateClock()
    {"ours": run_ours, "fairseq": run_fairseq, "eole": run_eole}[job["tool"]](job, clock)
    Path(job["result"]).write_text(json.dumps({"updates": clock.updates, "torch_threads": torch.get_num_threads()}))


# --------------------------------------------------------------------------------------------------------------
# Runs and the table
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    threads: int
    tokens_per_second: float  # real (non-padding) source + target tokens
    real_tokens_per_update: float
    padding_efficiency: float  # real / padded tokens
    timed_updates: int
    seconds: float


def measure(records: list[list[float]], warmup: int) -> tuple[float, float, float, int, float]:
    """(tokens/s, real tokens per update, real/padded, updates, seconds) over the updates after `warmup`."""
    if len(records) <= warmup:
        raise ValueError(f"the run recorded {len(records)} updates, not more than the {warmup} of warm-up")
    timed = records[warmup:]
    seconds = timed[-1][0] - records[warmup - 1][0] if warmup else timed[-1][0] - timed[0][0]
    if not warmup:
        timed = timed[1:]
    real = sum(r[1] + r[2] for r in timed)
    padded = sum(r[3] + r[4] for r in timed)
    return real / seconds, real / len(timed), real / padded, len(timed), seconds


def job_for(tool: str, recipe: Recipe, prepared: Prepared, scratch: Path, threads: int, updates: int, python: str):
    """(command, env, job file) of one run."""
    job = {"tool": tool, "threads": threads, "result": str(scratch / f"{tool}-result.json")}
    if tool == "ours":
        job["argv"] = ours_argv(recipe, prepared, scratch / "ours", updates)
    elif tool == "fairseq":
        job["argv"] = fairseq_argv(recipe, prepared.fairseq_bin, updates)
    else:
        config = scratch / "eole.yaml"
        config.write_text(json.dumps(eole_config(recipe, prepared, scratch / "eole", updates), indent=2))
        job["config"] = str(config)
    job_file = scratch / f"{tool}-job.json"
    job_file.write_text(json.dumps(job, indent=2))
    env = peer_env(threads, fairseq=tool == "fairseq")
    if tool == "ours":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return [python, str(Path(__file__).resolve()), "--worker", str(job_file)], env, job_file


def run_once(tool, recipe, prepared, threads, updates, warmup, python, log_file: Path) -> Run:
    """One run of `tool` in its own process; its output goes to `log_file` (model sizes, the tool's own logs)."""
    with tempfile.TemporaryDirectory(prefix=f"peers-{tool}-") as scratch:
        command, env, job_file = job_for(tool, recipe, prepared, Path(scratch), threads, updates, python)
        started = time.time()
        with open(log_file, "w", encoding="utf-8") as output:
            completed = subprocess.run(command, env=env, stdout=output, stderr=subprocess.STDOUT, text=True)
        if completed.returncode != 0:
            tail = log_file.read_text(encoding="utf-8")[-3000:]
            raise RuntimeError(f"{tool} failed ({completed.returncode}), see {log_file}:\n{tail}")
        result = json.loads(Path(json.loads(job_file.read_text())["result"]).read_text())
    rate, per_update, efficiency, timed, seconds = measure(result["updates"], warmup)
    log(f"{tool}, {threads} thread(s): {rate:,.0f} real tokens/s over {timed} updates ({time.time() - started:.0f} s)")
    if result["torch_threads"] != threads:
        raise RuntimeError(f"{tool} ran with {result['torch_threads']} torch threads, not {threads}")
    return Run(tool, threads, rate, per_update, efficiency, timed, seconds)


def table(runs: list[Run], tools: list[str], threads: list[int]) -> str:
    tools = [tool for tool in TOOLS if tool in tools]  # this project first
    lines = [
        "| trainer | threads | real tokens/s (median) | min–max | vs this project | real tokens / update "
        "| real / padded |",
        "|---|---|---|---|---|---|---|",
    ]
    for count in threads:
        medians = {}
        for tool in tools:
            mine = [run for run in runs if run.tool == tool and run.threads == count]
            if mine:
                medians[tool] = statistics.median(run.tokens_per_second for run in mine)
        for tool in tools:
            mine = [run for run in runs if run.tool == tool and run.threads == count]
            if not mine:
                continue
            rates = [run.tokens_per_second for run in mine]
            versus = f"{medians['ours'] / medians[tool]:.2f}×" if "ours" in medians and tool != "ours" else ""
            lines.append(
                f"| {DISPLAY[tool]} | {count} | {medians[tool]:,.0f} | {min(rates):,.0f}–{max(rates):,.0f} | "
                f"{versus} | {statistics.median(run.real_tokens_per_update for run in mine):,.0f} | "
                f"{statistics.median(run.padding_efficiency for run in mine):.2f} |"
            )
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fairseq-python", help="python of a virtual environment with fairseq (fairseq-fixed)")
    parser.add_argument("--eole-python", help="python of a virtual environment with eole")
    parser.add_argument("--only", default=",".join(TOOLS), help=f"comma-separated subset of {TOOLS}")
    parser.add_argument("--size", choices=("tiny", "issue"), default="tiny", help="tiny preset or benchmarks' size")
    parser.add_argument("--max-tokens", type=positive_int, help="padded tokens per batch and update (tiny's: 2048)")
    parser.add_argument("--vocab-size", type=positive_int, help="shared BPE size (default: the size's)")
    parser.add_argument("--updates", type=positive_int, default=200, help="timed updates per run (default 200)")
    parser.add_argument("--warmup-updates", type=positive_int, default=20, help="untimed updates first (default 20)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="runs per trainer and thread count (3)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--limit", type=positive_int, help="training pairs used (default: all of Multi30k's)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k's gzipped files")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="prepared data (cached)")
    parser.add_argument("--output-json", type=Path, help="also write every run here")
    parser.add_argument("--dry-run", action="store_true", help="prepare the data, print each command, run nothing")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        return arguments
    tools = arguments.only.split(",")
    if set(tools) - set(TOOLS):
        parser.error(f"unknown trainers {sorted(set(tools) - set(TOOLS))}; choose from {TOOLS}")
    try:
        arguments.thread_counts = [int(count) for count in arguments.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes comma-separated integers, got {arguments.threads!r}")
    if min(arguments.thread_counts) < 1:
        parser.error(f"--threads must be at least 1, got {arguments.threads}")
    for tool in ("fairseq", "eole"):
        python = getattr(arguments, f"{tool}_python")
        if tool in tools and not arguments.dry_run:
            if not python:
                parser.error(f"--{tool}-python is required to run {tool} (or leave it out of --only)")
            if not Path(python).is_file():
                parser.error(f"--{tool}-python {python} does not exist")
            # before the data is prepared: the worker would find out only once it is running
            if subprocess.run([python, "-c", f"import {tool}"], capture_output=True).returncode != 0:
                parser.error(
                    f"--{tool}-python {python} cannot import {tool}: pass the interpreter of {tool}'s environment"
                )
    arguments.tools = tools
    return arguments


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    if arguments.worker:
        worker_main(arguments.worker)
        return
    recipe = recipe_for(arguments.size, arguments.max_tokens, arguments.vocab_size)
    log(f"preparing {arguments.limit or 'all'} pairs from {arguments.data_dir} (cached in {arguments.work_dir})")
    prepared = prepare(arguments.data_dir, arguments.work_dir, arguments.limit, recipe.vocab_size)
    pythons = {"ours": sys.executable, "fairseq": arguments.fairseq_python, "eole": arguments.eole_python}
    total = arguments.warmup_updates + arguments.updates
    if arguments.dry_run:
        for tool in arguments.tools:
            with tempfile.TemporaryDirectory() as scratch:
                command, _, job_file = job_for(tool, recipe, prepared, Path(scratch), 1, total, pythons[tool] or tool)
                print(f"{tool}: {' '.join(command)}\n  {json.loads(job_file.read_text())}")
        return
    if "fairseq" in arguments.tools:
        log("binarising for fairseq (once)")
        binarize_for_fairseq(prepared, arguments.fairseq_python)

    runs: list[Run] = []
    started = time.time()
    load = os.getloadavg()
    logs = arguments.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for repeat in range(arguments.repeats):
        for threads in arguments.thread_counts:
            order = arguments.tools[repeat % len(arguments.tools) :] + arguments.tools[: repeat % len(arguments.tools)]
            for tool in order:
                log_file = logs / f"{tool}-threads{threads}-repeat{repeat}.log"
                runs.append(
                    run_once(tool, recipe, prepared, threads, total, arguments.warmup_updates, pythons[tool], log_file)
                )
    stats = json.loads(prepared.stats.read_text())
    print(
        f"## Training speed against eole and fairseq\n\n"
        f"Multi30k en→de, {stats['pairs']:,} pairs, shared BPE of {stats['vocabulary']:,}; d_model {recipe.d_model}, "
        f"{recipe.layers} + {recipe.layers} layers, {recipe.heads} heads, d_ff {recipe.ffn_dim}; {recipe.max_tokens} "
        f"padded tokens per batch and update; {arguments.updates} timed updates after {arguments.warmup_updates}; "
        f"median of {arguments.repeats}. Load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
        f"end ({time.time() - started:.0f} s).\n"
    )
    print(table(runs, arguments.tools, arguments.thread_counts))
    print(
        "\nreal tokens: non-padding source + target tokens of the batches each tool's update consumed (its own "
        "count: fairseq and this project end both sides in </s>; eole's source has none). vs this project: this "
        "project's median over the trainer's (above 1: this project is faster). Differences the tools impose: "
        "fairseq's attention projections have biases; eole's decoder layers are pre-LayerNorm."
    )
    if arguments.output_json:
        payload = {"recipe": asdict(recipe), "data": stats, "runs": [asdict(run) for run in runs]}
        arguments.output_json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
