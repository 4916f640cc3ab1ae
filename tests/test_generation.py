"""Tests of modeling/generation_transformer.py: the paper's decoding (GNMT length penalty, a length limit per
sentence) and the beam-search loop that drops finished sentences, against transformers' own loop."""

import json
import logging
import math
import warnings

import numpy as np
import pytest
import torch
from helpers import (
    EOS,
    PAD,
    batch,
    copy_dataset,
    fairseq_beam_search,
    labelled_batch,
    right_padded,
    sources,
    tiny_config,
    tiny_model,
    word_tokenizer,
)
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    LogitsProcessorList,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)
from transformers.utils import logging as transformers_logging

from modeling import TransformerForConditionalGeneration, generation_transformer
from modeling.generation_transformer import (
    EndOfSentenceBlockedLogitsProcessor,
    PerSentenceMaxLengthLogitsProcessor,
    set_fairseq_decoding,
    set_paper_decoding,
)


def reference_greedy(model, input_ids, attention_mask, steps: int) -> torch.Tensor:
    """Greedy decoding that re-runs the whole prefix at every step, with no cache."""
    decoded = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id)
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(steps):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoded, use_cache=False)
        next_tokens = logits.logits[:, -1].argmax(-1)
        next_tokens = torch.where(finished, torch.full_like(next_tokens, EOS), next_tokens)
        decoded = torch.cat([decoded, next_tokens[:, None]], dim=1)
        finished |= next_tokens == EOS
        if finished.all():
            break
    return decoded


def test_greedy_generate_with_cache_equals_reference_without_cache():
    model = tiny_model(seed=3)
    inputs = batch()
    generated = model.generate(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=1, max_new_tokens=12
    )
    expected = reference_greedy(model, inputs["input_ids"], inputs["attention_mask"], steps=12)
    assert generated.tolist() == expected.tolist()


def test_beam_generate_with_cache_equals_generate_without_cache():
    model = tiny_model(seed=4)
    inputs = sources()
    cached = model.generate(**inputs, max_new_tokens=10)
    uncached = model.generate(**inputs, max_new_tokens=10, use_cache=False)
    assert cached.tolist() == uncached.tolist()
    # The deprecated cache name still works for callers of forward.
    out = model(**inputs, decoder_input_ids=torch.tensor([[EOS], [EOS]]), use_cache=True)
    again = model(
        **inputs, decoder_input_ids=torch.tensor([[5], [6]]), past_key_values=out.past_key_values, use_cache=True
    )
    full = model(**inputs, decoder_input_ids=torch.tensor([[EOS, 5], [EOS, 6]]))
    assert torch.allclose(again.logits[:, -1], full.logits[:, -1], atol=1e-5)


