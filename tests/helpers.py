"""What many test files build: tiny models, toy language pairs, tokenizers, trainers, checkpoints, script runs.

Everything is made here, from toy word-for-word language pairs: no downloaded data, no network. Fixtures built on
these live in `conftest.py`.
"""

import fcntl
import gzip
import io
import json
import math
import os
import random
import runpy
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets
import pyarrow
import pyarrow.parquet
import pytest
import torch
import yaml
from huggingface_hub import CommitOperationAdd, HfApi
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerFast,
)

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.arguments import TranslationTrainingArguments
from modeling.tokenization import train_shared_bpe
from modeling.trainer import TokenBudgetSeq2SeqTrainer

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "scripts"
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
# What fairseq computed (tests/fixtures/fairseq/README.md): two tiny models of fairseq's WMT architectures.
FAIRSEQ_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "fairseq" / "out"
FAIRSEQ_MODELS = ("transformer_wmt_en_de", "transformer_vaswani_wmt_en_de_big")
HUB_TOKEN = "hf_test_token_not_a_real_one"
# The variables a launcher (torchrun, MPI) gives the process count in, as the arguments read them.
LAUNCHER_PROCESS_COUNTS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
# A trainer log, as `trainer_state.json` holds it, for the model card's curves.
LOG_HISTORY = [
    {"loss": 5.1, "learning_rate": 1e-4, "epoch": 0.5, "step": 10},
    {"loss": 4.2, "learning_rate": 2e-4, "epoch": 1.0, "step": 20},
    {"eval_loss": 4.6, "eval_sacrebleu": 1.5, "epoch": 1.0, "step": 20},
    {"train_runtime": 12.5, "train_loss": 4.65, "epoch": 1.0, "step": 20},
]
PAD, EOS, FIRST_ID = 0, 2, 3  # the shared BPE's <pad> and </s>, and its first ordinary token

# --- tiny models ------------------------------------------------------------------------------------------------

TINY_SIZE = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)


def tiny_config(vocab_size: int = 50, **overrides) -> TransformerConfig:
    """The tests' model size: d_model 32, 2 + 2 layers, 4 heads, d_ff 64, with `overrides` on top."""
    return TransformerConfig(**{**TINY_SIZE, "vocab_size": vocab_size, **overrides})


def tiny_model(vocab_size: int = 50, *, seed: int = 0, **overrides) -> TransformerForConditionalGeneration:
    """A seeded random model of `tiny_config`, in eval mode."""
    torch.manual_seed(seed)
    return TransformerForConditionalGeneration(tiny_config(vocab_size, **overrides)).eval()


def seeded_marian(vocab_size: int) -> MarianMTModel:
    """A seeded random MarianMTModel with the shared BPE's special ids: a stock transformers model to fine-tune, or
    to train without this project's fused loss."""
    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=vocab_size,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    return MarianMTModel(config)


def batch() -> dict[str, torch.Tensor]:
    """Two sources of different lengths, the shorter one padded."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, PAD, PAD]])
    decoder_input_ids = torch.tensor([[EOS, 20, 21, 22], [EOS, 23, 24, 25]])
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long(), "decoder_input_ids": decoder_input_ids}


def sources() -> dict[str, torch.Tensor]:
    """`batch()`'s sources and their attention mask, without decoder inputs: what generate() takes."""
    return {name: batch()[name] for name in ("input_ids", "attention_mask")}


def labelled_batch(device: str = "cpu") -> dict[str, torch.Tensor]:
    """`batch()`'s sources with labels instead of decoder inputs; the second target is padded with -100."""
    inputs = batch()
    labels = torch.tensor([[20, 21, 22, EOS], [23, EOS, -100, -100]])
    labelled = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "labels": labels}
    return {name: tensor.to(device) for name, tensor in labelled.items()}


