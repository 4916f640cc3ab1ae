"""Decoding as in the paper (Sec. 6.1): beam 4, length penalty alpha = 0.6, max length = input length + 50.

`TransformerGenerationMixin` is `GenerationMixin` with these additions, each switched by the generation config:

- the GNMT length penalty ((5 + |Y|) / 6) ** alpha that the paper uses, instead of transformers' |Y| ** alpha;
- a maximum output length per sentence (its source length + 50), instead of one for the whole batch;
- fairseq's decoding rules, for converted fairseq models (`set_fairseq_decoding`): its length limit
  a · source width + b, an end-of-sentence forced at the limit that keeps its log-probability, and beam search
  that keeps the first `num_beams` finished hypotheses;
- a beam-search loop that drops each sentence from the batch once its result is final and runs the first step on
  one beam per sentence (CTranslate2's two economies), with the outputs of transformers' own loop;
- on x86 CPUs not made by Intel, in float32, decoding steps that multiply by weights laid out once per call for
  oneDNN (`prepacked_for_decoding`), as CTranslate2 lays out its weights once at loading.

This file travels with every checkpoint as remote code, beside the model file that imports it: it imports only
torch, transformers and its siblings `cache_transformer.py` (`StaticBeamCache`, where the loop keeps the decoder's
keys and values) and `onednn_transformer.py` (`onednn_prepacked`). It relies on these private members of
transformers, which is where a new release can break it:

- `GenerationMixin._beam_search` and `_update_finished_beams`, which it overrides;
- `_reorder_cache`, which it defines: `GenerationMixin` has no such method, but its beam-search loop calls one where
  the model has it (`hasattr(self, "_reorder_cache")`) instead of the cache's own `reorder_cache`;
- the beam-search step functions that the loop below calls (`_get_top_k_continuations`,
  `_get_running_beams_for_next_iteration`, `_update_finished_beams`, `_check_early_stop_heuristic`,
  `_gather_beams`), and the special-token tensors that `generate()` puts on the generation config for them
  (`_pad_token_tensor`, `_eos_token_tensor`);
- `GenerationConfig._get_default_generation_params()`, the library's defaults, and the generation config's
  `_from_model_config` flag.

`tests/test_generation.py` compares the loop with the library's token for token.
"""

import contextlib
import contextvars
import copy
import inspect
import json
import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import EncoderDecoderCache
from transformers.generation import logits_process
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria
from transformers.generation.utils import GenerateOutput
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutput, ModelOutput
from transformers.utils import GENERATION_CONFIG_NAME, logging

from .cache_transformer import STATIC_CACHE_ATTENTION, StaticBeamCache
from .onednn_transformer import onednn_prepacked

LENGTH_PENALTY_TYPES = ("gnmt", "transformers")
BEAM_FINALIZATIONS = ("best", "first")
PAPER_DECODING_FIELDS = ("length_penalty_type", "max_length_offset")
FAIRSEQ_DECODING_FIELDS = ("max_length_a", "max_length_b", "forced_eos_keeps_log_prob", "beam_finalization")
# Generation config fields of this model (not transformers'): generate() takes them as keyword arguments too.
MODEL_DECODING_FIELDS = PAPER_DECODING_FIELDS + FAIRSEQ_DECODING_FIELDS
# What generate() takes for a field of this model's that neither the call nor a generation config sets.
MODEL_DECODING_DEFAULTS = {
    "length_penalty_type": "transformers",
    "max_length_offset": None,
    "max_length_a": None,
    "max_length_b": None,
    "forced_eos_keeps_log_prob": False,
    "beam_finalization": "best",
}
# fairseq's defaults for --max-len-a / --max-len-b, taken by the one of the two that is not set.
FAIRSEQ_MAX_LEN_A, FAIRSEQ_MAX_LEN_B = 0, 200
# The beam_finalization of the beam search under way, for `_update_finished_beams`, which both loops call without
# the generation config (a context variable: each thread, each task its own).
_BEAM_FINALIZATION: contextvars.ContextVar[str] = contextvars.ContextVar("beam_finalization", default="best")

logger = logging.get_logger(__name__)


def unset_decoding_defaults() -> dict[str, Any]:
    """What generate() takes for each decoding field that neither its call nor the generation config sets:
    transformers' defaults (`GenerationConfig._get_default_generation_params`, which generate() itself applies),
    and this model's for its own fields."""
    return {**GenerationConfig._get_default_generation_params(), **MODEL_DECODING_DEFAULTS}


def set_paper_decoding(generation_config: GenerationConfig) -> None:
    """Sec. 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum output length to
    input length + 50, but terminate early when possible".

    "Early" is read as fairseq and CTranslate2 read it: a sentence is done once 4 hypotheses have finished.
    tensor2tensor, the paper's code, went on until no running hypothesis could beat the worst finished one even at
    the maximum length; on a Multi30k model the two differed in 1 of 300 test translations."""
    generation_config.num_beams = 4
    generation_config.length_penalty = 0.6
    generation_config.early_stopping = True
    generation_config.length_penalty_type = "gnmt"
    generation_config.max_length_offset = 50
    # These settings are the model's own, not copies of config.json: keep them when saved and loaded.
    generation_config._from_model_config = False