def random_sources(count: int, seed: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """`count` right-padded sources of 2 to 8 tokens ending in </s>, with their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 9, (count,), generator=generator)
    input_ids = torch.full((count, int(lengths.max())), PAD)
    for row, length in enumerate(lengths.tolist()):
        input_ids[row, : length - 1] = torch.randint(3, vocab_size, (length - 1,), generator=generator)
        input_ids[row, length - 1] = EOS
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long()}


SEARCH_SETTINGS = [
    {},
    {"max_length_offset": 2},
    {"early_stopping": False},
    {"early_stopping": "never"},
    {"length_penalty_type": "transformers", "length_penalty": 1.0},
    {"num_return_sequences": 2},
    {"max_new_tokens": 7, "max_length_offset": 2},
    {"num_beams": 3, "no_repeat_ngram_size": 2},
    {"min_new_tokens": 4},
    {"min_length": 6, "max_length_offset": 3},
    {"repetition_penalty": 1.3},  # its processor hands back a non-contiguous slice
    {"eos_token_id": [EOS, 5]},  # several end-of-sentence ids, as transformers' loop takes them
]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("settings", SEARCH_SETTINGS, ids=lambda settings: str(settings) or "paper")
def test_beam_search_dropping_finished_sentences_equals_transformers_loop(settings, attention, decoder_steps):
    batch_sizes, removals, num_beams = decoder_steps, [], settings.get("num_beams", 4)
    torch.manual_seed(7)  # a small vocabulary: random weights then end sentences early and often
    model = TransformerForConditionalGeneration(tiny_config(20)).eval()
    model.config._attn_implementation = attention
    for seed in range(2):
        inputs = random_sources(6, seed, vocab_size=20)
        batch_sizes.clear()
        dropping = model.generate(**inputs, **settings)
        # 6 rows for the first step, 6·K for the next, then fewer each time sentences leave
        assert batch_sizes[:2] == [6, 6 * num_beams]
        removals += [size for size in batch_sizes[2:] if size < 6 * num_beams]
        # return_dict_in_generate takes transformers' own loop, which keeps every sentence to the end
        library = model.generate(**inputs, **settings, return_dict_in_generate=True).sequences
        assert dropping.tolist() == library.tolist()
    assert removals, "sentences should have left the batch"


def test_without_early_stopping_a_sentence_with_its_beams_finished_stays_while_a_longer_one_can_beat_them(
    decoder_steps,
):
    """A length penalty of 2 favours long hypotheses: with early_stopping=False a sentence whose num_beams
    hypotheses have finished may still find a better one, and leaves the batch only when no running beam can."""
    torch.manual_seed(3)
    model = TransformerForConditionalGeneration(tiny_config(20)).eval()
    inputs = random_sources(6, seed=0, vocab_size=20)
    settings = {"early_stopping": False, "length_penalty": 2.0}
    dropping = model.generate(**inputs, **settings)
    assert decoder_steps, "the loop dropping finished sentences ran"
    library = model.generate(**inputs, **settings, return_dict_in_generate=True).sequences
    assert dropping.tolist() == library.tolist()


def test_a_sentence_decoded_in_a_batch_leaves_it_at_the_step_it_would_end_alone(decoder_steps):
    """With early_stopping=True a sentence is done once its num_beams hypotheses have finished: in a batch it leaves
    then, whatever the others still run, so that the batch costs the sum of its sentences' steps (K rows each)."""
    torch.manual_seed(0)
    model = TransformerForConditionalGeneration(tiny_config(12)).eval()
    with torch.no_grad():
        model.model.shared.weight[EOS] *= 2  # end-of-sentence likely: the sentences end after 2 to 11 steps
    inputs = random_sources(6, seed=0, vocab_size=12)
    alone = []
    for row in range(6):
        decoder_steps.clear()
        model.generate(**{name: tensor[row : row + 1] for name, tensor in inputs.items()})
        alone.append(len(decoder_steps))
    assert len(set(alone)) > 2, alone
    decoder_steps.clear()
    model.generate(**inputs)
    assert decoder_steps == [6] + [4 * sum(steps > step for steps in alone) for step in range(1, max(alone))]


def test_with_two_end_of_sentence_ids_beams_keep_running_where_more_than_num_beams_candidates_end_at_once(
    decoder_steps,
):
    """Two end-of-sentence ids can end up to 2K of a step's candidates: transformers keeps 3K, not 2K, so that K
    still run on. With 2K, one of these sentences lost a running beam, and with it hypotheses that a length penalty
    of 3 ranks among the best two."""
    torch.manual_seed(0)
    model = TransformerForConditionalGeneration(tiny_config(12)).eval()
    inputs = random_sources(6, seed=0, vocab_size=12)
    settings = {
        "eos_token_id": [EOS, 5],
        "num_beams": 2,
        "num_return_sequences": 2,
        "early_stopping": "never",
        "length_penalty": 3.0,
        "max_length_offset": 6,
    }
    dropping = model.generate(**inputs, **settings)
    assert decoder_steps, "the loop dropping finished sentences ran"
    library = model.generate(**inputs, **settings, return_dict_in_generate=True).sequences
    assert dropping.tolist() == library.tolist()


def test_the_loop_pads_shorter_outputs_as_transformers_loop_with_a_padding_id_other_than_0(decoder_steps):
    # fairseq's dictionaries pad with 1: transformers' loop fills what follows a shorter output's end-of-sentence
    # with the padding id (with end-of-sentence's only where padding is 0, which its `pad or eos` reads as none)
    torch.manual_seed(7)
    model = TransformerForConditionalGeneration(tiny_config(20, pad_token_id=1)).eval()
    inputs = random_sources(6, 0, vocab_size=20)
    dropping = model.generate(**inputs, max_length_offset=2)
    library = model.generate(**inputs, max_length_offset=2, return_dict_in_generate=True).sequences
    assert decoder_steps and dropping.tolist() == library.tolist()
    padded = [row[row.index(EOS) + 1 :] for row in dropping[:, 1:].tolist()]
    assert any(padded) and all(set(tail) <= {1} for tail in padded), padded


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_loop_dropping_finished_sentences_equals_transformers_loop_in_bfloat16(attention, decoder_steps):
    # The precision the GPU check decodes in (benchmarks/gpu_check.py), here on the CPU.
    torch.manual_seed(7)
    model = TransformerForConditionalGeneration(tiny_config(20)).to(torch.bfloat16).eval()
    model.config._attn_implementation = attention
    removals = []
    for seed in range(3):
        inputs = random_sources(6, seed, vocab_size=20)
        decoder_steps.clear()
        dropping = model.generate(**inputs)
        assert decoder_steps[:2] == [6, 24], "the loop that drops finished sentences ran"
        removals += [size for size in decoder_steps[2:] if size < 24]
        library = model.generate(**inputs, return_dict_in_generate=True).sequences
        assert dropping.tolist() == library.tolist()
    assert removals, "sentences should have left the batch"


def test_the_loop_takes_the_first_steps_log_probabilities_in_float32_as_transformers_loop(decoder_steps):
    # transformers' loop takes every step's log-softmax in float32; taken in bfloat16 at the first step, the scores
    # were rounded and one of these 6 translations changed.
    torch.manual_seed(1)
    model = TransformerForConditionalGeneration(tiny_config(20)).to(torch.bfloat16).eval()
    inputs = random_sources(6, seed=3, vocab_size=20)
    dropping = model.generate(**inputs)
    assert decoder_steps[:2] == [6, 24], "the loop that drops finished sentences ran"
    library = model.generate(**inputs, return_dict_in_generate=True).sequences
    assert dropping.tolist() == library.tolist()


def sequence_log_probability(model, inputs, sequence: torch.Tensor, max_length: int) -> float:
    """log P(sequence | source) by teacher forcing, as beam search scores it: `sequence` starts with the decoder
    start token, and an end-of-sentence forced at the length limit has probability one."""
    tokens = sequence[1:].tolist()
    length = tokens.index(EOS) + 1
    logits = model(**inputs, decoder_input_ids=sequence[None, :length]).logits[0]
    log_probs = logits.log_softmax(-1).gather(-1, torch.tensor(tokens[:length])[:, None])[:, 0]
    scored = length - 1 if length == max_length else length
    return log_probs[:scored].sum().item()


@pytest.mark.parametrize("penalty_type", ["gnmt", "transformers"])
def test_beam_scores_follow_the_chosen_length_penalty(penalty_type):
    model = tiny_model(seed=5)
    source = batch()
    inputs = {"input_ids": source["input_ids"][:1], "attention_mask": source["attention_mask"][:1]}
    alpha, offset = 0.6, 4
    source_length = int(inputs["attention_mask"].sum())
    out = model.generate(
        **inputs,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=alpha,
        length_penalty_type=penalty_type,
        max_length_offset=offset,
        output_scores=True,
        return_dict_in_generate=True,
    )
    expected_scores = []
    for sequence in out.sequences:
        length = sequence[1:].tolist().index(EOS) + 1
        log_probability = sequence_log_probability(model, inputs, sequence, max_length=source_length + offset)
        penalty = ((5 + length) / 6) ** alpha if penalty_type == "gnmt" else length**alpha
        expected_scores.append(log_probability / penalty)
    assert out.sequences_scores.tolist() == pytest.approx(expected_scores, abs=1e-4)
    assert expected_scores == sorted(expected_scores, reverse=True)  # the first returned is the best


def ended_by_the_length_limit_only(**overrides) -> TransformerForConditionalGeneration:
    """`tiny_model(seed=6)`, its output biased towards a token other than the end of sentence (7): only the length
    limit ends its hypotheses."""
    model = tiny_model(seed=6, **overrides)
    with torch.no_grad():
        model.model.shared.weight[7] *= 8
    return model


def test_each_sentence_stops_at_its_own_limit():
    model = ended_by_the_length_limit_only()
    inputs = sources()
    source_lengths = inputs["attention_mask"].sum(-1).tolist()  # [6, 4]
    for num_beams in (1, 4):
        out = model.generate(**inputs, num_beams=num_beams, max_length_offset=3)
        for row, source_length in zip(out.tolist(), source_lengths, strict=True):
            generated = row[1:]
            assert EOS in generated
            assert generated.index(EOS) + 1 == source_length + 3
    assert out.shape[1] == 1 + max(source_lengths) + 3


def test_default_generation_is_the_papers():
    config = tiny_model().generation_config
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)
    assert (config.length_penalty_type, config.max_length_offset) == ("gnmt", 50)
    with pytest.raises(ValueError, match="Unknown length_penalty_type"):
        tiny_model().generate(**sources(), length_penalty_type="x")


