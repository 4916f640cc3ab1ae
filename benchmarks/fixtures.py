"""What the benchmarks run on: model sizes, twin checkpoints (this model and its exact MarianMT twin), the corpus
and its shared BPE, a trained checkpoint for generation, and the one training update every benchmark uses.

Everything slow to build (the BPE, the tokenised corpus, trained weights) is cached under `benchmarks/.cache/`,
which git ignores. When the shared Multi30k files are absent, a synthetic parallel corpus stands in, so that the
benchmarks still run end to end; every report then says "synthetic".
"""

from __future__ import annotations

import argparse
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from harness import positive_int
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, MarianMTModel, PreTrainedModel, PreTrainedTokenizerFast

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.batching import TokenBudgetBatchSampler, sequence_lengths
from modeling.convert import to_marian
from modeling.data import load_parallel_dataset, tokenize_parallel_dataset
from modeling.export import RECORD_FILE, to_ctranslate2
from modeling.files import atomic_directory
from modeling.schedule import noam_learning_rate, noam_scheduler
from modeling.tokenization import iter_corpus_text, train_shared_bpe

BENCHMARKS_DIR = Path(__file__).resolve().parent
DEFAULT_CACHE_DIR = BENCHMARKS_DIR / ".cache"
DEFAULT_DATA_DIR = BENCHMARKS_DIR.parents[1] / "shared" / "data" / "multi30k"
SOURCE_LANG, TARGET_LANG = "en", "de"


@dataclass(frozen=True)
class ModelSize:
    """Dimensions of the benchmarked model; the issue's are the defaults."""

    d_model: int = 256
    layers: int = 3
    heads: int = 4
    ffn_dim: int = 1024
    vocab_size: int = 8000

    @property
    def key(self) -> str:
        return f"d{self.d_model}-l{self.layers}-h{self.heads}-f{self.ffn_dim}-v{self.vocab_size}"


ISSUE_SIZE = ModelSize()
# The generation benchmark's checkpoint: 1,000 updates of ~2,048 tokens per side (4.5 epochs of Multi30k), after
# which beam search ends its sentences (10.5 output tokens on average on the first 200 validation sentences, whose
# references have 14.2). 300 updates gave a model that repeated itself (31.9 on average): every beam ran long, and
# batches had none of the spread of lengths real ones have.
GENERATION_CHECKPOINT_STEPS = 1000
GENERATION_CHECKPOINT_PEAK_RATE = 2e-3
QUICK_SIZE = ModelSize(d_model=32, layers=2, heads=4, ffn_dim=64, vocab_size=512)


def transformer_config(size: ModelSize, vocab_size: int | None = None, **overrides) -> TransformerConfig:
    """The paper's architecture at `size`: ReLU, post-LayerNorm, scaled embeddings shared by encoder, decoder and
    output projection, no projection biases, dropout 0.1."""
    return TransformerConfig(
        vocab_size=vocab_size or size.vocab_size,
        d_model=size.d_model,
        encoder_layers=size.layers,
        decoder_layers=size.layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=size.ffn_dim,
        decoder_ffn_dim=size.ffn_dim,
        activation_function="relu",
        scale_embedding=True,
        tie_word_embeddings=True,
        **overrides,
    )


def random_model(config: TransformerConfig, seed: int = 0) -> TransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return TransformerForConditionalGeneration(config)