def set_fairseq_decoding(
    generation_config: GenerationConfig,
    *,
    pad_token_id: int,
    num_beams: int = 5,
    length_penalty: float = 1.0,
    max_length_a: float = FAIRSEQ_MAX_LEN_A,
    max_length_b: int = FAIRSEQ_MAX_LEN_B,
) -> None:
    """fairseq's `SequenceGenerator` (fairseq-generate / fairseq-interactive with `--beam`, `--lenpen`,
    `--max-len-a`, `--max-len-b`; the defaults are fairseq's), as this model's generation config:

    - decoding starts from the decoder start token (`</s>` in fairseq's dictionaries) and ranks finished
      hypotheses by log P(Y) / |Y| ** lenpen, |Y| counting the end-of-sentence (`length_penalty_type="transformers"`);
    - at most int(max_len_a · W + max_len_b) tokens before the end-of-sentence, W the padded width of the batch's
      sources, end-of-sentence included (`input_ids.shape[1]`), capped at max_position_embeddings - 1; at the limit
      every token but end-of-sentence is masked and end-of-sentence keeps its log-probability
      (`forced_eos_keeps_log_prob`);
    - padding is masked after the log-softmax (`suppress_tokens`), and end-of-sentence at the first step
      (fairseq's min_len 1: `min_new_tokens=1`);
    - a sentence is done once `num_beams` hypotheses have finished (`early_stopping=True`), which are the first
      `num_beams` to finish (`beam_finalization="first"`).
    `num_beams=1` is greedy decoding, as fairseq's beam of 1 is.
    """
    generation_config.num_beams = num_beams
    generation_config.length_penalty = length_penalty
    generation_config.early_stopping = True
    generation_config.length_penalty_type = "transformers"
    generation_config.max_length_offset = None
    generation_config.max_length_a = max_length_a
    generation_config.max_length_b = max_length_b
    generation_config.forced_eos_keeps_log_prob = True
    generation_config.beam_finalization = "first"
    generation_config.suppress_tokens = [pad_token_id]
    generation_config.min_new_tokens = 1
    generation_config._from_model_config = False


class GNMTLengthPenalty(float):
    """alpha of the GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), used by the paper.

    transformers' beam search ranks a finished hypothesis by `sum_logprobs / (length ** length_penalty)`, where
    `length` is a Python int. An int cannot raise itself to this float subclass, so Python calls `__rpow__`,
    which evaluates the GNMT penalty in place of `length ** alpha`; everything else treats it as alpha.
    """

    def __rpow__(self, length: int) -> float:
        return ((5 + length) / 6) ** float(self)


class PerSentenceMaxLengthLogitsProcessor(LogitsProcessor):
    """Forces end-of-sentence once a hypothesis holds `max_lengths[i]` tokens, so that each sentence stops at
    its own limit rather than the batch's longest (Sec. 6.1: "maximum output length to input length + 50").

    Every other token is masked; end-of-sentence gets log-probability 0 (transformers' `ForcedEOSTokenLogitsProcessor`
    does the same), or keeps the score it has with `keep_eos_score=True` (fairseq's `SequenceGenerator`)."""

    def __init__(self, max_lengths: torch.Tensor, eos_token_id: int, keep_eos_score: bool = False):
        self.max_lengths = max_lengths  # (B,)
        self.eos_token_id = eos_token_id
        self.keep_eos_score = keep_eos_score

    def for_sentences(self, sentences: torch.Tensor) -> "PerSentenceMaxLengthLogitsProcessor":
        """The same limits for a batch that keeps only `sentences` (indices into this one's)."""
        return PerSentenceMaxLengthLogitsProcessor(
            self.max_lengths[sentences.to(self.max_lengths.device)], self.eos_token_id, self.keep_eos_score
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows_per_sentence = input_ids.shape[0] // self.max_lengths.shape[0]  # beams or returned sequences
        limits = self.max_lengths.to(input_ids.device).repeat_interleave(rows_per_sentence)  # (B * K,)
        # input_ids holds the decoder start token plus the tokens generated so far.
        at_limit = input_ids.shape[1] >= limits  # (B * K,)
        if not at_limit.any():  # most steps: spare three passes over the (B * K, V) scores
            return scores
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.eos_token_id] = self._kept_eos_scores(scores) if self.keep_eos_score else 0.0
        return torch.where(at_limit[:, None], forced, scores)

    def _kept_eos_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """End-of-sentence's scores (rows,), 0 where an earlier processor blocked it (-inf: a min_new_tokens or
        min_length beyond the limit, an end-of-sentence suppressed): kept, that block left every token -inf at the
        limit, and beam search an arbitrary hypothesis without end-of-sentence (fairseq refuses min_len > max_len;
        transformers warns that generation stops at the maximum length, as it then does)."""
        eos_scores = scores[:, self.eos_token_id]
        return eos_scores.masked_fill(eos_scores == -math.inf, 0.0)


class EndOfSentenceBlockedLogitsProcessor(LogitsProcessor):
    """`min_length` / `min_new_tokens` in place: end-of-sentence is impossible while hypotheses hold fewer than
    `min_length` tokens (the decoder start token included). transformers' own two processors copy the (rows, V)
    scores twice every step, blocked or not; the decoding loop below owns its scores, so it only sets those of
    end-of-sentence, to the same values."""

    def __init__(self, min_length: int, eos_token_id: torch.Tensor):
        self.min_length = min_length
        self.eos_token_id = eos_token_id

    @classmethod
    def replacing(cls, processor: LogitsProcessor) -> LogitsProcessor:
        """The in-place equivalent of transformers' min-length processors; any other processor unchanged."""
        if isinstance(processor, logits_process.MinLengthLogitsProcessor):
            return cls(processor.min_length, processor.eos_token_id)
        if isinstance(processor, logits_process.MinNewTokensLengthLogitsProcessor):
            return cls(processor.prompt_length_to_skip + processor.min_new_tokens, processor.eos_token_id)
        return processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] < self.min_length:
            scores[:, self.eos_token_id.to(scores.device)] = -math.inf
        return scores