def test_a_checkpoint_without_a_generation_config_decodes_as_the_paper_and_says_so(tmp_path, caplog):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()  # copied without it, say
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path)
    config = loaded.generation_config
    assert (config.num_beams, config.length_penalty_type, config.max_length_offset) == (4, "gnmt", 50)
    assert "has no generation_config.json: decoding with the paper's settings" in caplog.text
    inputs = sources()
    assert torch.equal(loaded.generate(**inputs), model.generate(**inputs))


def test_a_saved_generation_config_is_loaded_as_saved(tmp_path, caplog):
    """The paper's settings are the model's own, not derived from config.json: a checkpoint whose decoding was
    changed keeps that decoding, without the warning for a checkpoint that has none."""
    model = tiny_model()
    model.generation_config.num_beams, model.generation_config.max_length_offset = 2, 7
    model.save_pretrained(tmp_path)
    config = TransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (config.num_beams, config.length_penalty_type, config.max_length_offset) == (2, "gnmt", 7)
    assert "has no generation_config.json" not in caplog.text


def test_an_unreadable_generation_config_is_named_not_skipped(tmp_path):
    tiny_model().save_pretrained(tmp_path / "sub")
    (tmp_path / "sub" / "generation_config.json").write_text('{"num_beams": ')  # cut short
    with pytest.raises(ValueError, match=r"sub/generation_config\.json is not a readable generation config"):
        TransformerForConditionalGeneration.from_pretrained(tmp_path / "sub")
    with pytest.raises(ValueError, match=r"sub/generation_config\.json is not a readable generation config"):
        TransformerForConditionalGeneration.from_pretrained(tmp_path, subfolder="sub")
    # given one, transformers reads no file: nor does this check
    given = GenerationConfig(num_beams=3)
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path / "sub", generation_config=given)
    assert loaded.generation_config.num_beams == 3


def test_low_memory_beam_search_is_refused_as_transformers_refuses_it():
    inputs = sources()
    with pytest.raises(ValueError, match="`low_memory=True` is not supported"):
        tiny_model().generate(**inputs, low_memory=True)


@pytest.mark.parametrize("offset", [0, -3, 1.5, True, "50"])
def test_max_length_offset_must_be_a_positive_integer_or_none(offset):
    inputs = sources()
    with pytest.raises(ValueError, match=f"max_length_offset must be a positive integer or None, got {offset!r}"):
        tiny_model().generate(**inputs, max_length_offset=offset)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_an_empty_list_of_end_of_sentence_tokens_is_refused_naming_none_as_the_way_to_decode_without_one(num_beams):
    """It failed with an IndexError, in the length limit or (with the limit off) in the beam search."""
    inputs = sources()
    for offset in (50, None):
        for empty in ([], (), torch.tensor([], dtype=torch.long)):
            with pytest.raises(ValueError, match=r"eos_token_id=.* names no end-of-sentence token; give None"):
                tiny_model().generate(**inputs, eos_token_id=empty, num_beams=num_beams, max_length_offset=offset)


def test_numpy_integers_as_num_beams_or_length_limits_decode_as_python_integers():
    # transformers takes them; they were refused: "num_beams must be a positive integer, got np.int64(2)"
    model, inputs = tiny_model(seed=3), sources()
    expected = model.generate(**inputs, num_beams=2, max_length_offset=3)
    assert torch.equal(model.generate(**inputs, num_beams=np.int64(2), max_length_offset=np.int64(3)), expected)
    fairseq = {"max_length_offset": None, "max_length_a": 0}
    expected = model.generate(**inputs, **fairseq, max_length_b=3)
    assert torch.equal(model.generate(**inputs, **fairseq, max_length_b=np.int64(3)), expected)


def test_a_max_length_offset_of_1_is_the_smallest_limit_and_is_taken():
    inputs = sources()
    lengths = inputs["attention_mask"].sum(dim=-1)
    for num_beams in (1, 2):  # min_new_tokens beyond the limit: every sentence runs to it, end-of-sentence forced
        out = tiny_model().generate(**inputs, max_length_offset=1, min_new_tokens=40, num_beams=num_beams)
        assert [row[1:].index(EOS) + 1 for row in out.tolist()] == (lengths + 1).tolist()


def test_embeddings_or_encoder_states_as_the_source_keep_the_per_sentence_limit():
    """Without ids or a mask, every position of the embeddings (or encoder states) is a source token: source +
    offset, not transformers' default of 20 tokens."""
    model = tiny_model()
    input_ids = torch.randint(4, 50, (2, 30))
    input_ids[:, -1] = EOS
    embeddings = model.get_input_embeddings()(input_ids)
    forced = {"max_length_offset": 4, "min_new_tokens": 34, "num_beams": 2}  # runs to the limit: 30 + 4
    expected = model.generate(input_ids, **forced)
    assert expected.shape[1] == 1 + 34
    assert torch.equal(model.generate(inputs_embeds=embeddings, **forced), expected)
    assert torch.equal(model.generate(encoder_outputs=model.get_encoder()(input_ids=input_ids), **forced), expected)


@pytest.mark.parametrize("with_mask", [True, False])
def test_encoder_outputs_given_twice_decode_the_same_and_are_left_as_given(with_mask):
    """transformers repeats the encoder states for the beams in the object given: the second call decoded 4 rows
    per sentence (without a mask) or failed with an IndexError (with one)."""
    model = tiny_model(seed=3)
    inputs = sources()
    mask = {"attention_mask": inputs["attention_mask"]} if with_mask else {}
    encoder_outputs = model.get_encoder()(**inputs)
    states = encoder_outputs.last_hidden_state.clone()
    first = model.generate(encoder_outputs=encoder_outputs, **mask, num_beams=4, max_new_tokens=8)
    assert torch.equal(encoder_outputs.last_hidden_state, states)
    assert torch.equal(model.generate(encoder_outputs=encoder_outputs, **mask, num_beams=4, max_new_tokens=8), first)