def with_attention(model: PreTrainedModel, implementation: str) -> PreTrainedModel:
    model.set_attn_implementation(implementation)
    return model


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: this model and its Marian twin side by side, so that subprocesses load exactly what they measure
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A directory holding `ours/` and `marian/` (each with the tokenizer) and later `ct2/`."""

    directory: Path

    @property
    def ours(self) -> Path:
        return self.directory / "ours"

    @property
    def marian(self) -> Path:
        return self.directory / "marian"

    @property
    def ct2(self) -> Path:
        return self.directory / "ct2"

    def exists(self) -> bool:
        return (self.ours / "config.json").is_file() and (self.marian / "config.json").is_file()

    def save(
        self, model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerFast | None = None
    ) -> None:
        """Both models (with the tokenizer) into a directory that takes this one's place once complete, readable
        as the umask allows (`atomic_directory`): killed midway, it leaves nothing that `exists()` would take."""
        with atomic_directory(self.directory) as partial:
            model.save_pretrained(partial / self.ours.name)
            to_marian(model).save_pretrained(partial / self.marian.name)
            if tokenizer is not None:
                tokenizer.save_pretrained(partial / self.ours.name)
                tokenizer.save_pretrained(partial / self.marian.name)

    def load_ours(self, attention: str = "sdpa") -> TransformerForConditionalGeneration:
        return TransformerForConditionalGeneration.from_pretrained(self.ours, attn_implementation=attention).eval()

    def load_marian(self, attention: str = "sdpa") -> MarianMTModel:
        return MarianMTModel.from_pretrained(self.marian, attn_implementation=attention).eval()

    def export_ctranslate2(self) -> Path:
        """`ct2/`: this model exported with `modeling.export.to_ctranslate2` (float32; int8 is chosen at load
        time), once. A `ct2/` cached before that exporter existed (converted from the twin) is replaced."""
        if not (self.ct2 / RECORD_FILE).is_file():
            if self.ct2.exists():
                shutil.rmtree(self.ct2)
            to_ctranslate2(self.load_ours("eager"), PreTrainedTokenizerFast.from_pretrained(self.ours), self.ct2)
        return self.ct2


# --------------------------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """A tokenised training split and raw validation sources and references, with the shared BPE that encoded
    them."""

    name: str  # "multi30k" or "synthetic"
    tokenizer: PreTrainedTokenizerFast
    train: datasets.Dataset  # input_ids, attention_mask, labels
    validation_sources: list[str]
    validation_references: list[str]

    @property
    def is_real(self) -> bool:
        return self.name != "synthetic"


def load_corpus(
    data_dir: Path,
    cache_dir: Path,
    vocab_size: int,
    train_limit: int | None = None,
    validation_limit: int | None = None,
) -> Corpus:
    """Multi30k en→de from `data_dir` if it is there, otherwise a synthetic corpus; the BPE is trained on the
    (possibly limited) training split once and cached."""
    if data_dir.is_dir():
        name = "multi30k"
        raw = load_parallel_dataset(
            source_lang=SOURCE_LANG,
            target_lang=TARGET_LANG,
            data_dir=data_dir,
            splits=["train", "validation"],
            cache_dir=str(cache_dir / "datasets"),
        )
        train, validation = raw["train"], raw[next(split for split in raw if split != "train")]
    else:
        name = "synthetic"  # as many pairs as Multi30k has
        train = synthetic_split(train_limit or 29_000, seed=0)
        validation = synthetic_split(validation_limit or 1_000, seed=1)
    if train_limit is not None:
        train = train.select(range(min(train_limit, len(train))))
    if validation_limit is not None:
        validation = validation.select(range(min(validation_limit, len(validation))))

    tokenizer_dir = cache_dir / f"tokenizer-{name}-{len(train)}-v{vocab_size}"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_shared_bpe(iter_corpus_text(train, [SOURCE_LANG, TARGET_LANG]), vocab_size).save_pretrained(
            tokenizer_dir
        )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tokenized = tokenize_parallel_dataset(datasets.DatasetDict(train=train), tokenizer, SOURCE_LANG, TARGET_LANG)
    pairs = validation["translation"]
    sources, references = [pair[SOURCE_LANG] for pair in pairs], [pair[TARGET_LANG] for pair in pairs]
    return Corpus(name, tokenizer, tokenized["train"], sources, references)


def synthetic_split(count: int, seed: int) -> datasets.Dataset:
    """Word-for-word "translations" over a made-up 400-word lexicon, 3 to 30 words long (most near 12), so that
    batches need padding as real ones do."""
    rng = random.Random(seed)
    lexicon_rng = random.Random(1234)  # the same lexicon for every split
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "pi", "du", "gen", "ber"]

    def word() -> str:
        return "".join(lexicon_rng.choices(syllables, k=lexicon_rng.randint(1, 3)))

    lexicon = {word(): word() + "en" for _ in range(400)}
    words = list(lexicon)
    rows = []
    for _ in range(count):
        length = max(3, min(30, round(rng.gauss(12, 5))))
        sentence = rng.choices(words, k=length)
        target = [lexicon[w] for w in sentence]
        rows.append({SOURCE_LANG: " ".join(sentence) + ".", TARGET_LANG: " ".join(target) + "."})
    return datasets.Dataset.from_dict({"translation": rows})


def seq2seq_collator(tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel) -> DataCollatorForSeq2Seq:
    """The collator Seq2SeqTrainer users pass: pads to the longest in the batch, labels with -100, and builds
    decoder inputs with the model's own shift."""
    return DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)


