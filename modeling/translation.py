"""Translating in bulk, and loading this project's checkpoints for it.

`translate` sorts sentences by length into token-budget batches and returns one line per input line, in order;
`translate_file` does so for a file of any length a chunk at a time, resuming after a kill; `generate_batches` runs
`generate()` on several batches at once on a CPU's cores; `load_model_and_tokenizer` loads a saved or Hub checkpoint
of this model and refuses anything else. Only torch, transformers and tqdm are needed: deploying needs none of the
training or evaluation extras.
"""

import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager, nullcontext
from itertools import chain, islice
from pathlib import Path
from typing import IO, Any

import torch
from huggingface_hub import try_to_load_from_cache
from huggingface_hub.errors import RevisionNotFoundError
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .batching import token_budget_batches
from .checkpoints import config_identity, list_checkpoints, named_if_removed, removed_by_rotation, weights_problems
from .configuration_transformer import TransformerConfig
from .export.common import refuse_an_export
from .files import (
    UnwritableError,
    atomic_path,
    check_distinct_outputs,
    check_writable,
    file_sha256,
    fsync_path,
    is_open_as,
    iter_lines,
    reads_once,
    write_error,
    write_json,
    written_path,
)
from .hub_client import (
    MODEL_REPO_FILES,
    TOKENIZER_FILES,
    has_any_file,
    holds_tokenizer,
    httpx2,
    looks_like_local_path,
    naming_hub_failures,
    offline_cache_error,
    pinned_commit,
    use_hub_timeouts,
)
from .tokenization import LOADING_ARGUMENTS, is_blank, missing_tokenizer_files

logger = logging.getLogger(__name__)

# What some reader of a text file ends a line at: "\n"; "\r", at which Python's universal newlines do (`sacrebleu REF
# < hypotheses` reads them so, as fairseq's scripts and `open()` do); the other separators of `str.splitlines`
# (vertical tab, form feed, the file, group and record separators, NEL, U+2028, U+2029). A model trained on web text
# (ParaCrawl and CommonCrawl hold them inside sentences) emits them: a translation holding one read as two lines there,
# every later one beside another sentence (sacreBLEU refuses such a file). Every score (13a, chrF, Moses) reads each
# as a space.
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