def test_encoder_outputs_given_as_a_tuple_decode_as_a_model_output():
    # before: "`bos_token_id` has to be defined when no `input_ids` are provided"
    model = tiny_model(seed=3)
    inputs = sources()
    encoder_outputs = model.get_encoder()(**inputs)
    expected = model.generate(encoder_outputs=encoder_outputs, attention_mask=inputs["attention_mask"])
    given = (encoder_outputs.last_hidden_state,)
    assert torch.equal(model.generate(encoder_outputs=given, attention_mask=inputs["attention_mask"]), expected)


def test_a_generation_config_given_gets_no_warning_for_an_argument_not_the_users(recwarn):
    inputs = sources()
    tiny_model().generate(**inputs, generation_config=GenerationConfig(num_beams=2))
    assert not [w for w in recwarn if "generation_config" in str(w.message)], [str(w.message) for w in recwarn]


def test_a_generation_config_given_is_left_as_given():
    # the per-sentence limit is set on a copy: written into the caller's config, it capped the next batch given it
    # at this batch's longest limit (sources of 6 and 4 tokens: 6 + 2)
    model, inputs = ended_by_the_length_limit_only(), sources()
    model.generation_config.max_length_offset = 2
    config = GenerationConfig(num_beams=2)
    model.generate(**inputs, generation_config=config)
    assert config.max_new_tokens is None
    longer = torch.cat([inputs["input_ids"][:1, :-1], inputs["input_ids"][:1]], dim=1)  # 11 tokens: 13 to go
    assert model.generate(longer, generation_config=config)[0, 1:].tolist().index(EOS) + 1 == 11 + 2


def test_a_generation_config_given_takes_what_it_leaves_unset_from_the_models():
    """As transformers 5 does: `GenerationConfig(max_new_tokens=5)` has num_beams None, which means the model's."""
    model, inputs = tiny_model(), sources()
    given = model.generate(**inputs, generation_config=GenerationConfig(max_new_tokens=5))
    assert torch.equal(given, model.generate(**inputs, max_new_tokens=5))
    greedy = model.generate(**inputs, generation_config=GenerationConfig(max_new_tokens=5, num_beams=1))
    assert torch.equal(greedy, model.generate(**inputs, max_new_tokens=5, num_beams=1))


def test_a_generation_config_given_takes_the_models_own_fields_it_lacks():
    """`GenerationConfig(num_beams=2)` has no max_length_offset: the model's per-sentence limit still holds."""
    model, inputs = ended_by_the_length_limit_only(), sources()
    model.generation_config.max_length_offset = 2
    given = model.generate(**inputs, generation_config=GenerationConfig(num_beams=2))
    assert [row[1:].index(EOS) + 1 for row in given.tolist()] == [6 + 2, 4 + 2]


@pytest.mark.parametrize("cap", [{"max_new_tokens": 3}, {"max_length": 4}])
def test_a_generation_config_given_keeps_the_length_cap_of_the_models(cap):
    """transformers fills what the config given leaves unset from the model's, its length cap included, which the
    per-sentence limit (source length + 50 here) must then not override."""
    model, inputs = tiny_model(), sources()
    for name, value in cap.items():
        setattr(model.generation_config, name, value)
    for num_beams in (1, 2):
        assert model.generate(**inputs, generation_config=GenerationConfig(num_beams=num_beams)).shape[1] == 4


def test_a_generation_config_given_takes_the_models_own_fields_as_keyword_arguments():
    """A user's `GenerationConfig` lacks this model's fields: given beside it as keyword arguments, they apply (and
    transformers, which knows none of them, is not handed them)."""
    model, inputs = ended_by_the_length_limit_only(), sources()
    given = model.generate(**inputs, generation_config=GenerationConfig(num_beams=2), max_length_offset=2)
    assert [row[1:].index(EOS) + 1 for row in given.tolist()] == [6 + 2, 4 + 2]


def test_a_generation_config_given_turns_the_models_limit_off_with_none():
    """A field of this model's set to None in the config given is the user's choice (no per-sentence limit), not a
    field left unset for the model's to fill."""
    model, inputs = ended_by_the_length_limit_only(), sources()
    model.generation_config.max_length_offset = 2
    config = GenerationConfig(num_beams=2, max_length_offset=None, max_new_tokens=10)
    given = model.generate(**inputs, generation_config=config)
    assert given.shape[1] == 1 + 10 and EOS not in given[:, 1:].flatten().tolist()  # no end-of-sentence forced


@pytest.mark.parametrize("cap", [{"max_new_tokens": 3}, {"max_length": 4}])
def test_a_length_cap_given_as_an_argument_caps_the_whole_batch(cap):
    # the per-sentence limit (source length + 50) must not override a cap the caller gives
    model, inputs = ended_by_the_length_limit_only(), sources()
    for num_beams in (1, 2):
        assert model.generate(**inputs, num_beams=num_beams, **cap).shape[1] == 4


def test_a_generation_config_without_the_models_fields_decodes_as_transformers():
    """A plain `GenerationConfig` set as the model's (one made from config.json by another tool, say) has none of this
    model's fields: their defaults apply, transformers' length penalty and no per-sentence limit, as if given so."""
    model, inputs = tiny_model(), sources()
    settings = {"num_beams": 2, "length_penalty": 2.0, "max_new_tokens": 8}
    expected = model.generate(**inputs, **settings, length_penalty_type="transformers", max_length_offset=None)
    gnmt = model.generate(**inputs, **settings, length_penalty_type="gnmt", max_length_offset=None)
    assert not torch.equal(gnmt, expected)  # the two penalties rank these hypotheses differently
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.generation_config.update(**settings)
    assert not hasattr(model.generation_config, "length_penalty_type")
    assert torch.equal(model.generate(**inputs), expected)


def test_without_an_end_of_sentence_id_every_sentence_runs_to_the_batchs_limit():
    """The per-sentence limit forces end-of-sentence: without an id for it, it gave every token of the last
    position the same score, and the first token of the vocabulary won."""
    model, inputs = tiny_model(), sources()
    for num_beams in (1, 2):
        limited = model.generate(**inputs, eos_token_id=None, max_length_offset=3, num_beams=num_beams)
        capped = model.generate(
            **inputs, eos_token_id=None, max_length_offset=None, max_new_tokens=6 + 3, num_beams=num_beams
        )
        assert torch.equal(limited, capped)