# Beam search steps see each row alone with these, so dropping other sentences from the batch changes nothing for
# the rows that stay. Anything else (sampling, processors with per-batch state) takes transformers' own loop.
ROW_WISE_LOGITS_PROCESSORS = (
    PerSentenceMaxLengthLogitsProcessor,
    EndOfSentenceBlockedLogitsProcessor,
    logits_process.MinLengthLogitsProcessor,
    logits_process.MinNewTokensLengthLogitsProcessor,
    logits_process.TemperatureLogitsWarper,
    logits_process.RepetitionPenaltyLogitsProcessor,
    logits_process.NoRepeatNGramLogitsProcessor,
    logits_process.SequenceBiasLogitsProcessor,
    logits_process.ForcedBOSTokenLogitsProcessor,
    logits_process.ForcedEOSTokenLogitsProcessor,
    logits_process.InfNanRemoveLogitsProcessor,
    logits_process.LogitNormalization,
    logits_process.SuppressTokensAtBeginLogitsProcessor,
    logits_process.SuppressTokensLogitsProcessor,
)
ROW_WISE_STOPPING_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria)


def _sees_each_row_alone(processor: LogitsProcessor) -> bool:
    """Whether `processor` is one of `ROW_WISE_LOGITS_PROCESSORS` and holds nothing per row of the batch: a repetition
    penalty's `prompt_ignore_length` given as a tensor holds one value per row and refuses a batch of any other size
    ("Incompatible `prompt_ignore_length` batch size"), so it cannot see a batch that has dropped sentences."""
    if isinstance(processor, logits_process.RepetitionPenaltyLogitsProcessor):
        return not isinstance(processor.prompt_ignore_length, torch.Tensor)
    return isinstance(processor, ROW_WISE_LOGITS_PROCESSORS)


# What generate() hands the decoding loop per row of the batch (besides the cache); any other tensor takes
# transformers' own loop, since the batch could not be cut safely. Labels, which `Seq2SeqTrainer` generates beside,
# transformers never hands the model while generating (`prepare_inputs_for_generation`): they change nothing.
PER_ROW_GENERATION_KWARGS = ("attention_mask", "decoder_attention_mask", "encoder_outputs", "labels")


def _checked_decoding_settings(setting: Callable[[str, Any], Any]) -> tuple[bool, int | None]:
    """The decoding settings generate() reads, each refused in one line where it is of the wrong kind (`setting`:
    its value for a name, else the default given); returns `forced_eos_keeps_log_prob` and `max_length_offset`."""
    num_beams = setting("num_beams", 1)
    # numbers.Integral: NumPy's integers too, which transformers takes
    if isinstance(num_beams, bool) or not isinstance(num_beams, numbers.Integral) or num_beams < 1:
        # transformers itself fails with a ZeroDivisionError (0) or a negative tensor size (-1)
        raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}.")
    penalty_type = setting("length_penalty_type", MODEL_DECODING_DEFAULTS["length_penalty_type"])
    if penalty_type not in LENGTH_PENALTY_TYPES:
        raise ValueError(f"Unknown length_penalty_type {penalty_type!r}; expected one of {LENGTH_PENALTY_TYPES}.")
    finalization = setting("beam_finalization", MODEL_DECODING_DEFAULTS["beam_finalization"])
    if finalization not in BEAM_FINALIZATIONS:
        raise ValueError(f"Unknown beam_finalization {finalization!r}; expected one of {BEAM_FINALIZATIONS}.")
    keep_eos_score = setting("forced_eos_keeps_log_prob", MODEL_DECODING_DEFAULTS["forced_eos_keeps_log_prob"])
    if not isinstance(keep_eos_score, bool):
        raise ValueError(f"forced_eos_keeps_log_prob must be True or False, got {keep_eos_score!r}.")
    offset = setting("max_length_offset", MODEL_DECODING_DEFAULTS["max_length_offset"])
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 1):
        # a negative one gave empty translations, a fractional one a fractional limit, "50" a TypeError
        raise ValueError(f"max_length_offset must be a positive integer or None, got {offset!r}.")
    eos_token_id = setting("eos_token_id", None)
    # an IndexError deep in the length limit or the beam search (a tuple or a tensor too: transformers takes them)
    if isinstance(eos_token_id, (list, tuple, torch.Tensor)) and torch.as_tensor(eos_token_id).numel() == 0:
        raise ValueError(
            f"eos_token_id={eos_token_id!r} names no end-of-sentence token; give None to decode without one."
        )
    return keep_eos_score, offset