def token_budget_sampler(corpus: Corpus, max_tokens: int, seed: int = 0) -> TokenBudgetBatchSampler:
    """This project's batching: similar lengths, about `max_tokens` padded tokens per side per batch."""
    source_lengths, target_lengths = sequence_lengths(corpus.train)
    return TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens, shuffle=True, seed=seed)


def token_budget_loader(corpus: Corpus, model: PreTrainedModel, max_tokens: int, seed: int = 0) -> DataLoader:
    """Token-budget batches of `corpus.train`, collated for `model`."""
    sampler = token_budget_sampler(corpus, max_tokens, seed)
    return DataLoader(corpus.train, batch_sampler=sampler, collate_fn=seq2seq_collator(corpus.tokenizer, model))


# --------------------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------------------


def adamw(model: torch.nn.Module, learning_rate: float = 1e-3) -> torch.optim.Optimizer:
    """Fused AdamW with the paper's betas and epsilon (the Trainer's default optimiser is also fused AdamW)."""
    return torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), eps=1e-9, fused=True)


def training_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, torch.Tensor]):
    """One update as the Trainer does it: forward with labels (mean cross-entropy), backward, step, zero grads."""
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def trained_checkpoint(corpus: Corpus, size: ModelSize, steps: int, cache_dir: Path, max_tokens: int = 2048):
    """A checkpoint trained for `steps` token-budget updates, cached, so that beam search runs on a model that
    translates: its sentences end where their translations do, with the spread of lengths real batches have.

    The paper's schedule (`modeling.schedule.noam_scheduler`) with warm-up over the first fifth of the updates and
    its peak at `GENERATION_CHECKPOINT_PEAK_RATE`. `steps=0` saves the random initialisation.
    """
    # The recipe is part of the name, so that a checkpoint cached by another recipe is never taken for this one's.
    recipe = f"s{steps}-noam{GENERATION_CHECKPOINT_PEAK_RATE:g}"
    checkpoint = Checkpoint(cache_dir / f"trained-{corpus.name}-{len(corpus.train)}-{size.key}-{recipe}")
    if checkpoint.exists():
        return checkpoint
    model = random_model(transformer_config(size, vocab_size=len(corpus.tokenizer)))
    if steps:
        model.train()
        warmup = max(1, steps // 5)
        optimizer = adamw(model, GENERATION_CHECKPOINT_PEAK_RATE / noam_learning_rate(warmup, size.d_model, warmup))
        schedule = noam_scheduler(optimizer, size.d_model, warmup)
        loader = token_budget_loader(corpus, model, max_tokens)
        done, epoch = 0, 0
        while done < steps:
            loader.batch_sampler.set_epoch(epoch)
            for batch in loader:
                loss = training_update(model, optimizer, batch)
                schedule.step()
                done += 1
                if done % 50 == 0 or done == steps:
                    print(f"  trained checkpoint: update {done}/{steps}, loss {loss.item():.2f}", flush=True)
                if done == steps:
                    break
            epoch += 1
    checkpoint.save(model.eval(), corpus.tokenizer)
    return checkpoint


def random_checkpoint(size: ModelSize, cache_dir: Path) -> Checkpoint:
    """The seeded random initialisation at `size`, saved with its twin (for the training-step memory runs)."""
    checkpoint = Checkpoint(cache_dir / f"random-{size.key}")
    if not checkpoint.exists():
        checkpoint.save(random_model(transformer_config(size)).eval())
    return checkpoint


def add_decoding_comparison_arguments(parser: argparse.ArgumentParser, sentences: int | None) -> None:
    """The options of the investigations that time two ways of decoding against each other on the cached trained
    checkpoint: threads, repeats, validation sentences (unless `sentences` is None: none are translated),
    attention, where the data and the caches are."""
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed passes of each way, alternating")
    if sentences is not None:
        parser.add_argument("--sentences", type=positive_int, default=sentences, help="validation sentences")
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)


def decoding_comparison_setup(arguments: argparse.Namespace) -> tuple[Corpus, Checkpoint]:
    """For those options: torch on `--threads` threads, quiet libraries, the corpus and the generation benchmark's
    trained checkpoint (trained once if it is not cached)."""
    torch.set_num_threads(arguments.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    corpus = load_corpus(arguments.data_dir, arguments.cache_dir, ISSUE_SIZE.vocab_size)
    return corpus, trained_checkpoint(corpus, ISSUE_SIZE, GENERATION_CHECKPOINT_STEPS, arguments.cache_dir)