def test_the_limit_forces_the_first_of_a_list_of_end_of_sentence_ids():
    # generation configs often hold a list of ids ([</s>] or [</s>, another stop token]): the first is forced; a
    # tuple or a tensor of them, which transformers takes as a list, forced every one of them with score 0 (the
    # lowest id then won the tie)
    model, inputs = ended_by_the_length_limit_only(), sources()
    for eos_token_id in ([EOS], [EOS, 5], [5, EOS], (5, EOS), torch.tensor([5, EOS]), torch.tensor(EOS)):
        first = torch.as_tensor(eos_token_id).flatten()[0].item()
        for num_beams in (1, 2):
            out = model.generate(**inputs, eos_token_id=eos_token_id, max_length_offset=3, num_beams=num_beams)
            last = [row[limit] for row, limit in zip(out.tolist(), [6 + 3, 4 + 3], strict=True)]  # after the start
            assert last == [first, first], (eos_token_id, num_beams)


def test_without_a_padding_id_every_source_position_counts_for_the_limit():
    model = tiny_model(pad_token_id=None)
    input_ids = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])  # PAD's id is a token like any other here
    for num_beams in (1, 2):
        out = model.generate(input_ids, max_length_offset=3, min_new_tokens=4 + 3, num_beams=num_beams)
        assert [row[1:].index(EOS) + 1 for row in out.tolist()] == [4 + 3, 4 + 3]  # forced at the limit


def test_the_attention_mask_gives_the_source_lengths_for_the_limit():
    """A tokenizer that pads with `</s>` (pad id = end-of-sentence id): counting the ids other than the padding one
    would leave each source's own `</s>` out of its length."""
    model = ended_by_the_length_limit_only(pad_token_id=EOS)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, EOS, EOS]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    for num_beams in (1, 4):
        out = model.generate(input_ids, attention_mask=attention_mask, num_beams=num_beams, max_length_offset=3)
        assert [row[1:].index(EOS) + 1 for row in out.tolist()] == [6 + 3, 4 + 3]


@pytest.mark.parametrize("num_beams", [0, -1, 2.0])
def test_generation_refuses_a_beam_count_below_one_or_not_an_integer(num_beams):
    inputs = sources()
    with pytest.raises(ValueError, match=f"num_beams must be a positive integer, got {num_beams!r}"):
        tiny_model().generate(**inputs, num_beams=num_beams)
    model = tiny_model()
    model.generation_config.num_beams = num_beams  # a saved config is checked the same way
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        model.generate(**inputs)


def test_decoding_falls_back_to_transformers_loop_where_the_static_cache_would_not_give_its_outputs(decoder_steps):
    steps = decoder_steps
    inputs = sources()
    model = tiny_model(seed=8, dropout=0.0)
    expected = model.generate(**inputs, max_length_offset=4)
    assert steps, "the static cache serves the paper's decoding"

    steps.clear()
    handle = model.model.decoder.register_forward_hook(lambda module, args, output: None)
    assert model.generate(**inputs, max_length_offset=4).tolist() == expected.tolist()
    handle.remove()
    handle = model.model.decoder.register_forward_pre_hook(lambda module, args: None)
    assert model.generate(**inputs, max_length_offset=4).tolist() == expected.tolist()
    handle.remove()
    model.train()  # dropout 0: the same outputs, but a training-mode forward is never bypassed
    assert model.generate(**inputs, max_length_offset=4).tolist() == expected.tolist()
    model.eval()
    prompt = torch.tensor([[EOS, 5], [EOS, 6]])  # a decoder prompt longer than the start token
    model.generate(**inputs, decoder_input_ids=prompt, max_length_offset=4)
    assert not steps, "hooks on the bypassed stack, training mode and decoder prompts take transformers' loop"


def test_labels_passed_beside_the_sources_as_seq2seq_trainer_passes_them_keep_the_loop_dropping_finished_sentences(
    decoder_steps,
):
    """`Seq2SeqTrainer.prediction_step` generates from its batch, labels included: transformers never hands them to
    the model while generating, yet as a tensor of their own they sent every evaluation to transformers' slower loop
    (on a trained tiny model, 1.45x the time of a batch of 64)."""
    inputs = labelled_batch()
    model = tiny_model(seed=8, dropout=0.0)
    expected = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    steps = len(decoder_steps)
    assert model.generate(**inputs).tolist() == expected.tolist()
    assert len(decoder_steps) == 2 * steps


def test_a_processor_holding_a_value_per_row_takes_transformers_loop(decoder_steps):
    # sentences 0 and 3 end at the first step and would leave the batch; a repetition penalty's prompt_ignore_length
    # given per row (B·K values) then refused the smaller batch: "Incompatible `prompt_ignore_length` batch size"
    inputs = right_padded([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS], [13, 14, EOS], [20, 21, 22, 23, 24, EOS]], PAD)
    model = tiny_model(50)

    def penalty():
        rows = torch.ones(4 * 4, dtype=torch.long)  # 4 sentences x 4 beams, the decoder start token ignored
        return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=rows)])

    settings = {"num_beams": 4, "max_length_offset": 8}
    library = model.generate(**inputs, **settings, logits_processor=penalty(), return_dict_in_generate=True)
    assert model.generate(**inputs, **settings, logits_processor=penalty()).tolist() == library.sequences.tolist()
    assert not decoder_steps


def test_beam_sampling_takes_transformers_loop(decoder_steps):
    # The loop dropping finished sentences keeps the best candidates; beam sampling draws them, as transformers' loop
    # does (no top-k warper here, whose processor would send it to that loop anyway).
    model, inputs = tiny_model(50), sources()
    settings = {"num_beams": 3, "do_sample": True, "top_k": 0, "max_length_offset": 8}
    torch.manual_seed(0)
    sampled = model.generate(**inputs, **settings)
    torch.manual_seed(0)
    library = model.generate(**inputs, **settings, return_dict_in_generate=True)
    assert sampled.tolist() == library.sequences.tolist()
    assert not decoder_steps


def test_generation_refuses_a_source_without_tokens_naming_the_row():
    model, inputs = tiny_model(), sources()
    for num_beams in (1, 4):
        with pytest.raises(ValueError, match=r"^generate\(\) got input_ids of shape \(2, 0\): no source token"):
            model.generate(
                input_ids=inputs["input_ids"][:, :0],
                attention_mask=inputs["attention_mask"][:, :0],
                num_beams=num_beams,
            )
        with pytest.raises(ValueError, match=r"^generate\(\) got input_ids of shape \(0, \d+\): no source token"):
            model.generate(input_ids=inputs["input_ids"][:0], num_beams=num_beams)  # an empty batch
    inputs["attention_mask"][1] = 0  # the second source is all padding
    with pytest.raises(ValueError, match=r"row 1 of attention_mask is all zeros"):
        model.generate(**inputs)


def test_generation_refuses_one_sentence_not_in_a_batch_naming_the_shape():
    # before: "The size of tensor a (4) must match the size of tensor b (32)", from inside the encoder
    source = torch.tensor([5, 6, 7, EOS])
    with pytest.raises(ValueError, match=r"input_ids of shape \(4,\): give a batch .* input_ids\[None\]"):
        tiny_model().generate(source)
    assert tiny_model().generate(source[None]).shape[0] == 1


@pytest.mark.parametrize("given", ["input_ids and encoder_outputs", "encoder_outputs", "inputs_embeds"])
def test_an_attention_mask_row_of_zeros_is_refused_beside_encoder_states_or_embeddings(given):
    # Beside encoder outputs or embeddings the row went unchecked: generate() silently decoded a translation of
    # nothing, or (given longer to run) failed inside with an IndexError naming no input.
    model, inputs = tiny_model(), sources()
    given_inputs = {
        "input_ids and encoder_outputs": {
            "input_ids": inputs["input_ids"],
            "encoder_outputs": model.get_encoder()(**inputs),
        },
        "encoder_outputs": {"encoder_outputs": model.get_encoder()(**inputs)},
        "inputs_embeds": {"inputs_embeds": model.get_input_embeddings()(inputs["input_ids"])},
    }
    inputs["attention_mask"][1] = 0  # the second source is all padding
    with pytest.raises(ValueError, match=r"row 1 of attention_mask is all zeros"):
        model.generate(**given_inputs[given], attention_mask=inputs["attention_mask"], max_new_tokens=3)


def test_padded_input_ids_without_an_attention_mask_decode_as_with_it():
    """transformers 5 infers the mask from padding for decoder-only models only: the encoder attended to the pads
    of the shorter sources, and 11 of 12 Multi30k translations changed, silently."""
    model, inputs = tiny_model(), sources()
    expected = model.generate(**inputs, num_beams=4, max_new_tokens=6)
    assert torch.equal(model.generate(input_ids=inputs["input_ids"], num_beams=4, max_new_tokens=6), expected)
    assert torch.equal(model.generate(inputs["input_ids"], num_beams=4, max_new_tokens=6), expected)
    encoded = model.get_encoder()(**inputs)  # the cross-attention reads the mask too
    given = model.generate(input_ids=inputs["input_ids"], encoder_outputs=encoded, num_beams=4, max_new_tokens=6)
    assert torch.equal(given, expected)
    alone = model.generate(input_ids=inputs["input_ids"][1:, :4], num_beams=4, max_new_tokens=6)
    assert alone[0].tolist() == expected[1, : alone.shape[1]].tolist()  # the shorter source translated alone
    with pytest.raises(ValueError, match=r"row 1 of attention_mask is all zeros"):
        model.generate(input_ids=torch.tensor([[5, 6, EOS], [PAD, PAD, PAD]]))


# --- fairseq's decoding ---------------------------------------------------------------------------------------


def fairseq_model(seed: int, vocab_size: int = 12, max_length_b: int = 3) -> TransformerForConditionalGeneration:
    """A random model whose end-of-sentence is likely, decoding as fairseq: several hypotheses then finish at one
    step, and at the limit, which is where fairseq's rules differ from transformers'."""
    torch.manual_seed(seed)
    model = TransformerForConditionalGeneration(tiny_config(vocab_size)).eval()
    with torch.no_grad():
        model.model.shared.weight[EOS] *= 2
    set_fairseq_decoding(
        model.generation_config, pad_token_id=PAD, num_beams=4, length_penalty=0.6, max_length_b=max_length_b
    )
    return model


def generated_hypotheses(model, source: list[int], **settings) -> tuple[list[list[int]], list[float]]:
    input_ids = torch.tensor([source])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        num_return_sequences=4,
        output_scores=True,
        return_dict_in_generate=True,
        **settings,
    )
    hypotheses = [row[1:][: row[1:].index(EOS) + 1] for row in out.sequences.tolist()]
    return hypotheses, out.sequences_scores.tolist()


FAIRSEQ_SEARCH_SETTINGS = [
    {},  # set_fairseq_decoding's: at most 3 tokens, then end-of-sentence keeping its log-probability, ...
    {"max_length_a": 1, "max_length_b": 2, "num_return_sequences": 4},
    {"max_length_b": 12, "num_beams": 3},
    {"max_length_b": 12, "beam_finalization": "best"},
]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("settings", FAIRSEQ_SEARCH_SETTINGS, ids=lambda settings: str(settings) or "fairseq")
def test_fairseq_decoding_in_the_loop_dropping_finished_sentences_equals_transformers_loop(
    settings, attention, decoder_steps
):
    batch_sizes, removals = decoder_steps, []
    for seed in range(2):
        model = fairseq_model(seed)
        model.config._attn_implementation = attention
        inputs = random_sources(6, seed, vocab_size=12)
        batch_sizes.clear()
        dropping = model.generate(**inputs, **settings)
        removals += [size for size in batch_sizes[2:] if size < batch_sizes[1]]
        library = model.generate(**inputs, **settings, return_dict_in_generate=True).sequences
        assert dropping.tolist() == library.tolist()
    assert removals, "sentences should have left the batch"


