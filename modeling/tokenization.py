"""The shared source/target BPE vocabulary (Vaswani et al. 2017, Sec. 5.1).

"Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary of about
37000 tokens." We train one BPE over both languages with 🤗 tokenizers and wrap it in a
`PreTrainedTokenizerFast`, so it saves and loads with `save_pretrained` / `AutoTokenizer.from_pretrained`
and needs no remote code.

Choices the rest of the project relies on:

- special tokens `<pad>` = 0, `<unk>` = 1, `</s>` = 2; every encoded sequence (source and target) ends
  with `</s>`, which the model also uses as decoder start token (fairseq convention);
- raw text in, raw text out: NFKC normalisation (`normalizer`), then sentencepiece-style Metaspace
  pre-tokenisation (spaces become "▁"), so `decode(encode(s)) == NFKC(s)` for any text made of characters seen in
  training, repeated and trailing spaces included, the Thai and Lao letters NFKC splits kept whole. Two
  exceptions: unseen characters become `<unk>`, as in the paper's BPE, and one leading space is lost (Metaspace
  reads it as the word boundary it would prepend anyway). No Moses tokeniser is needed; BLEU is computed on
  detokenised text;
- the vocabulary size is a multiple of 8 (tensor-core friendly embedding matrix). When BPE runs out of
  merges before reaching the requested size, the vocabulary is padded to the next multiple of 8 with
  `<unused{i}>` entries in the BPE model itself: no merge produces them, so encoding never emits them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .checkpoints import RUN_IDENTITY_FILE, list_checkpoints
from .files import iter_lines
from .tokenization_fairseq import FairseqTokenizer

PAD_TOKEN, UNK_TOKEN, EOS_TOKEN = "<pad>", "<unk>", "</s>"
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN, EOS_TOKEN]  # ids 0, 1, 2 in this order
VOCAB_MULTIPLE = 8
TOKENIZER_FILE, TOKENIZER_CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"
MODEL_MAX_LENGTH = 1024
# What transformers 5's tokenizer from_pretrained adds to its init_kwargs: how it was loaded, not what it is.
LOADING_ARGUMENTS = ("is_local", "local_files_only")
# How often the thread waiting for a BPE to be trained looks for a signal to handle.
SIGNAL_CHECK_SECONDS = 0.1

logger = logging.getLogger(__name__)

# Characters that show nothing: zero-width space, joiners, direction marks and embeddings, word joiner and the
# invisible operators, soft hyphen, byte-order mark. The tokenizer keeps them (as `<unk>` when unseen).
INVISIBLE_CHARACTERS = frozenset(
    "\u00ad\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
)
_INVISIBLE = re.compile(f"[{''.join(sorted(INVISIBLE_CHARACTERS))}]")


# Letters that NFKC splits into a spelling their script is not written in, put back together after it (NFC leaves
# them whole): Thai and Lao SARA AM ("ำ", "ຳ": NIKHAHIT + SARA AA), Lao HO NO and HO MO ("ໜ", "ໝ": HO SUNG + NO / MO,
# which Lao reads as the same letters). Split, every output word with one (น้ำ "water", ทำ "do", ໜຶ່ງ "one", ໝາ "dog")
# would differ from the references and from what its readers search for.
_RECOMPOSED = (
    ("\u0e4d\u0e32", "\u0e33"),
    ("\u0ecd\u0eb2", "\u0eb3"),
    ("\u0eab\u0e99", "\u0edc"),
    ("\u0eab\u0ea1", "\u0edd"),
)


def normalizer() -> normalizers.Normalizer:
    """NFKC, with the letters it splits that their script writes whole kept whole (`_RECOMPOSED`)."""
    recompose = [normalizers.Replace(split, whole) for split, whole in _RECOMPOSED]
    return normalizers.Sequence([normalizers.NFKC(), *recompose])


def visible_words(text: str) -> list[str]:
    """The whitespace-separated words of `text` once `INVISIBLE_CHARACTERS` are removed."""
    # Searched first: most sentences hold none, and a search costs far less than a substitution (or str.translate,
    # 10× `split()` on non-ASCII text): cleaning WMT's 4.5M pairs counts words 9M times.
    return (_INVISIBLE.sub("", text) if _INVISIBLE.search(text) else text).split()


def is_blank(line: str) -> bool:
    """Whether `line` holds nothing to translate or learn from: only whitespace and `INVISIBLE_CHARACTERS`, which
    the tokenizer would turn into `<unk>` alone and a model into an invented sentence."""
    return not visible_words(line)


def check_vocab_size(vocab_size: int) -> None:
    """A vocabulary must hold more than the special tokens; refused in one line otherwise."""
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")


def train_shared_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    show_progress: bool = False,
    model_max_length: int = MODEL_MAX_LENGTH,
    source: str | None = None,
) -> PreTrainedTokenizerFast:
    """Train one BPE over sentences of both languages and return a ready-to-use HF tokenizer.

    `texts` is consumed once, lazily: pass a generator (e.g. `iter_text_files` or `iter_corpus_text`)
    so that WMT-sized corpora are never held in memory. The vocabulary, special tokens included, has a size
    that is a multiple of 8: `vocab_size` rounded up, as a rule. Fewer when BPE runs out of pairs seen
    `min_frequency` times (padded with unreachable `<unused{i}>` entries to the next multiple of 8); more, with
    a warning, when the corpus's distinct characters and the special tokens alone exceed it, since BPE keeps
    every character. A ValueError when `texts` holds no non-blank line; `source` (say the file names) says where
    they came from in its message.
    """
    check_vocab_size(vocab_size)
    if min_frequency < 0:
        raise ValueError(f"min_frequency must be at least 0 (occurrences of a pair to merge), got {min_frequency}")
    target_size = round_up(vocab_size, VOCAB_MULTIPLE)

    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=target_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=show_progress,
    )
    has_text = False
    abandoned = threading.Event()

    def watched(texts: Iterable[str]) -> Iterator[str]:
        nonlocal has_text
        for text in texts:
            if abandoned.is_set():  # the caller was stopped by a signal: read no more
                return
            has_text = has_text or not is_blank(text)
            yield text

    try:
        _train_where_signals_are_handled(tokenizer, watched(texts), trainer)
    except BaseException:
        abandoned.set()
        raise
    if not has_text:  # else an empty file would give a tokenizer of special tokens, saved as a success
        raise ValueError(
            f"no text to train the BPE on: {source or 'the input'} hold(s) no line with a non-blank character"
        )
    trained_size = tokenizer.get_vocab_size()
    tokenizer = _pad_vocab(tokenizer, round_up(trained_size, VOCAB_MULTIPLE))
    if trained_size > target_size:
        logger.warning(
            "the vocabulary has %d entries, more than vocab_size=%d: the corpus has %d distinct characters, all "
            "kept by BPE, and %d special tokens (the size is theirs rounded up to a multiple of %d, without merges)",
            tokenizer.get_vocab_size(),
            vocab_size,
            trained_size - len(SPECIAL_TOKENS),
            len(SPECIAL_TOKENS),
            VOCAB_MULTIPLE,
        )

    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # would turn "a ." into "a." and break the round trip
        # "</s>" or "<pad>" written in a sentence is text: read as the control token, it ends a source early for the
        # encoder and teaches a model, from a training target, to stop mid-sentence.
        split_special_tokens=True,
    )


def _train_where_signals_are_handled(tokenizer: Tokenizer, texts: Iterator[str], trainer: trainers.Trainer) -> None:
    """`tokenizer.train_from_iterator`, in a thread of its own while this one waits. tokenizers trains with the GIL
    released and reads `texts` from its own threads, so the calling thread ran no Python until the BPE was trained:
    a signal's handler (a scheduler's SIGTERM, Ctrl-C, the run's `stopping_at_once`) waited for the whole training,
    20-33 minutes for English-French WMT, past any grace period before the kill. Waiting in `join`, the main
    thread runs the handlers within `SIGNAL_CHECK_SECONDS`; what they raise leaves the training thread to end with
    the process."""
    failures: list[BaseException] = []

    def train() -> None:
        try:
            tokenizer.train_from_iterator(texts, trainer=trainer)
        except BaseException as error:  # raised again in the caller's thread
            failures.append(error)

    training = threading.Thread(target=train, name="BPE training", daemon=True)
    training.start()
    while training.is_alive():
        # A while at a time: the kernel may hand the signal to one of tokenizers' threads, which does not wake a
        # `join` without a timeout; back in Python, this thread runs the handler.
        training.join(SIGNAL_CHECK_SECONDS)
    if failures:
        raise failures[0]


def check_tokenizer_destination(directory: str | os.PathLike) -> None:
    """Refuse, in one line, to write a tokenizer into a directory that holds a model, or a training run (its
    identity, its checkpoints: one still training has no model at its top yet): the model's token ids are those of
    the tokenizer it was trained with, and another one there would make it translate nonsense, or the run's
    requeue refuse its own output directory as "written by a different run"."""
    directory = Path(directory)
    found = [directory / "config.json"] if (directory / "config.json").is_file() else []
    found += sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin"))
    if found:
        raise FileExistsError(
            f"{directory} holds a model ({found[0].name}): a new tokenizer there would replace the one it was trained "
            "with; write the tokenizer into another directory"
        )
    run = [directory / RUN_IDENTITY_FILE] if (directory / RUN_IDENTITY_FILE).is_file() else []
    run += list_checkpoints(directory) if directory.is_dir() else []
    if run:
        raise FileExistsError(
            f"{directory} holds a training run ({run[0].name}): a new tokenizer there would replace the one it trains "
            "with; write the tokenizer into another directory"
        )


def missing_tokenizer_files(directory: str | os.PathLike) -> list[str]:
    """The files of the tokenizer saved in `directory` (by `save_pretrained`) that are not there, for a refusal that
    names them: transformers' errors name none ("Couldn't instantiate the backend tokenizer ... install
    sentencepiece", a TypeError of a None path). Without tokenizer_config.json, which names the tokenizer's class,
    transformers takes the class registered for the model type, the fairseq tokenizer, whose error is about its
    languages. A Hugging Face tokenizer reads tokenizer.json; a converted fairseq one its vocabularies and BPE
    merges. Another class, or a tokenizer_config.json that does not parse, names none: its loading says more."""
    directory = Path(directory)
    config = directory / TOKENIZER_CONFIG_FILE
    if not config.is_file():
        return [TOKENIZER_CONFIG_FILE]
    try:
        tokenizer_class = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return []
    if tokenizer_class in (PreTrainedTokenizerFast.__name__, "PreTrainedTokenizerFast"):  # 5.x's name, 4.x's
        needed = [TOKENIZER_FILE]
    elif tokenizer_class == FairseqTokenizer.__name__:
        needed = list(FairseqTokenizer.vocab_files_names.values())
    else:
        needed = []
    return [name for name in needed if not (directory / name).is_file()]


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is at least `n`."""
    return -(-n // multiple) * multiple


def _pad_vocab(tokenizer: Tokenizer, size: int) -> Tokenizer:
    """Append unreachable `<unused{i}>` entries to the BPE vocabulary until it has `size` entries."""
    missing = size - tokenizer.get_vocab_size()
    if missing <= 0:
        return tokenizer
    state: dict[str, Any] = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    first = len(vocab)
    vocab.update({f"<unused{i}>": first + i for i in range(missing)})
    return Tokenizer.from_str(json.dumps(state))


def iter_text_files(paths: Sequence[str | os.PathLike]) -> Iterator[str]:
    """Yield every line of every file in turn (`iter_lines`: gzip, xz and bzip2 data are decompressed on the fly).
    A missing file is named before the first line is read, not after the files before it."""
    for path in paths:
        if os.fspath(path) != "-" and not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
    for path in paths:
        yield from iter_lines(path)


def iter_corpus_text(dataset: Any, languages: Sequence[str], *, batch_size: int = 1000) -> Iterator[str]:
    """Yield the sentences of `languages` from a `datasets.Dataset` with a `translation` column.

    Streams from the Arrow file in batches, so both sides of WMT14 train (9M sentences) are never
    materialised as Python lists.
    """
    for batch in dataset.select_columns(["translation"]).iter(batch_size=batch_size):
        for pair in batch["translation"]:
            for language in languages:
                yield pair[language]