class TransformerGenerationMixin(GenerationMixin):
    """`GenerationMixin` with the paper's decoding; the translation model inherits it."""

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs,
    ) -> GenerateOutput | torch.LongTensor:
        """`GenerationMixin.generate` with the paper's decoding (Sec. 6.1), as the generation config asks:

        - `max_length_offset` (default 50): each sentence's output holds at most its source length plus this many
          tokens, end-of-sentence included; `None` turns the limit off. A `max_length` or `max_new_tokens`
          given here, in a generation config passed or in the model's still caps the whole batch. The limit ends a
          sentence with its end-of-sentence: with `eos_token_id=None` (as with fairseq's limit below) no sentence
          ends early, and every one runs to the batch's longest limit, as transformers runs each to `max_length`.
        - `length_penalty_type`: `"gnmt"` (default) ranks finished beams by log P(Y) / ((5 + |Y|) / 6) ** alpha;
          `"transformers"` keeps the library's log P(Y) / |Y| ** alpha.

        and with fairseq's (`set_fairseq_decoding`), for converted fairseq models:

        - `max_length_a`, `max_length_b` (fairseq's `--max-len-a`, `--max-len-b`; `None`, the default, is off;
          setting one turns the limit on, the other then takes fairseq's default, 0 or 200): every sentence holds
          at most min(int(a · W + b), max_position_embeddings - 1) tokens before its end-of-sentence, W being the
          padded width of the sources, end-of-sentence included (`input_ids.shape[1]`). As in fairseq, W is the
          batch's: with a != 0 the limit depends on which sentences share a batch. Not with `max_length_offset`.
        - `forced_eos_keeps_log_prob` (default False): at a length limit every token but end-of-sentence is masked;
          True keeps end-of-sentence's log-probability (fairseq), False gives it 0 (transformers' forced EOS).
        - `beam_finalization`: `"best"` (default, transformers) keeps the best `num_beams` finished hypotheses of a
          sentence, a later one displacing an earlier; `"first"` (fairseq) keeps the first `num_beams` to finish.

        All may also be passed as keyword arguments, like any generation parameter.

        Without an attention mask, the positions of the input ids holding `pad_token_id` are padding (transformers 5
        infers that mask for decoder-only models only: the encoder attended to the pads of every shorter source).

        An empty input (an empty batch, or no tokens) or a row whose attention mask is all zeros is refused, naming
        the row: there is no source to translate (unchecked, the first fails deep inside, the second silently
        decodes a translation of nothing).

        On x86 CPUs not made by Intel, in float32 (where `onednn_transformer.py` runs linear layers on oneDNN), the
        decoder's and the output projection's weights are laid out for oneDNN once per call, for every step to use
        (`prepacked_for_decoding`): the same outputs, faster steps, and a second copy of those weights while the
        call runs.
        """
        self._own_encoder_outputs(kwargs)
        self._mask_padding(inputs, kwargs)
        self._check_sources(inputs, kwargs)
        self.undo_library_default_fill()
        base_config = generation_config if generation_config is not None else self.generation_config
        unknown_to_config = {
            name: kwargs.pop(name)
            for name in MODEL_DECODING_FIELDS
            if name in kwargs and not hasattr(base_config, name)
        }
        if unknown_to_config:  # a user's own GenerationConfig without our fields: carry them on a copy
            generation_config = copy.deepcopy(base_config)
            for name, value in unknown_to_config.items():
                setattr(generation_config, name, value)
            base_config = generation_config

        # As transformers 5 fills a given generation config: what it leaves unset (None) comes from the model's
        # (and this model's own fields where it lacks them), then the library's defaults.
        configs = [base_config] if base_config is self.generation_config else [base_config, self.generation_config]

        def setting(name: str, default):
            if name in kwargs:
                return kwargs[name]
            for config in configs:
                value = getattr(config, name, None)
                if value is not None or (name in MODEL_DECODING_FIELDS and hasattr(config, name)):
                    return value
            return default

        keep_eos_score, offset = _checked_decoding_settings(setting)
        fairseq_limit = self._fairseq_max_length(
            *(setting(name, MODEL_DECODING_DEFAULTS[name]) for name in ("max_length_a", "max_length_b"))
        )
        max_lengths = self._sentence_max_lengths(inputs, kwargs, offset, fairseq_limit)  # (B,) or None
        if max_lengths is not None:
            eos_token_id = setting("eos_token_id", self.config.eos_token_id)
            if isinstance(eos_token_id, torch.Tensor):  # transformers takes a tensor, a tuple or a list of ids
                eos_token_id = eos_token_id.tolist()
            eos_token_id = eos_token_id[0] if isinstance(eos_token_id, (list, tuple)) else eos_token_id
            if eos_token_id is not None:  # without one, no sentence ends before the batch's limit below
                logits_processor = LogitsProcessorList(logits_processor or [])
                processor = PerSentenceMaxLengthLogitsProcessor(max_lengths, eos_token_id, keep_eos_score)
                logits_processor.append(processor)
            if not self._length_cap_given(configs, kwargs):
                cap = int(max_lengths.max())
                if generation_config is None:
                    kwargs["max_new_tokens"] = cap
                else:  # on the config given: beside it, transformers would warn the user of an argument not theirs
                    generation_config = copy.deepcopy(generation_config)
                    generation_config.max_new_tokens = cap
        try:
            with self.prepacked_for_decoding():
                return super().generate(
                    inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
                )
        finally:
            self._left_unset = (self.generation_config, self._unset_library_fields(self.generation_config))

    def prepacked_for_decoding(self) -> contextlib.AbstractContextManager:
        """The block where generate() decodes: the decoder's and the output projection's weights laid out once for
        oneDNN (`onednn_prepacked`, which does so only where linear layers run on oneDNN: x86 CPUs not made by
        Intel, float32), for every decoding step to use."""
        self_attentions = [layer.self_attn for layer in self.model.decoder.layers]
        return onednn_prepacked(
            [*self.model.decoder.modules(), self.lm_head],
            fused=[(attention.q_proj, attention.k_proj, attention.v_proj) for attention in self_attentions],
        )

    @staticmethod
    def _unset_library_fields(generation_config: GenerationConfig) -> frozenset[str]:
        defaults = generation_config._get_default_generation_params()
        return frozenset(name for name in defaults if getattr(generation_config, name, None) is None)

    def undo_library_default_fill(self) -> None:
        """Unset again the fields of the model's generation config that were unset at the end of the last
        generate() call and now hold exactly the library's defaults. transformers' `Seq2SeqTrainer` writes those
        defaults into the model's own config after each generate() it runs to evaluate (`update(...,
        defaults_only=True)`), `max_length=20` among them: unchecked, every later translation (and every saved
        copy of the model) would stop at 20 tokens instead of source length + 50. A value set by hand in between
        that differs from the library's default stays."""
        config, unset = getattr(self, "_left_unset", (None, frozenset()))
        if config is not self.generation_config:
            return
        defaults = config._get_default_generation_params()
        for name in unset:
            if getattr(config, name, None) is not None and getattr(config, name) == defaults[name]:
                setattr(config, name, None)

    def adjust_generation_fn(
        self,
        generation_config: GenerationConfig | None,
        from_auto_class: bool,
        from_pipeline: str | None,
        pretrained_model_name_or_path: str | os.PathLike | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """`from_pretrained`'s loading of the generation config, except where the checkpoint has none. transformers
        would then make one from config.json and decode greedily, up to 20 tokens; this model decodes as `__init__`
        builds it, with the paper's decoding (Sec. 6.1), and says so. A local generation_config.json that cannot be
        read is refused, naming it, where transformers would skip it for those defaults without a word."""
        if generation_config is None and pretrained_model_name_or_path is not None:
            directory = Path(pretrained_model_name_or_path, kwargs.get("subfolder") or "")
            path = directory / GENERATION_CONFIG_NAME
            if path.is_file():
                try:
                    json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
                    raise ValueError(f"{path} is not a readable generation config: {error}") from None
        super().adjust_generation_fn(
            generation_config, from_auto_class, from_pipeline, pretrained_model_name_or_path, *args, **kwargs
        )
        if generation_config is None and self.generation_config._from_model_config:
            logger.warning(
                "%s has no %s: decoding with the paper's settings (beam 4, length penalty 0.6, source length + 50)",
                pretrained_model_name_or_path,
                GENERATION_CONFIG_NAME,
            )
            set_paper_decoding(self.generation_config)

    @staticmethod
    def _fairseq_max_length(a, b) -> tuple[float, int | float] | None:
        """(a, b) of fairseq's limit int(a · W + b), or None when neither is set; checked."""
        if a is None and b is None:
            return None
        a = FAIRSEQ_MAX_LEN_A if a is None else a
        b = FAIRSEQ_MAX_LEN_B if b is None else b
        for name, value in (("max_length_a", a), ("max_length_b", b)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}.")
        return a, b

    def _sentence_max_lengths(
        self,
        inputs: torch.Tensor | None,
        kwargs: dict,
        offset: int | None,
        fairseq_limit: tuple[float, int | float] | None,
    ) -> torch.Tensor | None:
        """(B,): the tokens each sentence's output may hold, end-of-sentence included. With `fairseq_limit` (a, b),
        min(int(a · W + b), max_position_embeddings - 1) + 1 for every sentence, W the padded source width; else
        with `offset`, each sentence's source length + offset (the paper). None when no limit is set or the sources
        give no length."""
        if fairseq_limit is not None:
            if offset is not None:
                raise ValueError(
                    f"max_length_offset={offset!r} and max_length_a/max_length_b both set a length limit: "
                    "set max_length_offset=None for fairseq's limit, or max_length_a=max_length_b=None."
                )
            width = self._source_width(inputs, kwargs)  # (B, W)
            if width is None:
                return None
            a, b = fairseq_limit
            tokens_before_eos = min(int(a * width[1] + b), self.config.max_position_embeddings - 1)
            return torch.full((width[0],), tokens_before_eos + 1, device=self.device)
        if offset is None:
            return None
        source_lengths = self._source_lengths(inputs, kwargs)  # (B,)
        return source_lengths + offset if source_lengths is not None else None

    def _source_width(self, inputs: torch.Tensor | None, kwargs: dict) -> tuple[int, int] | None:
        """(batch size, padded source width), from the input ids, the attention mask or the encoder output."""
        for source in (inputs, kwargs.get("input_ids"), kwargs.get("attention_mask")):
            if source is not None and source.dim() == 2:
                return source.shape[0], source.shape[1]
        inputs_embeds = kwargs.get("inputs_embeds")
        if inputs_embeds is not None:  # (B, S, D)
            return inputs_embeds.shape[0], inputs_embeds.shape[1]
        encoder_outputs = kwargs.get("encoder_outputs")
        if encoder_outputs is not None:
            return encoder_outputs[0].shape[0], encoder_outputs[0].shape[1]
        return None

    @staticmethod
    def _own_encoder_outputs(kwargs: dict) -> None:
        """Put in `kwargs` a copy of the encoder outputs given, as a `BaseModelOutput` where a tuple. transformers
        repeats their states for the beams in the object given (`_expand_dict_for_generation`): a second call with
        the same outputs then decoded num_beams rows per sentence, or failed with an IndexError; and a tuple, which
        the model's forward takes, failed with "`bos_token_id` has to be defined when no `input_ids` are provided"."""
        encoder_outputs = kwargs.get("encoder_outputs")
        if isinstance(encoder_outputs, ModelOutput):
            kwargs["encoder_outputs"] = copy.copy(encoder_outputs)
        elif isinstance(encoder_outputs, tuple):
            kwargs["encoder_outputs"] = BaseModelOutput(*encoder_outputs)

    def _mask_padding(self, inputs: torch.Tensor | None, kwargs: dict) -> None:
        """Put the attention mask of padded input ids given without one into `kwargs`, as `_source_lengths` counts
        their lengths; as transformers 4 did, not where padding and end-of-sentence share an id."""
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        pad_token_id = self.config.pad_token_id
        if kwargs.get("attention_mask") is not None:
            return
        if input_ids is None or input_ids.dim() != 2 or input_ids.is_floating_point():
            return
        if pad_token_id is None or pad_token_id == self.config.eos_token_id:
            return
        padding = input_ids.eq(pad_token_id)  # (B, S)
        if padding.any():
            kwargs["attention_mask"] = (~padding).long()

    @staticmethod
    def _check_sources(inputs: torch.Tensor | None, kwargs: dict) -> None:
        """ValueError for input ids of one sentence, not a batch (1-D), and for an input without tokens: input ids of
        0 rows or columns (unread beside encoder outputs), or a row of the attention mask without a 1 (whatever the
        source: ids, embeddings or encoder outputs)."""
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if kwargs.get("encoder_outputs") is None and input_ids is not None and input_ids.dim() == 1:
            # else "The size of tensor a (6) must match the size of tensor b (32)" inside the encoder
            raise ValueError(
                f"generate() got input_ids of shape {tuple(input_ids.shape)}: give a batch of shape (batch size, "
                "length), input_ids[None] for one sentence."
            )
        ids_read = kwargs.get("encoder_outputs") is None and input_ids is not None and input_ids.dim() == 2
        if ids_read and 0 in input_ids.shape:  # else an error inside the length limit or attention, naming no input
            raise ValueError(
                f"generate() got input_ids of shape {tuple(input_ids.shape)}: no source token to translate (an empty "
                "batch, or sources of length 0)."
            )
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None and attention_mask.dim() == 2:
            empty = attention_mask.eq(0).all(dim=-1)
            if empty.any():  # one synchronisation per call
                rows = empty.nonzero().flatten().tolist()
                raise ValueError(
                    f"generate(): row {rows[0]} of attention_mask is all zeros (rows without any source token: "
                    f"{rows[:10]}); remove empty sources before generating."
                )

    @staticmethod
    def _length_cap_given(configs: list[GenerationConfig], kwargs: dict) -> bool:
        """Whether the caller or a generation config that transformers merges (the one given, whose unset fields
        the model's fills) set a length for the whole batch."""
        if kwargs.get("max_new_tokens") is not None or kwargs.get("max_length") is not None:
            return True
        return any(config.max_new_tokens is not None or config.max_length is not None for config in configs)

    def _source_lengths(self, inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
        """Real (non-padding) source lengths, (B,), from the attention mask or the input ids; every position of
        embeddings or encoder states given without a mask, and of input ids without a padding id."""
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None:
            return attention_mask.sum(dim=-1)
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is not None:
            if self.config.pad_token_id is None:
                return torch.full((input_ids.shape[0],), input_ids.shape[1], device=input_ids.device)
            return input_ids.ne(self.config.pad_token_id).sum(dim=-1)
        encoder_outputs = kwargs.get("encoder_outputs")
        states = encoder_outputs[0] if encoder_outputs is not None else kwargs.get("inputs_embeds")
        if states is not None:  # (B, S, D)
            return torch.full((states.shape[0],), states.shape[1], device=states.device)
        return None

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.LongTensor) -> EncoderDecoderCache:
        """Beam search keeps the surviving hypotheses: only their self-attention keys and values move. Beams only
        ever move within their own sentence, whose rows hold identical encoder keys and values, so reordering the
        cross-attention cache (half of the work transformers would do) changes nothing and is skipped."""
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    def _beam_search(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
    ):
        if getattr(generation_config, "length_penalty_type", None) == "gnmt":  # unset: transformers' form
            generation_config = copy.copy(generation_config)
            generation_config.length_penalty = GNMTLengthPenalty(generation_config.length_penalty)
        finalization = _BEAM_FINALIZATION.set(
            getattr(generation_config, "beam_finalization", None) or MODEL_DECODING_DEFAULTS["beam_finalization"]
        )
        try:
            if not self._can_decode_with_static_cache(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
            ):
                return super()._beam_search(
                    input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
                )
            return self._beam_search_dropping_finished(
                input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
            )
        finally:
            _BEAM_FINALIZATION.reset(finalization)

    def _update_finished_beams(self, *args, **kwargs):
        """transformers' step, or with `beam_finalization="first"` fairseq's (`SequenceGenerator.finalize_hypos`):
        a hypothesis that has finished stays among the sentence's `num_beams` finished ones, and the hypotheses
        finishing at this step (among the first `num_beams` candidates, as in transformers) fill the free places in
        candidate order, that is by score. transformers instead keeps the best `num_beams` of the old and the new,
        which differs when more finish at one step than there are free places: the best hypothesis is the same,
        the others may not be. The finished hypotheses stay sorted by score, best first."""
        step = super()._update_finished_beams
        if _BEAM_FINALIZATION.get() != "first":
            return step(*args, **kwargs)
        return self._keep_first_finished(**inspect.signature(step).bind(*args, **kwargs).arguments)

    def _keep_first_finished(
        self,
        sequences,
        topk_running_sequences,
        beam_scores,
        topk_log_probs,
        beam_indices,
        topk_running_beam_indices,
        is_early_stop_heuristic_unsatisfied,
        is_sent_finished,
        next_token_hits_stopping_criteria,
        top_num_beam_mask,
        num_beams,
        cur_len,
        decoder_prompt_len,
        length_penalty,
        early_stopping,
    ):
        """`_update_finished_beams` with fairseq's rule (its arguments, by name)."""
        # transformers' scores of the new candidates (-1e9 added to those that cannot be taken), then the merge with
        # the old ones' priority: every finished hypothesis first, then the rest by score. (transformers also adds
        # -1e9 to every new candidate of a sentence whose num_beams hypotheses have all finished, with
        # early_stopping=True: here those hypotheses, kept first, fill every place anyway.)
        just_finished = next_token_hits_stopping_criteria & top_num_beam_mask[None, :]  # (b, 2K)
        new_scores = topk_log_probs / ((cur_len + 1 - decoder_prompt_len) ** length_penalty)
        new_scores = new_scores + (~is_early_stop_heuristic_unsatisfied).to(torch.float32) * -1.0e9
        new_scores = new_scores + (~just_finished) * -1.0e9
        merged_sequences = torch.cat((sequences, topk_running_sequences), dim=1)
        merged_scores = torch.cat((beam_scores, new_scores), dim=1)
        merged_beam_indices = torch.cat((beam_indices, topk_running_beam_indices), dim=1)
        merged_is_finished = torch.cat((is_sent_finished, just_finished), dim=1)
        kept_first = torch.cat((is_sent_finished, torch.zeros_like(just_finished)), dim=1)
        chosen = torch.topk(merged_scores.masked_fill(kept_first, math.inf), k=num_beams)[1]  # (b, K)
        chosen_scores = merged_scores.gather(1, chosen)
        chosen = chosen.gather(1, torch.sort(chosen_scores, dim=-1, descending=True, stable=True)[1])
        return (
            self._gather_beams(merged_sequences, chosen),
            self._gather_beams(merged_scores, chosen),
            self._gather_beams(merged_beam_indices, chosen),
            self._gather_beams(merged_is_finished, chosen),
        )

    def _can_decode_with_static_cache(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs
    ) -> bool:
        """Whether `_beam_search_dropping_finished` gives exactly what transformers' loop would: rows that can be cut
        from the batch (row-wise processors and criteria, no other per-row inputs), a decoding that starts from one
        token, an attention that `StaticBeamCache` serves, and a model that runs as its forward would (evaluation
        mode, no hooks on the stacks that the decoding step bypasses)."""
        bypassed = (self, self.model, self.model.decoder)
        return not (
            synced_gpus
            or generation_config.do_sample
            or generation_config.return_dict_in_generate
            or generation_config.low_memory  # transformers' loop refuses it; this one would ignore it silently
            or input_ids.shape[1] != 1
            or self.training
            or self.config._attn_implementation not in STATIC_CACHE_ATTENTION
            or any(module._forward_hooks or module._forward_pre_hooks for module in bypassed)
            or "encoder_outputs" not in model_kwargs
            or any(
                isinstance(value, (torch.Tensor, ModelOutput)) and name not in PER_ROW_GENERATION_KWARGS
                for name, value in model_kwargs.items()
            )
            or not all(map(_sees_each_row_alone, logits_processor))
            or not all(isinstance(c, ROW_WISE_STOPPING_CRITERIA) for c in stopping_criteria)
        )

    def _decoder_step(self, tokens: torch.Tensor, cache: StaticBeamCache) -> torch.Tensor:
        """Logits (rows, V) of the next token of every hypothesis, given its last token `tokens` (rows,): the
        decoder's own layers on one position, reading and writing `cache`. It computes what the model's forward does
        for that position, with the same operations, without transformers' per-call mask building and output
        plumbing (the cross-attention mask is made once, with the cache)."""
        decoder = self.model.decoder
        inputs_embeds = decoder.embed_tokens(tokens[:, None])  # (rows, 1, D)
        hidden_states = decoder.embed(inputs_embeds, start=cache.length)  # (rows, 1, D)
        for layer in decoder.layers:
            hidden_states = layer(
                hidden_states,
                None,  # the self-attention mask: one new token sees every earlier one
                cache.encoder_hidden_states,
                encoder_attention_mask=cache.cross_attention_mask,
                cache=cache,
            )
        cache.advance()
        return self.project_to_vocabulary(hidden_states[:, -1])  # (rows, V)

    def _beam_search_dropping_finished(
        self,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        **model_kwargs,
    ) -> torch.LongTensor:
        """transformers' beam search, step for step (its own step functions), except that a sentence leaves the
        batch once its result is final, as CTranslate2 does: a batch then costs the sum of its sentences' lengths
        rather than its longest sentence's length times its size. The decoder runs one position at a time on a
        `StaticBeamCache`. The outputs are the library loop's.

        A sentence's result is final once transformers' loop would no longer change it: all its `num_beams`
        finished hypotheses are in with `early_stopping=True`, or no running beam can beat the worst of them.
        `input_ids` holds B sentences × K beams, (B·K, prompt length); the state below is (b, K, ...) for the b
        sentences still running, `sentences` holding their positions in the batch.
        """
        num_beams = generation_config.num_beams
        length_penalty, early_stopping = generation_config.length_penalty, generation_config.early_stopping
        max_length = generation_config.max_length
        pad_token_id, eos_token_id = generation_config._pad_token_tensor, generation_config._eos_token_tensor
        batch_size = input_ids.shape[0] // num_beams
        prompt_length = cur_len = input_ids.shape[1]
        device = input_ids.device

        # As transformers: keep 2K candidates per sentence so that K can run on when some end, and fill unused
        # positions the same way.
        candidates_per_sentence = max(2, 1 + (eos_token_id.shape[0] if eos_token_id is not None else 0)) * num_beams
        is_top_k_candidate = torch.arange(candidates_per_sentence, device=device) < num_beams
        fill_value = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1

        # Called one by one, as `LogitsProcessorList` calls two-argument processors, without its signature inspection
        # of each at every step.
        processors = [EndOfSentenceBlockedLogitsProcessor.replacing(processor) for processor in logits_processor]
        running_sequences = torch.full(
            (batch_size, num_beams, max_length), fill_value, dtype=torch.long, device=device
        )
        running_sequences[:, :, :cur_len] = input_ids.view(batch_size, num_beams, -1)
        running_beam_scores = torch.zeros((batch_size, num_beams), device=device)  # (b, K)
        running_beam_scores[:, 1:] = -1e9  # every beam starts as the same prefix: expand only the first
        running_beam_indices = torch.full(
            (batch_size, num_beams, max_length - cur_len), -1, dtype=torch.int32, device=device
        )
        finished_sequences, finished_beam_indices = running_sequences.clone(), running_beam_indices.clone()
        finished_scores = torch.full((batch_size, num_beams), -1e9, device=device)
        is_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
        can_improve = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
        sentences = torch.arange(batch_size, device=device)
        results = (finished_sequences.clone(), finished_beam_indices.clone())  # every sentence's, once final

        # All K beams of a sentence start from the same prefix: the first step runs on one of them, and its caches
        # and logits are then copied to the others (at this step the cross-attention keys and values are computed).
        first_beams = torch.arange(batch_size, device=device) * num_beams  # (B,)
        encoder_hidden_states = model_kwargs["encoder_outputs"][0].index_select(0, first_beams)  # (B, S, D)
        attention_mask = model_kwargs.get("attention_mask")
        cross_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=encoder_hidden_states[:, :1],
            attention_mask=attention_mask.index_select(0, first_beams) if attention_mask is not None else None,
            encoder_hidden_states=encoder_hidden_states,
        )
        cache = StaticBeamCache(
            batch_size * num_beams,
            max_length,
            len(self.model.decoder.layers),
            encoder_hidden_states,
            cross_attention_mask,
        )
        logits = self._decoder_step(input_ids[first_beams, -1], cache)  # (B, V)
        every_beam = torch.arange(batch_size, device=device).repeat_interleave(num_beams)  # (B·K,)
        cache.select(every_beam, every_beam)
        logits = logits.float().index_select(0, every_beam)  # (B·K, V)
        while True:
            flat_sequences = running_sequences[:, :, :cur_len].flatten(0, 1)  # (b·K, cur_len)
            log_probs = F.log_softmax(logits, dim=-1)
            for processor in processors:
                log_probs = processor(flat_sequences, log_probs)
            running = len(sentences)
            # reshape: a processor may hand back a non-contiguous slice (transformers' repetition penalty does)
            log_probs = log_probs.reshape(running, num_beams, -1).add_(running_beam_scores[:, :, None])
            log_probs = log_probs.reshape(running, -1)

            candidate_scores, candidate_sequences, candidate_beam_indices = self._get_top_k_continuations(
                accumulated_log_probs=log_probs,
                running_sequences=running_sequences,
                running_beam_indices=running_beam_indices,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                do_sample=False,
                beams_to_keep=candidates_per_sentence,
                num_beams=num_beams,
                batch_size=running,
            )
            candidate_ends = stopping_criteria(candidate_sequences[:, :, : cur_len + 1].flatten(0, 1), None)
            candidate_ends = candidate_ends.view(running, candidates_per_sentence)
            running_sequences, running_beam_scores, running_beam_indices = self._get_running_beams_for_next_iteration(
                candidate_scores, candidate_sequences, candidate_beam_indices, candidate_ends, num_beams
            )
            finished_sequences, finished_scores, finished_beam_indices, is_finished = self._update_finished_beams(
                sequences=finished_sequences,
                topk_running_sequences=candidate_sequences,
                beam_scores=finished_scores,
                topk_log_probs=candidate_scores,
                beam_indices=finished_beam_indices,
                topk_running_beam_indices=candidate_beam_indices,
                is_early_stop_heuristic_unsatisfied=can_improve,
                is_sent_finished=is_finished,
                next_token_hits_stopping_criteria=candidate_ends,
                top_num_beam_mask=is_top_k_candidate,
                num_beams=num_beams,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
            )
            beam_rows = running_beam_indices[:, :, cur_len - prompt_length].flatten().long()  # (b·K,) rows kept
            cur_len += 1
            can_improve = self._check_early_stop_heuristic(
                can_improve,
                running_beam_scores,
                finished_scores,
                is_finished,
                cur_len,
                max_length,
                prompt_length,
                early_stopping,
                length_penalty,
            )

            final = ~can_improve[:, 0] | (is_finished.all(dim=-1) & (early_stopping is True))  # (b,)
            if candidate_ends.all() or final.all():
                results[0][sentences], results[1][sentences] = finished_sequences, finished_beam_indices
                break
            if final.any():
                results[0][sentences[final]] = finished_sequences[final]
                results[1][sentences[final]] = finished_beam_indices[final]
                stay = (~final).nonzero().squeeze(-1)  # (b',)
                rows = (stay[:, None] * num_beams + torch.arange(num_beams, device=device)).flatten()  # (b'·K,)
                sentences = sentences[stay]
                running_sequences, running_beam_scores = running_sequences[stay], running_beam_scores[stay]
                running_beam_indices, finished_scores = running_beam_indices[stay], finished_scores[stay]
                finished_sequences, finished_beam_indices = finished_sequences[stay], finished_beam_indices[stay]
                is_finished, can_improve = is_finished[stay], can_improve[stay]
                # rows of the batch before the removal: the self-attention cache is reordered and cut in one go
                beam_rows = beam_rows.view(-1, num_beams)[stay].flatten()
                cache.select(beam_rows, rows)
                processors = [
                    p.for_sentences(stay) if isinstance(p, PerSentenceMaxLengthLogitsProcessor) else p
                    for p in processors
                ]
            else:
                cache.select(beam_rows)

            last_tokens = running_sequences[:, :, cur_len - 1].flatten()  # (b·K,)
            logits = self._decoder_step(last_tokens, cache).float()  # (b·K, V)

        # As transformers: the best `num_return_sequences` of each sentence, cut to the longest of them.
        num_return = generation_config.num_return_sequences
        sequences = results[0][:, :num_return].flatten(0, 1)
        generated_length = (results[1][:, :num_return].flatten(0, 1) >= 0).sum(dim=1).max()
        return sequences[:, : prompt_length + generated_length]


__all__ = [
    "GNMTLengthPenalty",
    "PerSentenceMaxLengthLogitsProcessor",
    "TransformerGenerationMixin",
    "set_fairseq_decoding",
    "set_paper_decoding",
]