def test_fairseq_decoding_gives_fairseqs_n_best_lists_where_transformers_rules_would_not():
    """Against fairseq's beam search (helpers.fairseq_beam_search, which reproduces fairseq's own outputs): all 4
    finished hypotheses and their scores. transformers' rule of keeping the best 4 finished hypotheses, not the
    first 4, changes some of these lists (never the best hypothesis); transformers' forced end-of-sentence with
    log-probability 0 changes more."""
    differs = {"beam_finalization": 0, "forced_eos_keeps_log_prob": 0}
    compared = 0
    for seed in range(8):
        model = fairseq_model(seed)
        generator = torch.Generator().manual_seed(seed)
        for _ in range(6):
            length = int(torch.randint(2, 8, (1,), generator=generator))
            source = torch.randint(3, 12, (length - 1,), generator=generator).tolist() + [EOS]
            expected = fairseq_beam_search(model, source, beam=4, lenpen=0.6, max_len=3)
            hypotheses, scores = generated_hypotheses(model, source)
            assert hypotheses == [ids for ids, _ in expected], (seed, source)
            assert scores == pytest.approx([score for _, score in expected], abs=1e-5)
            compared += 1
            best_kept, _ = generated_hypotheses(model, source, beam_finalization="best")
            assert best_kept[0] == hypotheses[0]
            differs["beam_finalization"] += best_kept != hypotheses
            zero_eos, _ = generated_hypotheses(model, source, forced_eos_keeps_log_prob=False)
            differs["forced_eos_keeps_log_prob"] += zero_eos != hypotheses
    assert compared == 48 and all(differs.values()), differs


def test_fairseq_limit_is_a_times_the_padded_width_plus_b_for_every_sentence_of_the_batch():
    model = ended_by_the_length_limit_only()
    inputs = sources()  # sources of 6 and 4 tokens, width 6
    for num_beams in (1, 4):
        for a, b in ((0, 3), (0.5, 2), (1.2, 0)):
            out = model.generate(
                **inputs,
                num_beams=num_beams,
                max_length_offset=None,
                max_length_a=a,
                max_length_b=b,
                forced_eos_keeps_log_prob=True,
            )
            limit = int(a * 6 + b)  # tokens before the end-of-sentence, the same for both rows
            for row in out.tolist():
                assert row[1:].index(EOS) == limit, (num_beams, a, b, row)
    capped = ended_by_the_length_limit_only(max_position_embeddings=8)
    out = capped.generate(**inputs, num_beams=1, max_length_offset=None, max_length_b=200)
    assert out[0, 1:].tolist().index(EOS) == 7  # max_position_embeddings - 1, as fairseq's max_len - 1


def test_fairseq_limit_with_only_a_or_only_b_set_takes_fairseqs_default_for_the_other():
    # as fairseq's --max-len-a 0 and --max-len-b 200: setting one turns the limit on, the other keeps its default
    model = ended_by_the_length_limit_only(max_position_embeddings=256)  # room for 200 tokens, uncapped
    inputs = sources()  # width 6
    for given, limit in (({"max_length_a": 0.5}, int(0.5 * 6 + 200)), ({"max_length_b": 5}, 0 * 6 + 5)):
        out = model.generate(**inputs, num_beams=1, max_length_offset=None, **given)
        assert [row[1:].index(EOS) for row in out.tolist()] == [limit, limit], given


def test_fairseq_limit_takes_the_width_of_embeddings_or_encoder_states_given_in_place_of_ids():
    model = ended_by_the_length_limit_only()
    input_ids = batch()["input_ids"][:1]  # 6 tokens, no padding
    limit = {"num_beams": 2, "max_length_offset": None, "max_length_a": 0.5, "max_length_b": 1}  # int(0.5 · 6 + 1)
    sources = {
        "input_ids": {"input_ids": input_ids},
        "inputs_embeds": {"inputs_embeds": model.get_input_embeddings()(input_ids)},
        # the encoder's output as it comes, its hidden states included: the width is that of its first tensor
        "encoder_outputs": {"encoder_outputs": model.get_encoder()(input_ids=input_ids, output_hidden_states=True)},
    }
    for name, source in sources.items():
        assert model.generate(**source, **limit)[0, 1:].tolist().index(EOS) == 4, name


def test_forced_end_of_sentence_keeps_or_zeroes_its_score():
    scores = torch.log_softmax(torch.randn(4, 10), dim=-1)
    input_ids = torch.zeros((4, 5), dtype=torch.long)  # 5 tokens: at the limit of 5, below that of 6
    for keep in (True, False):
        processor = PerSentenceMaxLengthLogitsProcessor(torch.tensor([5, 6]), EOS, keep_eos_score=keep)
        out = processor(input_ids, scores.clone())  # 2 rows per sentence
        assert torch.equal(out[2:], scores[2:])
        assert out[:2, EOS].tolist() == (scores[:2, EOS].tolist() if keep else [0.0, 0.0])
        assert torch.isinf(out[:2].index_fill(1, torch.tensor([EOS]), 0)).sum() == 2 * 9
        assert processor.for_sentences(torch.tensor([1])).keep_eos_score is keep
    unasked = PerSentenceMaxLengthLogitsProcessor(torch.tensor([5, 6]), EOS)  # transformers' forced EOS: 0
    assert unasked(input_ids, scores.clone())[:2, EOS].tolist() == [0.0, 0.0]
    # end-of-sentence blocked by an earlier processor (-inf, a min_new_tokens beyond the limit) is forced with 0,
    # as transformers' forced EOS: its -inf kept, every token of the row would be -inf
    blocked = scores.clone()
    blocked[0, EOS] = -math.inf
    kept = PerSentenceMaxLengthLogitsProcessor(torch.tensor([5, 6]), EOS, keep_eos_score=True)(input_ids, blocked)
    assert kept[:2, EOS].tolist() == [0.0, scores[1, EOS].item()]


@pytest.mark.parametrize("kind", ["min_length", "min_new_tokens"])
def test_the_loop_blocks_end_of_sentence_below_the_minimum_length_in_place(kind):
    # transformers' min-length processors copy the (rows, V) scores twice every step; the loop dropping finished
    # sentences calls one of its own in their place, which sets end-of-sentence's scores to the same values in place.
    eos = torch.tensor([EOS, 5])  # several end-of-sentence ids, each blocked
    if kind == "min_length":
        library = MinLengthLogitsProcessor(6, eos)
    else:
        library = MinNewTokensLengthLogitsProcessor(2, 4, eos)  # a prompt of 2, then 4 new tokens: 6
    replaced = EndOfSentenceBlockedLogitsProcessor.replacing(library)
    assert isinstance(replaced, EndOfSentenceBlockedLogitsProcessor)
    scores = torch.log_softmax(torch.randn(3, 10, generator=torch.Generator().manual_seed(0)), dim=-1)
    for length in (5, 6):  # blocked below 6 tokens, free from there
        input_ids = torch.zeros((3, length), dtype=torch.long)
        expected = library(input_ids, scores.clone())
        given = scores.clone()
        assert replaced(input_ids, given) is given
        assert torch.equal(given, expected), length
    other = RepetitionPenaltyLogitsProcessor(1.3)
    assert EndOfSentenceBlockedLogitsProcessor.replacing(other) is other


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("return_dict", [False, True])  # beam search: the loop dropping finished sentences, or not
def test_a_minimum_length_beyond_the_limit_still_ends_every_hypothesis_there(num_beams, return_dict):
    # End-of-sentence, blocked up to 6 tokens, kept its -inf at the limit of 3: every token was -inf there, and the
    # output an arbitrary hypothesis without end-of-sentence (greedy decoding: a <pad> in its place).
    model = fairseq_model(seed=1)
    inputs = random_sources(3, seed=1, vocab_size=12)
    out = model.generate(**inputs, num_beams=num_beams, min_new_tokens=6, return_dict_in_generate=return_dict)
    sequences = out.sequences if return_dict else out
    assert [row[4] for row in sequences.tolist()] == [EOS] * 3  # 3 tokens, then end-of-sentence