class TranslationInProgressError(RuntimeError):
    """Another process is translating into the same file."""


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    workers: int = 1,
    progress: bool = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Translate `sentences` with `model.generate`, returning one line per input line, in the input order.

    Sentences are sorted by length and grouped into batches of at most `max_tokens` padded tokens *counting every
    beam*: at most `max_tokens / num_beams` padded source tokens per batch, since beam search decodes `num_beams`
    hypotheses of each sentence at once (beam 1000 takes one sentence at a time rather than running out of
    memory). Sorting wastes far less compute on padding than fixed-size batches. Empty or blank lines (`is_blank`) are
    never sent to the model and come back as empty lines, so line-aligned files stay aligned; a character in a
    translation that some reader of a text file ends a line at (`_LINE_BREAKS`) becomes a space. Decoding settings
    default to the model's generation config (the paper's beam 4 and length penalty); `num_beams` and
    `generate_kwargs` override them. `workers` > 1 translates that many batches at once (`generate_batches`).

    Calls may overlap on several threads sharing one model and tokenizer (a service), each with its own settings,
    giving what they give one at a time. A fast tokenizer's padding and truncation, though, are settings of the Rust
    tokenizer that every thread shares: other code tokenizing with them (`padding=True`, `truncation=True`) while a
    call runs can pad or cut the sources it reads (transformers #47085): give that code a tokenizer of its own.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
    check_one_translation_per_line(model, generate_kwargs)
    check_sentences(sentences)
    outputs = [""] * len(sentences)
    todo = [i for i, sentence in enumerate(sentences) if not is_blank(sentence)]
    if not todo:
        return outputs
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    beams = _generation_setting(model, generate_kwargs, "num_beams") or 1
    source_budget = max(1, max_tokens // max(int(beams), 1))

    input_ids = tokenizer([sentences[i].strip() for i in todo])["input_ids"]
    lengths = [len(ids) for ids in input_ids]
    order = sorted(range(len(todo)), key=lambda k: -lengths[k])

    batches = list(token_budget_batches(lengths, order, source_budget))
    features = (  # padded on the right whatever the tokenizer's padding_side: left padding shifts the positions
        tokenizer.pad({"input_ids": [input_ids[k] for k in batch]}, padding_side="right", return_tensors="pt").to(
            model.device
        )
        for batch in batches
    )
    with _EVALUATION_MODE.of(model):
        generated_batches = generate_batches(model, features, workers=workers, **generate_kwargs)
        # closing: on an error here the workers stop now, not when the traceback lets the generator go
        with closing(generated_batches), tqdm(total=len(todo), disable=not progress, unit="sent") as bar:
            for batch, generated in zip(batches, generated_batches, strict=True):
                texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
                for k, text in zip(batch, texts, strict=True):
                    outputs[todo[k]] = _LINE_BREAKS.sub(" ", text).strip()
                bar.update(len(batch))
    return outputs


class _EvaluationMode:
    """Calls of `translate` on one model, overlapping on several threads (a service): the first puts the model in
    evaluation mode, the last to end gives it back the mode the first found. (Each call restoring the mode it found,
    a call that began while another ran found evaluation mode, and the first to end put a model found in training
    mode back into it while the other still decoded: its later batches with dropout, and the model left in
    evaluation mode.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[int, bool]] = {}  # id(model): calls under way, the mode before the first

    @contextmanager
    def of(self, model: PreTrainedModel) -> Iterator[None]:
        key = id(model)  # the calls under way hold the model: no other takes its id meanwhile
        with self._lock:
            calls, was_training = self._calls.get(key, (0, model.training))
            self._calls[key] = (calls + 1, was_training)
            model.eval()
        try:
            yield
        finally:
            with self._lock:
                calls, was_training = self._calls.pop(key)
                if calls > 1:
                    self._calls[key] = (calls - 1, was_training)
                else:
                    model.train(was_training)


_EVALUATION_MODE = _EvaluationMode()


def generate_batches(
    model: PreTrainedModel,
    batches: Iterable[Mapping[str, torch.Tensor]],
    *,
    workers: int = 1,
    **generate_kwargs: Any,
) -> Iterator[torch.Tensor]:
    """`model.generate(**batch, **generate_kwargs)` of each batch, in order, under `torch.inference_mode`.

    With `workers` > 1 (a model on the CPU), that many batches are decoded at once, each on its own thread with an
    equal share of torch's threads, which are set to `torch.get_num_threads() // workers` (at least 1) meanwhile:
    CTranslate2's `inter_threads`. A decoding step of a small model is many small operators, which a second core
    hardly speeds up; a second batch beside it keeps that core busy (most of the time is spent in ATen, which
    releases the GIL). Each thread holds a batch's activations and cache. `batches` is read at most `2 * workers`
    ahead.
    """
    check_workers(model, workers)
    if workers == 1:
        return (_generate(model, batch, generate_kwargs) for batch in batches)
    return _generate_side_by_side(model, batches, workers, generate_kwargs)


def _generation_setting(model: PreTrainedModel, generate_kwargs: Mapping[str, Any], name: str) -> Any:
    """What generate() will use for `name`: the keyword argument, else the `generation_config` given (where it sets
    one), else the model's."""
    if name in generate_kwargs:
        return generate_kwargs[name]
    given = generate_kwargs.get("generation_config")
    value = getattr(given, name, None) if given is not None else None
    return value if value is not None else getattr(model.generation_config, name, None)


def check_one_translation_per_line(model: PreTrainedModel, generate_kwargs: Mapping[str, Any]) -> None:
    """Refuse, before any work, the generate() settings that would not give one sequence of ids per sentence."""
    for name, takes in (("num_return_sequences", 1), ("return_dict_in_generate", False)):
        value = _generation_setting(model, generate_kwargs, name)
        if value is not None and value != takes:
            raise ValueError(
                f"translate() gives one translation per line, so {name}={value!r} cannot apply: call "
                "model.generate() itself for several hypotheses or their scores."
            )


def check_sentences(sentences: list[str]) -> None:
    """Refuse, before any work, in one line naming it, what `translate` cannot take as a list of lines: one string
    (whose characters would each be translated as a line), a line that is not a str, a line that is not valid
    Unicode (a lone surrogate, as `json.loads` gives for a "\\ud800" escape; the tokenizer's TypeError names
    no line)."""
    if isinstance(sentences, (str, bytes)):  # a str would be translated a character a line
        raise TypeError(f"translate() takes a list of lines, got one {type(sentences).__name__}: pass [text].")
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(f"sentences[{index}] is {type(sentence).__name__}, not str: translate() takes text.")
        if not sentence.isascii():
            try:
                sentence.encode()
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"sentences[{index}] is not valid Unicode: {error.object[error.start : error.end]!r} at character "
                    f"{error.start} is a lone surrogate (text decoded with errors='surrogateescape', or a JSON "
                    "escape of half a pair?)."
                ) from None


def check_workers(model: PreTrainedModel, workers: int) -> None:
    """Refuse a `workers` that `generate_batches` cannot use, before any work."""
    if workers < 1:
        raise ValueError(f"workers must be positive, got {workers}.")
    if workers > 1 and model.device.type != "cpu":
        raise ValueError(
            f"workers={workers} decodes batches side by side on CPU cores; the model is on {model.device}, where "
            "one batch at a time (a larger one) fills the device: use 1 worker."
        )


class _ThreadShares:
    """While calls decode side by side, each divides torch's thread count from before the first of them among its
    workers, and each puts that count back on its own thread when it ends. (Under OpenMP a thread keeps the count it
    set and a new thread starts from the last count set anywhere: each call restoring the count it found, a call
    that began while another ran left the halved count behind for its thread and every later one.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._threads_before = 0

    @contextmanager
    def divided_among(self, workers: int) -> Iterator[None]:
        with self._lock:
            if self._calls == 0:
                self._threads_before = torch.get_num_threads()
            self._calls += 1
            torch.set_num_threads(max(1, self._threads_before // workers))  # every worker takes its share
        try:
            yield
        finally:
            with self._lock:
                self._calls -= 1
                torch.set_num_threads(self._threads_before)


_THREAD_SHARES = _ThreadShares()


def _generate_side_by_side(
    model: PreTrainedModel, batches: Iterable[Mapping[str, torch.Tensor]], workers: int, generate_kwargs: dict
) -> Iterator[torch.Tensor]:
    with _THREAD_SHARES.divided_among(workers):
        pool = ThreadPoolExecutor(workers, thread_name_prefix="generate")
        pending: deque[Future] = deque()
        try:
            for batch in batches:
                pending.append(pool.submit(_generate, model, batch, generate_kwargs))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _generate(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], generate_kwargs: dict) -> torch.Tensor:
    with torch.inference_mode():  # per thread: a worker does not inherit its caller's mode
        return model.generate(**batch, **generate_kwargs)


def partial_translation_path(destination: str | os.PathLike) -> Path:
    """Where `translate_file` keeps the translation of `destination` under way: `.NAME.partial` beside it, or beside
    the file it leads to if it is a link (`files.written_path`)."""
    destination = written_path(destination)
    return destination.with_name(f".{destination.name}.partial")


def translate_file(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str | os.PathLike,
    destination: str | os.PathLike | None = None,
    *,
    chunk_lines: int = 10_000,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    workers: int = 1,
    progress: bool = False,
    **generate_kwargs: Any,
) -> int:
    """Translate the lines of `source` (plain, .gz, or `-`: stdin) into `destination` (None: stdout), one line
    per line, in order, empty lines kept; return the number of lines.

    The source is read and translated `chunk_lines` lines at a time (each chunk sorted into batches by
    `translate`), so memory stays that of one chunk however long the file. To stdout each chunk is written as soon
    as it is translated. To a file, each chunk is appended to `partial_translation_path(destination)` and flushed
    to disk, beside a record of how far it got (lines and bytes, sha256 of the source lines done, fingerprints of
    the weights and the tokenizer, the decoding settings); `destination` is replaced by the complete translation
    only at the end, atomically. After a kill, the same call resumes after the last chunk written (the source is
    known by its lines, so the same file at another path resumes, and so does the same text piped in again: the
    lines of a pipe compared are kept aside on disk meanwhile, in case they are another text's); a partial
    translation of another text, model or decoding is started over (logged), never continued (`workers`, like
    torch's thread count, is not part of the decoding: a rerun with another number resumes); a second process
    translating into the same file is refused (`TranslationInProgressError`).
    """
    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be positive, got {chunk_lines}.")
    check_workers(model, workers)
    check_one_translation_per_line(model, generate_kwargs)
    settings = {"max_tokens": max_tokens, "num_beams": num_beams, **generate_kwargs}
    if destination is None:
        count = 0
        with tqdm(disable=not progress, unit="sent", desc="translated") as bar:
            for chunk in _chunks(iter_lines(source), chunk_lines):
                sys.stdout.write(as_lines(translate(model, tokenizer, chunk, workers=workers, **settings)))
                sys.stdout.flush()
                count += len(chunk)
                bar.update(len(chunk))
        return count

    check_writable(destination)
    check_distinct_outputs({"the destination": destination}, {"the source": source})
    destination = written_path(destination)  # a link stays one: the file it leads to is replaced
    # the source by its lines (hashed in the record), not its path: a requeued job may see it elsewhere
    partial = _PartialTranslation(destination, translation_identity(model, tokenizer, settings), source)
    # the longest name written (the record's temporary): a name too long for it failed after the first chunk, every
    # run, naming only that temporary file
    check_writable(partial.record_path)
    try:
        with _open_partial(partial.path, destination) as handle:  # appends; cut below to what the record vouches for
            _lock_or_refuse(handle, destination)
            lines = partial.resume(handle)
            with tqdm(disable=not progress, unit="sent", desc="translated", initial=partial.lines) as bar:
                for chunk in _chunks(lines, chunk_lines):
                    translations = translate(model, tokenizer, chunk, workers=workers, **settings)
                    partial.append(handle, chunk, as_lines(translations))
                    bar.update(len(chunk))
            partial.check_alone(handle, partial.bytes)
            os.replace(partial.path, destination)  # still locked: no other process appends meanwhile
        fsync_path(destination.parent)
    except OSError as error:  # a full disk, an NFS server's EIO: "[Errno 5] Input/output error" named no file
        refused = write_error(error, destination)
        if refused is not None:
            raise refused from error
        raise
    partial.record_path.unlink(missing_ok=True)
    return partial.lines


def translation_identity(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: Mapping[str, Any]
) -> dict[str, str]:
    """What makes one translation of a text another's (`translate_file` resumes only its own): fingerprints of the
    weights and the tokenizer, the model's config (an edited `config.json`, a conversion run again with other
    options: the same weights computing another function), and the decoding, `settings` (`max_tokens`,
    `num_beams`, generate() keywords) over the model's generation config."""
    # num_beams None decodes with the generation config's beam count (`translate`): kept as None over it, a rerun
    # naming that same count (`--num-beams 4` for a model's 4) was another decoding, its chunks done thrown away
    given = {name: value for name, value in settings.items() if not (name == "num_beams" and value is None)}
    return {
        "model": model_fingerprint(model),
        "config": json.dumps(config_identity(model.config.to_dict()), sort_keys=True),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "decoding": json.dumps({**model.generation_config.to_dict(), **given}, sort_keys=True, default=repr),
    }


class _PartialTranslation:
    """A translation under way into `destination`: its lines so far in `.NAME.partial`, and the record of what
    they are (`.NAME.partial.json`: lines, bytes, sha256 of the source lines translated, `identity`: model,
    tokenizer and decoding, and the source's path, for whoever reads the record)."""

    def __init__(self, destination: Path, identity: dict[str, str], source: str | os.PathLike):
        self.destination, self.path = destination, partial_translation_path(destination)
        self.record_path = self.path.with_name(self.path.name + ".json")
        self.identity, self.source = identity, "-" if os.fspath(source) == "-" else os.path.abspath(source)
        self.read_once = reads_once(source)  # a pipe: read once, from the start, never again
        self.digest, self.lines, self.bytes = hashlib.sha256(), 0, 0

    def resume(self, handle: IO[bytes]) -> Iterator[str]:
        """The source lines still to translate: those after the recorded ones if the record is of this identity
        and the source still begins with the lines it translated (read once, hashed on the way), else all of them.
        Cuts the file to what is kept. A pipe, which cannot be read again, has the lines it compares kept aside
        in an unnamed temporary file beside the destination, to be translated from there if they are another
        text's (a pipe started over every time: a piped translation killed near its end lost all of it)."""
        lines = iter_lines(self.source)
        earlier = self._earlier_record()
        if earlier is not None:
            done, size, source_sha256 = earlier
            kept = tempfile.TemporaryFile(dir=self.path.parent) if self.read_once else None
            self._hash(islice(lines, done), kept)
            if self.digest.hexdigest() == source_sha256:
                self.lines, self.bytes = done, size
                logger.info("Resuming the translation into %s after line %d", self.destination, self.lines)
                if kept is not None:
                    kept.close()
            else:
                logger.warning(
                    "%s holds the translation of another text than %s: starting over", self.path, self.source
                )
                self.digest = hashlib.sha256()
                lines = iter_lines(self.source) if kept is None else chain(_read_back(kept), lines)
        handle.truncate(self.bytes)  # a chunk written after the record's last update is written again
        return lines

    def append(self, handle: IO[bytes], chunk: list[str], translations: str) -> None:
        """Write a chunk's translations to disk, then record them."""
        text = translations.encode()
        self.check_alone(handle, self.bytes)
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
        self.check_alone(handle, self.bytes + len(text))
        self._hash(chunk)
        self.lines, self.bytes = self.lines + len(chunk), self.bytes + len(text)
        write_json(
            self.record_path,
            {
                **self.identity,
                "source": self.source,
                "lines": self.lines,
                "bytes": self.bytes,
                "source_sha256": self.digest.hexdigest(),
            },
        )

    def check_alone(self, handle: IO[bytes], size: int) -> None:
        """Refuse to go on if the partial file is not this run's alone: not `size` bytes long, or no longer at its
        path. Where no lock guards it (`_lock_or_refuse`), a second run into the same destination appends its
        chunks to the same file, or renames it into place while this one still appends: the output held both runs'
        lines (18 for a source of 12), with no error."""
        if not is_open_as(handle, self.path) or os.fstat(handle.fileno()).st_size != size:
            raise TranslationInProgressError(
                f"another process wrote into {self.path} while this one translated into {self.destination} (two "
                "runs at once where the file system gives no locks): stop it, then run this command again"
            )

    def _earlier_record(self) -> tuple[int, int, str] | None:
        """(lines, bytes, sha256 of the source lines) of an earlier run with this identity whose partial file holds
        at least what its record says; otherwise None (logged, saying why, when there was a record)."""
        if not self.record_path.is_file():
            return None
        try:
            earlier = json.loads(self.record_path.read_text(encoding="utf-8"))
            differs = [key for key, value in self.identity.items() if earlier.get(key) != value]
            lines, size, source_sha256 = int(earlier["lines"]), int(earlier["bytes"]), str(earlier["source_sha256"])
            if differs:
                why = f"another {', '.join(differs)}"
            elif not 0 < lines <= size:  # each line translated is one "\n" at least: resumed, lines would be lost
                why = f"its record {self.record_path.name} counts {lines} lines in {size} bytes"
            elif size > self.path.stat().st_size:
                why = f"{self.path.name} is shorter than its record says"
            elif self._holds_a_line_break_inside_a_line(size):
                why = f"{self.path.name} holds a line break inside a translation, written before they became spaces"
            else:
                return lines, size, source_sha256
        except (OSError, ValueError, KeyError, TypeError) as error:
            why = f"its record {self.record_path.name} is unreadable: {error!r}"
        logger.warning("Not resuming the translation in %s (%s): starting over", self.path, why)
        return None

    def _holds_a_line_break_inside_a_line(self, size: int) -> bool:
        """Whether the first `size` bytes of the partial translation hold a character some reader ends a line at
        (`_LINE_BREAKS`) inside a line: a partial file written before `translate` made them spaces, which resumed
        would keep them beside translations without."""
        with open(self.path, "rb") as handle:
            for line in handle:  # binary: split at b"\n" alone
                if _LINE_BREAKS.search(line[:size].decode("utf-8", "replace").removesuffix("\n")):
                    return True
                size -= len(line)
                if size <= 0:
                    return False
        return False

    def _hash(self, lines: Iterable[str], kept: IO[bytes] | None = None) -> None:
        """Add `lines` to the digest of the source lines translated, and write them to `kept` if given."""
        for line in lines:
            encoded = line.encode() + b"\n"
            self.digest.update(encoded)
            if kept is not None:
                kept.write(encoded)


def _read_back(kept: IO[bytes]) -> Iterator[str]:
    """The lines `_PartialTranslation._hash` wrote to `kept`, which is closed at the end (an unnamed temporary file,
    gone with it)."""
    with kept:
        kept.seek(0)
        for line in kept:  # binary: split at b"\n" alone, as iter_lines read them
            yield line[:-1].decode()


def model_fingerprint(model: PreTrainedModel) -> str:
    """sha256 of the model's tensors (names, shapes, dtypes, values; int8-quantised weights left out, the float
    ones around them still counted): what tells one set of weights from another whatever directory it came from."""
    digest, seen = hashlib.sha256(), set()
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor) or tensor.is_quantized or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())  # tied weights once
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of the tokenizer's definition: a fast tokenizer's JSON; otherwise its class, vocabulary and the
    arguments it was made with, a file among them by its content (fairseq's BPE merges), wherever it lies and
    however it was loaded (`LOADING_ARGUMENTS`: a fairseq model's partial translation, resumed offline, was
    started over as another tokenizer's)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
        if getattr(tokenizer, "split_special_tokens", False):  # "</s>" in text as text: other ids, kept in the config
            definition += "\nsplit_special_tokens"
    else:
        arguments = {
            name: file_sha256(value) if isinstance(value, str) and os.path.isfile(value) else str(value)
            for name, value in tokenizer.init_kwargs.items()
            if name != "name_or_path" and name not in LOADING_ARGUMENTS
        }
        definition = json.dumps([type(tokenizer).__name__, tokenizer.get_vocab(), arguments], sort_keys=True)
    return hashlib.sha256(definition.encode()).hexdigest()


def _open_partial(path: Path, destination: Path) -> IO[bytes]:
    """The partial translation `path` opened to append. One another user left (0644 under a umask of 022, in a
    directory a group shares) cannot be: while their translation goes on it is refused as any second one is; once
    it has ended, it is replaced by a copy of this user's own, which this translation resumes (both were
    `Permission denied`: their running translation not named, their finished chunks not resumable)."""
    try:
        return open(path, "ab")
    except PermissionError:
        with open(path, "rb") as theirs:
            _lock_or_refuse(theirs, destination)
            try:
                with atomic_path(path) as copy:
                    shutil.copyfile(path, copy)
            except PermissionError:  # a directory with the sticky bit: only its owner may replace it
                raise UnwritableError(
                    errno.EPERM,
                    f"cannot resume {path}, another user's partial translation of {destination}: this user may not "
                    "replace it (a directory with the sticky bit); have its owner remove it, or translate into "
                    "another file",
                ) from None
        return open(path, "ab")


def _lock_or_refuse(handle: IO[bytes], destination: Path) -> None:
    """Hold an exclusive lock on the partial file, or refuse at once: a second process translating into the same
    file (a job requeued while the first still runs) would interleave their chunks."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise TranslationInProgressError(
            f"another process is translating into {destination} (it holds {handle.name}): wait for it or stop it"
        ) from None
    except OSError as error:  # a file system without locks (some NFS mounts): guarded by size checks only
        logger.warning(
            "Cannot lock %s (%s): a second run into %s is refused only once it writes into the same file",
            handle.name,
            error,
            destination,
        )
        return
    if not is_open_as(handle, Path(handle.name)):  # the other process finished between this one's open and lock
        raise TranslationInProgressError(
            f"another process finished translating into {destination} as this one started (the file this one "
            "opened became its output): it is left as that process wrote it; run this command again to translate "
            "into it anew"
        )


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(lines)
    while chunk := list(islice(iterator, size)):
        yield chunk


def as_lines(translations: list[str]) -> str:
    """One line per translation (a line break inside one would shift every later line)."""
    return "".join(line.replace("\n", " ") + "\n" for line in translations)


def _load_tokenizer(name_or_path: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside the model. One missing or broken is named in one line: transformers would fall
    back to other tokenizer classes and fail with their unrelated messages, or report a JSON error without its
    file. A package the tokenizer's code needs (sacremoses, for a converted fairseq model) is named in an
    ImportError."""
    try:
        if os.path.isdir(name_or_path):
            return _load_tokenizer_files(name_or_path)
        return _load_hub_tokenizer(name_or_path, revision)
    except ModuleNotFoundError as error:
        if not error.name:
            raise
        package = error.name.split(".")[0]
        raise ImportError(
            f"The tokenizer of {name_or_path!r} needs the package {package!r}: pip install {package}"
        ) from error


def _load_hub_tokenizer(repo_id: str, revision: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer of a Hub repo; from the cache where the Hub does not answer, as transformers loads the model
    (its tokenizer loading lets a timeout through)."""
    if not has_any_file(repo_id, revision, TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{repo_id!r} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): push it beside the model "
            "(scripts/push_to_hub.py does)."
        )
    try:
        return AutoTokenizer.from_pretrained(repo_id, revision=revision)
    except httpx2.TransportError as error:
        try:
            tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision, local_files_only=True)
        except OSError:
            raise error from None
        logger.warning("The Hub did not answer (%s): the tokenizer of %r comes from the cache", error, repo_id)
        return tokenizer


def _load_tokenizer_files(name_or_path: str) -> PreTrainedTokenizerBase:
    if not holds_tokenizer(name_or_path):
        raise FileNotFoundError(
            f"{name_or_path!r} has no tokenizer ({' or '.join(TOKENIZER_FILES)}): save it beside the model with "
            "tokenizer.save_pretrained."
        )
    missing = missing_tokenizer_files(name_or_path)
    if missing:
        raise FileNotFoundError(
            f"{name_or_path!r} holds a tokenizer without {', '.join(missing)}: copy the model directory whole, or "
            "save the tokenizer again with tokenizer.save_pretrained."
        )
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except ImportError:
        raise
    except Exception as error:  # tokenizers' own parse errors are plain Exceptions
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(
            f"The tokenizer in {name_or_path!r} does not load ({first_line}): a file cut short or missing? Save it "
            "again with tokenizer.save_pretrained."
        ) from error


def _refuse_cut_short_cached_weights(repo_id: str, revision: str | None) -> None:
    """Refuse the weights of `repo_id` at `revision` that the Hub cache holds cut short (a copy of the cache, or a
    disk filling up, interrupted: huggingface_hub's own downloads are whole or absent), naming the file:
    `from_pretrained` uses a cached file unchecked, and safetensors' error names none. Files not yet cached are
    downloaded, and checked, by huggingface_hub."""
    config = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if not isinstance(config, str):
        return
    snapshot = Path(config).parent
    problems = weights_problems(snapshot, missing_ok=True)
    if problems:
        at = f" --revision {revision}" if revision else ""
        raise ValueError(
            f"The Hub cache holds {repo_id!r} with incomplete weights in {snapshot}: {'; '.join(problems)} (a copy "
            f"of the cache, or a download, cut short): download them again with `hf download {repo_id}{at} "
            "--force-download`."
        )


def pinned_hub_revision(repo_id: str, revision: str | None) -> str | None:
    """The commit of the Hub repo `repo_id` that a load at `revision` takes every file from (`pinned_commit`; offline,
    `revision` itself), with the Hub's timeouts in force; offline, a cache that lacks any of the model's files is
    named first, and a Hub that cannot be reached is named in one line. A caller that records what it loaded pins
    first and loads at the commit: the cache's branch may move on during the load (another process's load after a
    push)."""
    use_hub_timeouts()
    not_cached = offline_cache_error(repo_id, revision, MODEL_REPO_FILES)
    if not_cached:
        raise not_cached
    with naming_hub_failures(f"Could not load {repo_id!r} from the Hub"):
        return pinned_commit(repo_id, revision)


# A model directory's own files, which an output written over would destroy: its configs, tokenizer and records
# (JSON), weights, remote code and card. A translation written beside them (`test.de`) is not one.
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".py", ".model", ".spm")


def model_files(name_or_path: str | os.PathLike) -> dict[str, Path]:
    """The own files of a local model directory, by role (`{"the model's config.json": path}`), to refuse an output
    that is one of them (`files.check_distinct_outputs`); none for a Hub repo id."""
    directory = Path(name_or_path)
    if not directory.is_dir():
        return {}
    return {
        f"the model's {path.name}": path
        for path in sorted(directory.iterdir())
        if path.is_file() and (path.suffix in MODEL_FILE_SUFFIXES or path.name == "README.md")
    }


def removed_while_loaded(directory: str) -> FileNotFoundError:
    """The error of a model directory gone while it loads: a checkpoint that the save_total_limit rotation of a run
    still training there deleted."""
    return removed_by_rotation(
        f"Model directory {directory!r}", "it was loaded", "load it again, or a checkpoint the run keeps."
    )


def load_model_and_tokenizer(
    name_or_path: str,
    *,
    revision: str | None = None,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a saved or Hub checkpoint of this model, refusing anything else with a message that says why.

    Importing this module imports `modeling`, whose registration makes the installed classes load the
    checkpoint: no downloaded code is executed. `revision` (a Hub repo's branch, tag or commit) pins what a Hub id
    loads, and every file of a Hub id comes from the one commit it names when loading starts (`pinned_commit`);
    offline (HF_HUB_OFFLINE=1), a cache that lacks any of its files is named before loading.
    `attn_implementation="eager"` is needed to return attention weights.
    """
    if os.path.isdir(name_or_path):
        if revision is not None:
            raise ValueError(f"{name_or_path!r} is a local directory: a revision names a version of a Hub repo only.")
        refuse_an_export(name_or_path)
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            message = f"{name_or_path!r} has no config.json: it is not a model saved with save_pretrained"
            if held := list_checkpoints(name_or_path):  # a run still training, whose final model is saved at its end
                message += (
                    f" (a training run's directory, its final model not saved yet: load one of its checkpoints, "
                    f"{held[-1]})"
                )
            elif not looks_like_local_path(name_or_path):  # `owner/name` where the command runs
                message += (
                    " (a directory of this name where the command runs is read instead of the Hub repo of that id: "
                    "run it elsewhere)"
                )
            raise FileNotFoundError(message + ".")
    elif os.path.exists(name_or_path):
        raise NotADirectoryError(
            f"{name_or_path!r} is a file: pass the model directory that holds config.json and the weights."
        )
    elif looks_like_local_path(name_or_path):
        raise FileNotFoundError(f"Model directory {name_or_path!r} does not exist.")
    else:
        revision = pinned_hub_revision(name_or_path, revision)
    # a local directory removed while it loads was looked up as a Hub repo id: "Repo id must be in the form ..."
    removal = (
        named_if_removed(name_or_path, removed_while_loaded(name_or_path))
        if os.path.isdir(name_or_path)
        else nullcontext()
    )
    with naming_hub_failures(f"Could not load {name_or_path!r} from the Hub"), removal:
        try:
            # the dict, not AutoConfig: that names a missing config.json "Unrecognized model", and a model type it
            # does not know in ten lines
            config, _ = TransformerConfig.get_config_dict(name_or_path, revision=revision)
        except OSError as error:
            if os.path.isdir(name_or_path):  # config.json is there (checked above): it does not parse
                raise OSError(f"Could not read {os.path.join(name_or_path, 'config.json')}: {error}") from error
            if isinstance(error.__cause__, RevisionNotFoundError):  # the repo answered: only the revision is wrong
                raise OSError(
                    f"{name_or_path!r} has no revision {revision!r} (no branch, tag or commit of that name): name "
                    "one that the repo has."
                ) from error
            raise OSError(
                f"Could not load a model config from {name_or_path!r}: it is neither a local directory nor a "
                f"reachable Hub repo id. ({error})"
            ) from error
        model_type = TransformerConfig.model_type
        if "model_type" not in config:  # a Hub repo without config.json gives {}
            raise FileNotFoundError(
                f"{name_or_path!r} has no config.json naming a model_type: it is not a model saved with "
                "save_pretrained (pushed with scripts/push_to_hub.py)."
            )
        if config["model_type"] != model_type:
            raise ValueError(
                f"{name_or_path!r} holds a {config['model_type']!r} checkpoint, not a {model_type!r} one; "
                "these tools only handle this project's models (convert others first, e.g. modeling.convert)."
            )
        if os.path.isdir(name_or_path) and (glob.glob(os.path.join(glob.escape(name_or_path), "*.safetensors"))):
            problems = weights_problems(name_or_path)
            if problems:
                raise ValueError(
                    f"{name_or_path!r} holds incomplete weights: {'; '.join(problems)}. The file was cut short "
                    "(an interrupted save or copy): save or copy the model again."
                )
        elif not os.path.isdir(name_or_path):
            _refuse_cut_short_cached_weights(name_or_path, revision)
        model_kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, revision=revision, **model_kwargs)
        tokenizer = _load_tokenizer(name_or_path, revision)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer
