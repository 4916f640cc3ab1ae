"""The shared source/target BPE vocabulary (Vaswani et al. 2017, Sec. 5.1).

"Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary of about
37000 tokens." We train one BPE over both languages with 🤗 tokenizers and wrap it in a
`PreTrainedTokenizerFast`, so it saves and loads with `save_pretrained` / `AutoTokenizer.from_pretrained`
and needs no remote code.

Choices the rest of the project relies on:

- special tokens `<pad>` = 0, `<unk>` = 1, `</s>` = 2; every encoded sequence (source and target) ends
  with `</s>`, which the model also uses as decoder start token (fairseq convention);
- raw text in, raw text out: NFKC normalisation, then sentencepiece-style Metaspace pre-tokenisation
  (spaces become "▁"), so `decode(encode(s)) == NFKC(s)` for any text made of characters seen in
  training, repeated and trailing spaces included. Two exceptions: unseen characters become `<unk>`,
  as in the paper's BPE, and one leading space is lost (Metaspace reads it as the word boundary it
  would prepend anyway). No Moses tokeniser is needed; BLEU is computed on detokenised text;
- the vocabulary size is a multiple of 8 (tensor-core friendly embedding matrix). When BPE runs out of
  merges before reaching the requested size, the vocabulary is padded with `<unused{i}>` entries in the
  BPE model itself: no merge produces them, so encoding never emits them.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, UNK_TOKEN, EOS_TOKEN = "<pad>", "<unk>", "</s>"
SPECIAL_TOKENS = [PAD_TOKEN, UNK_TOKEN, EOS_TOKEN]  # ids 0, 1, 2 in this order
VOCAB_MULTIPLE = 8
MODEL_MAX_LENGTH = 1024


def train_shared_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    show_progress: bool = False,
    model_max_length: int = MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train one BPE over sentences of both languages and return a ready-to-use HF tokenizer.

    `texts` is consumed once, lazily: pass a generator (e.g. `iter_text_files` or `iter_corpus_text`)
    so that WMT-sized corpora are never held in memory. The vocabulary ends up with
    `vocab_size` rounded up to a multiple of 8 entries, special tokens included.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    target_size = _round_up(vocab_size, VOCAB_MULTIPLE)

    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=target_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer = _pad_vocab(tokenizer, _round_up(tokenizer.get_vocab_size(), VOCAB_MULTIPLE))

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
    )


def _round_up(n: int, multiple: int) -> int:
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
    """Yield every line of every file in turn; files ending in `.gz` are decompressed on the fly."""
    for path in paths:
        yield from iter_lines(path)


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """Yield the lines of a UTF-8 text file (plain or gzipped; `-`: standard input) without their line terminators.

    Only "\\n" ends a line (a stray "\\r" or U+2028 inside a sentence must not break line alignment of
    parallel files). Lines are read as bytes and decoded one at a time, so that an invalid UTF-8 sequence raises
    a ValueError naming the file and its exact line (`file:line`); a truncated or corrupt gzip file raises one
    naming the file and the number of lines read.
    """
    path = os.fspath(path)
    if path == "-":
        path, source = "<stdin>", contextlib.nullcontext(sys.stdin.buffer)  # read, not closed
    else:
        source = (gzip.open if path.endswith(".gz") else open)(path, "rb")
    line_number = 0
    try:
        with source as handle:
            for raw in handle:
                line_number += 1
                yield raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}:{line_number}: not valid UTF-8 ({err.reason} at byte {err.start} of the line); "
            "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from err
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ValueError(f"cannot read {path} after {line_number} lines: {err}") from err


def reads_once(path: str | os.PathLike) -> bool:
    """Whether `path` can be read only once: `-` (standard input), a pipe (`<(command)`, `/dev/stdin` fed by one),
    a FIFO or a terminal. A second `open` of it does not start again from its first line, so whoever reads it must
    read it once, from the start to the end. False for a path that does not exist (`iter_lines` names it)."""
    path = os.fspath(path)
    if path == "-":
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def iter_corpus_text(dataset: Any, languages: Sequence[str], *, batch_size: int = 1000) -> Iterator[str]:
    """Yield the sentences of `languages` from a `datasets.Dataset` with a `translation` column.

    Streams from the Arrow file in batches, so both sides of WMT14 train (9M sentences) are never
    materialised as Python lists.
    """
    for batch in dataset.select_columns(["translation"]).iter(batch_size=batch_size):
        for pair in batch["translation"]:
            for language in languages:
                yield pair[language]