def test_set_fairseq_decoding_and_its_fields_as_keyword_arguments():
    config = GenerationConfig()
    set_fairseq_decoding(config, pad_token_id=1)  # fairseq-generate's defaults: --beam 5 --lenpen 1
    assert (config.num_beams, config.length_penalty, config.max_length_a, config.max_length_b) == (5, 1.0, 0, 200)
    set_fairseq_decoding(config, pad_token_id=1, num_beams=4, length_penalty=0.6)
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)
    assert (config.max_length_a, config.max_length_b, config.max_length_offset) == (0, 200, None)
    assert (config.forced_eos_keeps_log_prob, config.beam_finalization, config.length_penalty_type) == (
        True,
        "first",
        "transformers",
    )
    assert (config.suppress_tokens, config.min_new_tokens) == ([1], 1)
    # the paper's generation config (and any saved before these fields existed) takes them as keyword arguments
    model = tiny_model(seed=6)
    assert not any(hasattr(model.generation_config, name) for name in ("max_length_b", "beam_finalization"))
    inputs = sources()
    out = model.generate(**inputs, max_length_offset=None, max_length_b=2, beam_finalization="first")
    assert out.shape[1] == 1 + 2 + 1, "the start, max_length_b = 2 tokens, the end of sentence forced there"


@pytest.mark.parametrize("decoding", ["paper", "fairseq"])
def test_a_decoding_set_on_a_config_made_from_config_json_is_loaded_as_set(tmp_path, caplog, decoding):
    """`GenerationConfig.from_model_config` marks its config as made from config.json, which from_pretrained
    replaces with the paper's decoding: a decoding set on it makes it the model's own, loaded as saved."""
    model = tiny_model()
    config = GenerationConfig.from_model_config(model.config)
    if decoding == "paper":
        set_paper_decoding(config)
        config.num_beams = 2
        expected = (2, "gnmt", 50, None)
    else:
        set_fairseq_decoding(config, pad_token_id=PAD, num_beams=3)
        expected = (3, "transformers", None, 200)
    model.generation_config = config
    model.save_pretrained(tmp_path)
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config
    fields = ("num_beams", "length_penalty_type", "max_length_offset", "max_length_b")
    assert tuple(getattr(loaded, name, None) for name in fields) == expected
    assert "has no generation_config.json" not in caplog.text


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_length_b": 10}, r"max_length_offset=50 and max_length_a/max_length_b both set a length limit"),
        ({"max_length_offset": None, "max_length_a": -1}, "max_length_a must be a non-negative number, got -1"),
        ({"max_length_offset": None, "max_length_b": "10"}, "max_length_b must be a non-negative number"),
        ({"max_length_offset": None, "max_length_a": True}, "max_length_a must be a non-negative number, got True"),
        ({"beam_finalization": "last"}, "Unknown beam_finalization 'last'"),
        ({"forced_eos_keeps_log_prob": 1}, "forced_eos_keeps_log_prob must be True or False, got 1"),
    ],
)
def test_fairseq_decoding_fields_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        tiny_model().generate(**sources(), **settings)


def test_a_plain_seq2seq_trainer_evaluation_leaves_the_length_limit_of_later_translations(tmp_path):
    """`Seq2SeqTrainer` writes the library's defaults, max_length=20 among them, into the model's generation config
    after each generate() it evaluates with; they must not cap later translations, nor be saved."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer))
    # One batch: the evaluation's single generate() comes before the Trainer's fill, the next is the user's own.
    args = Seq2SeqTrainingArguments(
        tmp_path, use_cpu=True, report_to="none", predict_with_generate=True, per_device_eval_batch_size=4
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=copy_dataset([6, 8, 5, 7], len(tokenizer)),
        data_collator=collator,
        compute_metrics=lambda prediction: {},  # the Trainer generates only for metrics
    )
    trainer.evaluate()
    assert model.generation_config.max_length == 20, "what the Trainer wrote"
    source = torch.arange(3, 33).unsqueeze(0)  # 30 tokens: the paper's limit is 80
    assert model.generate(source, min_new_tokens=40).shape[1] > 40
    trainer.evaluate()
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert "max_length" not in saved and "top_k" not in saved and saved["max_length_offset"] == 50
    model.generation_config.max_length = 30  # a cap set by hand stays one
    assert model.generate(source, min_new_tokens=25).shape[1] == 30


@pytest.mark.parametrize(
    "settings",
    [{}, {"num_beams": 1}, {"num_return_sequences": 2, "output_scores": True, "return_dict_in_generate": True}],
    ids=["the paper's beam search", "greedy", "two hypotheses with scores"],
)
@pytest.mark.parametrize("decoding", ["paper", "fairseq"])
def test_generate_warns_of_nothing(settings, decoding):
    """A warning here comes at every batch of a translation run, or every step (a softmax without `dim`); a
    `warning_once` from transformers is shown once per process, so its record is cleared first."""
    model = fairseq_model(seed=0, vocab_size=50) if decoding == "fairseq" else tiny_model(seed=3)
    inputs = batch()
    transformers_logging.warning_once.cache_clear()
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    loggers = [logging.getLogger("transformers"), logging.getLogger("modeling")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **settings)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [str(warning.message) for warning in caught] == []
    assert [record.getMessage() for record in records] == []


def test_every_name_the_module_exports_exists():
    """`from modeling.generation_transformer import *` fails on a name of `__all__` that the module does not hold."""
    names = generation_transformer.__all__
    assert [name for name in names if not hasattr(generation_transformer, name)] == []