def trained_tiny_translator(
    tokenizer: PreTrainedTokenizerFast, steps: int = 120, seed: int = 0, **overrides
) -> TransformerForConditionalGeneration:
    """`tiny_model` trained for `steps` Adam updates (no dropout) on `synthetic_pairs`, in eval mode: unlike a
    random model it ends its sentences, at different lengths, so beam search exercises end-of-sentence and the
    length penalty. About 2 s for 120 steps on one thread."""
    model = tiny_model(len(tokenizer), seed=seed, dropout=0.0, **overrides).train()
    pairs = synthetic_pairs(192, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    for step in range(steps):
        chunk = pairs[(step * 16) % len(pairs) :][:16]
        encoded = tokenizer([en for en, _ in chunk], text_target=[de for _, de in chunk], padding=True)
        labels = torch.tensor(encoded["labels"]).masked_fill(torch.tensor(encoded["labels"]) == PAD, -100)
        loss = model(
            input_ids=torch.tensor(encoded["input_ids"]),
            attention_mask=torch.tensor(encoded["attention_mask"]),
            labels=labels,
        ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def fairseq_beam_search(
    model, source: list[int], beam: int, lenpen: float, max_len: int, *, min_len: int = 1, pad: int = PAD
) -> list[tuple[list[int], float]]:
    """fairseq's `SequenceGenerator._generate` for one sentence, written from its sources without fairseq (as the
    fixtures' own check did), on `model`'s log-probabilities recomputed over the whole prefix at every step, no
    cache: [(ids ending in </s>, score)], best first. It gives fairseq's own 4-best lists (tests/test_fairseq.py).

    Start from </s>; after the log-softmax, padding gets -inf, at step >= max_len every token but </s> (which keeps
    its log-probability), at step < min_len </s>; step 0 expands beam 0 only; the top 2·beam candidates of the
    flattened beam × vocabulary scores; a </s> among the first `beam` candidates (finite) finishes, in candidate
    order, until `beam` have finished, scored cumulative log-probability / (step + 1) ** lenpen; the first `beam`
    candidates that are not </s> continue; done with `beam` finished or at step max_len."""
    source_ids = torch.tensor([source])
    tokens = torch.full((1, 1), EOS)
    cumulative = torch.zeros(1)
    finished: list[tuple[list[int], float]] = []
    for step in range(max_len + 1):
        rows = tokens.shape[0]
        with torch.no_grad():
            logits = model(
                input_ids=source_ids.expand(rows, -1),
                attention_mask=torch.ones((rows, source_ids.shape[1]), dtype=torch.long),
                decoder_input_ids=tokens,
                use_cache=False,
            ).logits[:, -1]
        log_probs = logits.float().log_softmax(-1)
        log_probs[:, pad] = -math.inf
        if step >= max_len:
            eos_scores = log_probs[:, EOS].clone()
            log_probs[:] = -math.inf
            log_probs[:, EOS] = eos_scores
        if step < min_len:
            log_probs[:, EOS] = -math.inf
        candidates = (log_probs + cumulative[:, None])[: 1 if step == 0 else rows]
        vocab = candidates.shape[1]
        scores, indices = candidates.reshape(-1).topk(min(2 * beam, candidates.numel() - 1))
        beams, words = indices // vocab, indices % vocab
        for j in range(beam):
            if words[j] == EOS and scores[j] > -math.inf and len(finished) < beam:
                ids = tokens[beams[j], 1:].tolist() + [EOS]
                finished.append((ids, (scores[j] / (step + 1) ** lenpen).item()))
        if len(finished) == beam or step == max_len:
            break
        going_on = [j for j in range(len(words)) if not (words[j] == EOS and scores[j] > -math.inf)][:beam]
        tokens = torch.cat([tokens[beams[going_on]], words[going_on, None]], dim=1)
        cumulative = scores[going_on]
    return sorted(finished, key=lambda hypothesis: -hypothesis[1])


def tiny_translator(vocab_size: int, seed: int = 0) -> TransformerForConditionalGeneration:
    """`tiny_model` with a short length limit: an untrained model rarely stops early, and tests decode it."""
    model = tiny_model(vocab_size, seed=seed)
    model.generation_config.max_length_offset = 8
    return model


def reloaded_with_config(
    model: TransformerForConditionalGeneration, directory: Path, **fields
) -> TransformerForConditionalGeneration:
    """`model` saved into `directory`, its config.json edited to `fields`, loaded again: the same weights computing
    another function, as after a user edits the file."""
    model.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return type(model).from_pretrained(directory)


# --- fairseq's fixtures ---------------------------------------------------------------------------------------


def fairseq_outputs(name: str) -> dict:
    """`fairseq_outputs.json.gz` of a fixture model (schema in tests/fixtures/fairseq/out/README.md)."""
    with gzip.open(FAIRSEQ_FIXTURES / name / "fairseq_outputs.json.gz", "rt", encoding="utf-8") as handle:
        return json.load(handle)


def fairseq_pipeline_cases() -> dict:
    """fairseq's text pipeline on hand-written edge cases, and rows of its sinusoid table."""
    return json.loads((FAIRSEQ_FIXTURES / "pipeline_cases.json").read_text(encoding="utf-8"))


def convert_fairseq_fixture(name: str, **overrides):
    """(model, tokenizer) of a fixture model, converted with its dictionaries and BPE codes."""
    from modeling.fairseq import from_fairseq

    arguments = {"source_lang": "en", "target_lang": "de", "bpe_codes": FAIRSEQ_FIXTURES / "bpecodes", **overrides}
    return from_fairseq(FAIRSEQ_FIXTURES / name / "model.pt", FAIRSEQ_FIXTURES, **arguments)


def convert_fairseq_fixture_into(directory: Path) -> Path:
    """`directory`, written by `modeling.fairseq.convert_fairseq` for the fixtures' transformer_wmt_en_de."""
    from modeling.fairseq import convert_fairseq

    return convert_fairseq(
        FAIRSEQ_FIXTURES / "transformer_wmt_en_de" / "model.pt",
        FAIRSEQ_FIXTURES,
        directory,
        source_lang="en",
        target_lang="de",
        bpe_codes=FAIRSEQ_FIXTURES / "bpecodes",
    )


def right_padded(rows: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask of `rows`, right-padded with `pad`."""
    input_ids = torch.full((len(rows), max(map(len, rows))), pad)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row)
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(pad).long()}


# --- toy language pairs -----------------------------------------------------------------------------------------

EN_DE = {
    "the": "der",
    "small": "kleine",
    "big": "große",
    "dog": "Hund",
    "cat": "Katze",
    "sees": "sieht",
    "likes": "mag",
    "a": "einen",
    "red": "roten",
    "ball": "Ball",
    "house": "Haus",
    "today": "heute",
}
# A second toy pair, one token per word in `word_tokenizer`, for the training tests.
WORDS = "the a small big dog cat sees likes red ball house today".split()
WORD_EN_DE = dict(zip(WORDS, "der ein kleine große Hund Katze sieht mag roten Ball Haus heute".split(), strict=True))


def synthetic_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` (English, German) sentence pairs of 3 to 8 words, with a final full stop."""
    rng = random.Random(seed)
    words = list(EN_DE)
    pairs = []
    for _ in range(count):
        sentence = rng.choices(words, k=rng.randint(3, 8))
        pairs.append((" ".join(sentence) + ".", " ".join(EN_DE[w] for w in sentence) + "."))
    return pairs


def word_for_word(words) -> str:
    return " ".join(WORD_EN_DE[w] for w in words)


def write_corpus(directory: Path, count: int, transform, seed: int = 0) -> Path:
    """train/val files of toy English and `transform(words)` as the target side."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", count), ("val", 16)):
        pairs = [rng.choices(WORDS, k=rng.randint(3, 7)) for _ in range(n)]
        (directory / f"{split}.en").write_text("\n".join(" ".join(p) for p in pairs) + "\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("\n".join(transform(p) for p in pairs) + "\n", encoding="utf-8")
    return directory


# A tiny run of scripts/train.py on `write_corpus` data: the settings of a run configuration file.
TINY_RUN_SETTINGS = {
    "preset": "tiny",
    "source_lang": "en",
    "target_lang": "de",
    "d_model": 32,
    "num_layers": 1,
    "num_heads": 2,
    "ffn_dim": 64,
    "vocab_size": 64,
    "max_tokens_per_device": 64,
    "eval_strategy": "no",
    "logging_steps": 1,
    "report_to": "none",
    "use_cpu": True,
    "disable_tqdm": True,
}


def hub_cache_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, str], main: bool = True) -> Path:
    """A model's entry in the Hub cache `cache` as `hf download` leaves it: the files of `commit` (name: text), and
    refs/main naming the commit if `main`. Returns the snapshot's directory."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "snapshots" / commit).mkdir(parents=True)
    for name, text in files.items():
        (repo / "snapshots" / commit / name).write_text(text)
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def push_translation_dataset(endpoint: str, repo_id: str, splits: dict[str, list[tuple[str, str]]]) -> str:
    """Push (English, German) pairs by split to the loopback Hub's dataset `repo_id`, created if new, as wmt/wmt14
    lays them out (parquet files of its `de-en` configuration); the commit's sha."""
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo(repo_id, repo_type="dataset", exist_ok=True)
    operations = []
    for split, pairs in splits.items():
        table = pyarrow.table({"translation": [{"en": en, "de": de} for en, de in pairs]})
        parquet = io.BytesIO()
        pyarrow.parquet.write_table(table, parquet)
        operations.append(CommitOperationAdd(f"de-en/{split}-00000-of-00001.parquet", parquet.getvalue()))
    configs = "".join(f"  - split: {split}\n    path: de-en/{split}-*\n" for split in splits)
    card = f"---\nconfigs:\n- config_name: de-en\n  data_files:\n{configs}---\n"
    operations.append(CommitOperationAdd("README.md", card.encode()))
    return api.create_commit(repo_id, operations, commit_message="splits", repo_type="dataset").oid


def write_run_config(path: Path, data_dir: Path, output_dir: Path, **settings) -> Path:
    """A YAML run configuration for scripts/train.py: `TINY_RUN_SETTINGS` with `settings` on top."""
    values = {**TINY_RUN_SETTINGS, "data_dir": str(data_dir), "output_dir": str(output_dir), **settings}
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


EN_WORDS = "the a man woman dog runs plays with red ball in park street blue shirt is are two".split()
DE_WORDS = "der die ein mann frau hund läuft spielt mit rotem ball im park straße blauen hemd".split()
PUNCT = [".", ",", "!", "?"]


def make_sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(3, 12))) + rng.choice(PUNCT) for _ in range(n)]


def mixed_corpus() -> list[str]:
    """300 English and 300 German sentences of toy words, interleaved."""
    en, de = make_sentences(EN_WORDS, 300, seed=0), make_sentences(DE_WORDS, 300, seed=1)
    return [s for pair in zip(en, de, strict=True) for s in pair]


# --- tokenizers and checkpoints ---------------------------------------------------------------------------------


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    texts = [text for pair in synthetic_pairs(200) for text in pair]
    return train_shared_bpe(texts, vocab_size=96, min_frequency=1)


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A shared BPE over the toy vocabulary: every word is one token, ids 0-2 are <pad>, <unk>, </s>."""
    sentences = [" ".join(WORDS), " ".join(WORD_EN_DE.values())] * 3
    return train_shared_bpe(sentences, vocab_size=64, min_frequency=1)


def word_level_tokenizer(
    special_tokens: list[str], template: str | None = "$A </s>", **tokens: str
) -> PreTrainedTokenizerFast:
    """A tokenizer of the toy vocabulary, one token per word, built by hand as a user brings one: `special_tokens`
    first, at ids 0, 1, ... in that order; `template` (None: none) is the post-processor of a sentence; `tokens` the
    roles (`pad_token="<pad>"`, ...)."""
    sentences = [" ".join(WORDS), " ".join(WORD_EN_DE.values())]
    tokenizer = Tokenizer(models.WordLevel(unk_token=tokens.get("unk_token")))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(sentences, trainers.WordLevelTrainer(special_tokens=special_tokens))
    if template is not None:
        specials = [(token, tokenizer.token_to_id(token)) for token in special_tokens if token in template.split()]
        tokenizer.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens)


def save_tiny_checkpoint(directory: str | Path) -> tuple[TransformerForConditionalGeneration, PreTrainedTokenizerFast]:
    """Save model and tokenizer side by side, as training does, and return them."""
    tokenizer = tiny_tokenizer()
    model = tiny_translator(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def save_trainer_checkpoint(directory: Path, seed: int, d_model: int = 32) -> dict[str, torch.Tensor]:
    """A Trainer-like checkpoint of a tiny random model: weights, config, tokenizer and training state."""
    tokenizer = train_shared_bpe(["the small dog sees a cat", "der kleine Hund sieht eine Katze"], 48, min_frequency=1)
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    model = TransformerForConditionalGeneration(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        torch.save({"state": name}, directory / name)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": seed, "log_history": []}))
    return load_file(directory / "model.safetensors")


class EchoModel:
    """Stands in for a seq2seq model: "translates" each source into itself and records what it was given.

    With a tokenizer whose decode inverts encode, `translate` must then return its input, line for line.
    """

    def __init__(self):
        self.training = True
        self.device = torch.device("cpu")
        self.config = TransformerConfig(vocab_size=50)
        self.generation_config = GenerationConfig(num_beams=4, length_penalty=0.6)
        self.calls: list[dict] = []

    def eval(self):
        return self.train(False)

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, **kwargs):
        assert not self.training
        self.calls.append({"input_ids": input_ids, "attention_mask": attention_mask, "kwargs": kwargs})
        return input_ids


# --- trainers ---------------------------------------------------------------------------------------------------


def copy_dataset(lengths: list[int], vocab_size: int, seed: int = 0) -> datasets.Dataset:
    """Tokenised copy task: random ids ending in </s>, the target equal to the source."""
    rng = random.Random(seed)
    rows = [[rng.randrange(FIRST_ID, vocab_size) for _ in range(n - 1)] + [EOS] for n in lengths]
    return datasets.Dataset.from_dict(
        {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows], "labels": [list(r) for r in rows]}
    )


def equal_length_halves(vocab_size: int) -> datasets.Dataset:
    """8 examples that a budget of 36 padded tokens cuts into exactly 2 batches: 4 × length 5 and 4 × length 9."""
    return copy_dataset([5, 9] * 4, vocab_size, seed=1)


def training_args(output_dir: Path, **overrides) -> TranslationTrainingArguments:
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "max_grad_norm": 0.0,
        "label_smoothing_factor": 0.1,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-9,
        "optim": "adamw_torch",
        "learning_rate": 1.0,
        "seed": 0,
    }
    return TranslationTrainingArguments(**{**settings, **overrides})


def make_trainer(args, dataset, tokenizer, model, trainer_class=TokenBudgetSeq2SeqTrainer, **kwargs):
    return trainer_class(
        model=model,
        args=args,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=dataset,
        processing_class=tokenizer,
        **kwargs,
    )


def losses(log_history: list[dict]) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


# --- scripts and the local Hub ----------------------------------------------------------------------------------


def run_script(name: str, *args: str, monkeypatch, stdin: bytes | None = None) -> None:
    """Run scripts/NAME in this process (a fresh interpreter would spend most of a test importing torch)."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / name), *map(str, args)])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    runpy.run_path(str(SCRIPTS / name), run_name="__main__")


def script_error(name: str, *args: str, monkeypatch) -> str:
    """The message a script exits with."""
    with pytest.raises(SystemExit) as exit_info:
        run_script(name, *args, monkeypatch=monkeypatch)
    return str(exit_info.value.code)


def subprocess_env(**overrides: str) -> dict[str, str]:
    """This environment for a child process that imports `modeling` from this checkout, whatever checkout the
    package was installed from (a script's own folder, not the checkout, comes first on its sys.path), on one thread
    (tiny models: extra threads only contend with the other test processes)."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **overrides}


def hub_env(endpoint: str, hf_home: Path, token: str | None) -> dict[str, str]:
    """Environment of a fresh process talking to the local Hub only, with its own empty cache."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def requests_made(root: Path) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request the local Hub served, in order."""
    lines = (root / "requests.jsonl").read_text().splitlines() if (root / "requests.jsonl").exists() else []
    return [(r["method"], r["path"], r["status"]) for r in map(json.loads, lines)]


@contextmanager
def stalled_endpoint() -> Iterator[str]:
    """A loopback server that accepts connections and never answers; it stops with the block."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    stop, held = threading.Event(), []

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])  # keep it open, say nothing
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        server.close()


def closed_port_endpoint() -> str:
    """An endpoint on a loopback port nothing listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@contextmanager
def fed_pipe(path: Path, text: str) -> Iterator[Path]:
    """A FIFO at `path` that a thread fills with `text` once, as `<(command)` or a shell pipe gives a file: a second
    open of it does not read `text` again. Yields the path; joins the writer at the end."""
    os.mkfifo(path)

    def write() -> None:
        with open(path, "wb") as handle:  # blocks until a reader opens it
            handle.write(text.encode())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        writer.join(timeout=10)


@contextmanager
def training_run_holding(run: Path) -> Iterator[str]:
    """`run` held by a training run still going: its `.training.lock`, locked through another open file (which flock
    treats as another process would be), naming the holder it yields."""
    holder = "pid 4242 on node-7, since 2026-12-07 09:00:00 +0000"
    with open(run / ".training.lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.truncate(0)  # as a run taking the lock does
        lock.write(holder + "\n")
        lock.flush()
        yield holder
