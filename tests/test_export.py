"""Exports to CTranslate2, MarianMT and ONNX: each runtime computes what this model computes.

The CTranslate2 and Marian tests decode models trained for a few seconds, which end their sentences at different
lengths, with the decoding both sides can express (beam 4, score / length ** 0.6, a fixed max_new_tokens).
"""

import copy
import json
import math
import re

import ctranslate2
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from helpers import (
    EOS,
    FAIRSEQ_FIXTURES,
    FAIRSEQ_MODELS,
    FIRST_ID,
    PAD,
    fairseq_outputs,
    right_padded,
    synthetic_pairs,
    tiny_model,
    tiny_tokenizer,
    trained_tiny_translator,
    word_level_tokenizer,
)
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    MarianMTModel,
    PreTrainedTokenizerFast,
)
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from modeling import export
from modeling.convert import from_marian, to_marian
from modeling.generation_transformer import set_fairseq_decoding
from modeling.modeling_transformer import TransformerModel
from modeling.quantization import quantize_int8
from modeling.translation import translate

FAIRSEQ_PAD = 1  # fairseq's dictionaries: <s> <pad> </s> <unk>, the same </s> as this project's
SETTINGS = {"num_beams": 4, "max_new_tokens": 24, "length_penalty": 0.6, "early_stopping": True, "do_sample": False}
CT2_SETTINGS = {"beam_size": 4, "max_decoding_length": 24, "length_penalty": 0.6, "min_decoding_length": 0}
SOURCES = [en for en, _ in synthetic_pairs(16, seed=3)]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def trained(tokenizer):
    """{(layout, attention_bias): a trained tiny model}, built once for the module."""
    models = {}
    for layout in ("interleaved", "concatenated"):
        for bias in (False, True):
            models[layout, bias] = trained_tiny_translator(
                tokenizer, positional_encoding_layout=layout, attention_bias=bias
            )
    return models


def strip(row: list[int]) -> list[int]:
    """Generated ids without the start token, </s> and the padding after it."""
    generated = row[1:]
    return generated[: generated.index(EOS)] if EOS in generated else generated


def model_translations(model, tokenizer, sources=SOURCES, **overrides) -> list[list[int]]:
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    kwargs = {**SETTINGS, "length_penalty_type": "transformers", "max_length_offset": None, **overrides}
    with torch.no_grad():
        return [strip(row) for row in model.generate(**batch, **kwargs).tolist()]


def source_tokens(tokenizer, sources=SOURCES) -> list[list[str]]:
    return [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]]


def ct2_translations(directory, tokenizer, sources=SOURCES, **options) -> list[list[int]]:
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    results = translator.translate_batch(source_tokens(tokenizer, sources), **{**CT2_SETTINGS, **options})
    return [tokenizer.convert_tokens_to_ids(result.hypotheses[0]) for result in results]


# --- CTranslate2 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_ctranslate2_float32_beam_search_equals_the_model(trained, tokenizer, tmp_path, layout, bias):
    model = copy.deepcopy(trained[layout, bias])
    if bias:  # trained biases are small: make them matter
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("_proj.bias"):
                    parameter.add_(0.05 * torch.randn_like(parameter))
    ours = model_translations(model, tokenizer)
    assert len({len(output) for output in ours}) > 3, "sentences should end at various lengths"
    assert min(len(output) for output in ours) < SETTINGS["max_new_tokens"] - 1, "some should end before the cap"

    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert ct2_translations(tmp_path / "ct2", tokenizer) == ours


class EndOfSentenceRemovedBeforeSoftmax(LogitsProcessor):
    """CTranslate2's `min_decoding_length`, as a processor: end-of-sentence leaves the distribution, which is
    renormalised over the other tokens."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, EOS] = -math.inf
        return scores.log_softmax(dim=-1)


def test_ctranslate2_at_a_forced_length_renormalises_without_end_of_sentence(trained, tokenizer, tmp_path):
    """Why the benchmarks' fixed-length workload agrees with CTranslate2 on few sentences: at min = max length,
    CTranslate2 removes end-of-sentence before its softmax, so each beam's distribution is renormalised, where
    transformers' `min_new_tokens` (and so this model) masks it after; beams then rank differently wherever the model
    would rather end. The export is exact: with CTranslate2's rule as a processor, the outputs are the same."""
    model = trained["interleaved", False]
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    length = SETTINGS["max_new_tokens"]
    forced = ct2_translations(tmp_path / "ct2", tokenizer, min_decoding_length=length, max_decoding_length=length)
    assert {len(output) for output in forced} == {length}
    renormalised = LogitsProcessorList([EndOfSentenceRemovedBeforeSoftmax()])
    assert model_translations(model, tokenizer, logits_processor=renormalised) == forced
    assert model_translations(model, tokenizer, min_new_tokens=length) != forced, "the two rules part ways here"


def assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, directory) -> None:
    """Teacher-forced log-probabilities of reference targets: the logits agree, not only the argmax."""
    pairs = synthetic_pairs(6, seed=5)
    targets = tokenizer(text_target=[de for _, de in pairs])["input_ids"]  # each ends in </s>
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    # CTranslate2 appends </s> itself.
    results = translator.score_batch(
        source_tokens(tokenizer, [en for en, _ in pairs]), [tokenizer.convert_ids_to_tokens(t[:-1]) for t in targets]
    )
    for (en, _), target, result in zip(pairs, targets, results, strict=True):
        labels = torch.tensor([target])
        with torch.no_grad():
            logits = model(**tokenizer([en], return_tensors="pt"), labels=labels).logits[0]
        expected = torch.log_softmax(logits, dim=-1).gather(-1, labels[0][:, None])[:, 0]
        assert torch.allclose(torch.tensor(result.log_probs), expected, atol=1e-4)


def test_ctranslate2_scores_are_the_model_log_probabilities(trained, tokenizer, tmp_path):
    model = trained["interleaved", False]
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, tmp_path / "ct2")


@pytest.mark.parametrize(
    "override",
    [
        {"layer_norm_eps": 1e-2},
        {"scale_embedding": False},
        {"tie_word_embeddings": False},
        {"decoder_attention_heads": 2, "decoder_ffn_dim": 48, "decoder_layers": 1},
        {"activation_function": "gelu"},
        {"eos_token_id": [EOS]},  # a list of one: the end-of-sentence token it holds
    ],
    ids=lambda override: ",".join(override),
)
def test_ctranslate2_represents_other_configs_exactly(tokenizer, tmp_path, override):
    model = tiny_model(len(tokenizer), **override)
    if not model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() != model.model.encoder.embed_tokens.weight.data_ptr()
    with torch.no_grad():  # LayerNorm parameters away from (1, 0), so that the epsilon and the norms matter
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.add_(0.2 * torch.randn_like(parameter))
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, tmp_path / "ct2")


@pytest.mark.parametrize(
    "activation", ["gelu_python", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "silu", "swish"]
)
def test_ctranslate2_computes_every_activation_it_accepts_as_the_model_does(tokenizer, tmp_path, activation):
    """transformers' names for the functions CTranslate2 has (its converter's table): the tanh and sigmoid
    approximations of GELU are their own functions there, not GELU's."""
    model = tiny_model(len(tokenizer), activation_function=activation, tie_word_embeddings=False)
    # Pre-activations where the approximations part from GELU, and logits large enough that GELU in their place
    # moves the log-probabilities by about 1e-2, far beyond the tolerance.
    with torch.no_grad():
        for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
            layer.ffn.fc1.weight.mul_(4)
        model.lm_head.weight.mul_(30)
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, tmp_path / "ct2")


def test_ctranslate2_exports_an_output_projection_given_a_bias(tokenizer, tmp_path):
    """The paper's output projection has no bias; one a user gave the model (`set_output_embeddings`) is exported
    with it, not dropped."""
    model = tiny_model(len(tokenizer), tie_word_embeddings=False)
    head = torch.nn.Linear(model.config.d_model, model.config.vocab_size)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.copy_(torch.randn(model.config.vocab_size))  # large enough to change every distribution
    model.set_output_embeddings(head)
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, tmp_path / "ct2")


def test_ctranslate2_takes_the_special_tokens_from_the_tokenizer_not_its_defaults(tmp_path):
    """CTranslate2 defaults to <unk> and </s>: a tokenizer that names its tokens otherwise ends its sentences in its
    own end-of-sentence token, which CTranslate2 must append when it scores and stop at when it translates."""
    tokenizer = word_level_tokenizer(
        ["[PAD]", "[UNK]", "[EOS]"], "$A [EOS]", pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )
    model = tiny_model(len(tokenizer))  # pad 0 and end-of-sentence 2 (its decoder start): [PAD] and [EOS]
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    config = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert (config["decoder_start_token"], config["eos_token"], config["unk_token"]) == ("[EOS]", "[EOS]", "[UNK]")
    assert_ctranslate2_scores_are_the_model_log_probabilities(model, tokenizer, tmp_path / "ct2")


def test_ctranslate2_takes_the_positional_table_from_the_model(tokenizer, tmp_path):
    """A positional module with another table (here: positions shifted by 2, as fairseq's offset would) is
    exported as the model computes it; Marian, which computes its own sinusoids, refuses it."""
    model = trained_tiny_translator(tokenizer, steps=60)
    for stack in (model.model.encoder, model.model.decoder):
        module = stack.embed_positions
        module.forward = lambda start, length, module=module: module.compute_table(length, start + 2)
    reference = model_translations(model, tokenizer, max_new_tokens=12)
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert ct2_translations(tmp_path / "ct2", tokenizer, max_decoding_length=12) == reference
    with pytest.raises(ValueError, match="cannot export to MarianMT exactly: the positional encodings"):
        export.to_marian(model, tokenizer, tmp_path / "marian")
    assert not (tmp_path / "marian").exists()


@pytest.mark.parametrize("name", FAIRSEQ_MODELS)
def test_ctranslate2_export_of_a_converted_fairseq_model_is_exact(converted_fairseq, tmp_path, name):
    """Its positions (offset by 2, tensor2tensor's frequencies) come from the model's own module: float32
    CTranslate2 gives this model's log-probabilities, and with translate_options.json (beam 4, lenpen 0.6,
    min_decoding_length 1; fairseq's limit of 200 tokens, which no held-out sentence reaches) this model's, that is
    fairseq's, translations of the held-out sentences. Marian, which adds the paper's sinusoids, refuses it."""
    model, fairseq_tokenizer = converted_fairseq[name]
    export.to_ctranslate2(model, fairseq_tokenizer, tmp_path / "ct2")
    options = json.loads((tmp_path / "ct2" / "translate_options.json").read_text())
    assert options == {
        "beam_size": 4,
        "length_penalty": 0.6,
        "max_input_length": 1024,
        "max_decoding_length": 200,
        "min_decoding_length": 1,
    }
    not_expressed = json.loads((tmp_path / "ct2" / "export.json").read_text())["not_expressed"]
    assert [line.split(":")[0] for line in not_expressed] == [
        "max_input_length=1024",
        "max_length_a=0, max_length_b=200",
        "min_new_tokens=1",
        "suppress_tokens=[1]",
    ]

    outputs = fairseq_outputs(name)
    sources = [record["src_ids"] for record in outputs["heldout_binarized"]]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    results = translator.translate_batch([fairseq_tokenizer.convert_ids_to_tokens(ids) for ids in sources], **options)
    theirs = [fairseq_tokenizer.convert_tokens_to_ids(result.hypotheses[0]) + [EOS] for result in results]
    with torch.no_grad():
        generated = model.generate(**right_padded(sources, pad=FAIRSEQ_PAD)).tolist()
    ours = [row[1:][: row[1:].index(EOS) + 1] for row in generated]
    assert theirs == ours
    fairseq = outputs["settings"]["generate/beam4_lenpen0.6_bs16"]["sentences"]
    assert ours == [sentence["nbest"][0]["ids"] for sentence in fairseq]

    recorded = torch.load(FAIRSEQ_FIXTURES / name / "teacher_forced.pt", weights_only=True)
    targets = [row[row.ne(FAIRSEQ_PAD)].tolist() for row in recorded["target"]]  # each ends in </s>
    rows = [row[row.ne(FAIRSEQ_PAD)].tolist() for row in recorded["src_tokens_right_padded"]]
    scored = translator.score_batch(
        [fairseq_tokenizer.convert_ids_to_tokens(row) for row in rows],
        [fairseq_tokenizer.convert_ids_to_tokens(target[:-1]) for target in targets],  # CTranslate2 appends </s>
    )
    for index, (target, result) in enumerate(zip(targets, scored, strict=True)):
        expected = recorded["lprobs"][index, : len(target)].gather(-1, torch.tensor(target)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(result.log_probs), expected, atol=1e-4)

    with pytest.raises(ValueError, match="^cannot export to MarianMT exactly: positional_encoding_frequencies="):
        export.to_marian(model, fairseq_tokenizer, tmp_path / "marian")
    assert not (tmp_path / "marian").exists()


def test_ctranslate2_directory_holds_vocabulary_tokenizer_and_decoding_settings(tokenizer, tmp_path):
    model = tiny_model(len(tokenizer))
    directory = tmp_path / "ct2"
    assert export.to_ctranslate2(model, tokenizer, directory) == directory
    vocabulary = json.loads((directory / "shared_vocabulary.json").read_text())
    assert vocabulary == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    config = json.loads((directory / "config.json").read_text())
    assert (config["decoder_start_token"], config["eos_token"], config["unk_token"]) == ("</s>", "</s>", "<unk>")
    assert config["bos_token"] == "</s>", "without the tokenizer's, the decoder's start token, not a token it lacks"
    assert AutoTokenizer.from_pretrained(directory)("a dog.")["input_ids"] == tokenizer("a dog.")["input_ids"]

    # The paper's decoding: beam 4 and alpha 0.6 carry over; the GNMT form and source + 50 do not, and are listed.
    options = json.loads((directory / "translate_options.json").read_text())
    assert options == {
        "beam_size": 4,
        "length_penalty": 0.6,
        "max_input_length": 64,
        "max_decoding_length": 64,
        "min_decoding_length": 0,
    }
    record = json.loads((directory / "export.json").read_text())
    assert record["format"] == "ctranslate2" and record["quantization"] == "float32"
    assert [line.split(":")[0] for line in record["not_expressed"]] == [
        "length_penalty_type='gnmt'",
        "max_length_offset=50",
        "max_input_length=64",
    ]
    assert "score / length ** 0.6, not by score / ((5 + length) / 6) ** 0.6" in record["not_expressed"][0]
    readme = (directory / "README.md").read_text()
    assert "translate_batch" in readme and "from an in-memory model." in readme  # a saved model's: its path
    translator = ctranslate2.Translator(str(directory), device="cpu", intra_threads=1)
    long_source = source_tokens(tokenizer, [" ".join(["the dog runs."] * 20)])[0]  # longer than the 64 positions
    assert len(long_source) > 64
    whole, cut = translator.translate_batch([long_source, long_source[:64]], **options)
    assert whole.hypotheses == cut.hypotheses, "CTranslate2 cuts the source, as listed"

    # transformers' length penalty and a fixed limit are expressed exactly: only the cut of long sources is listed.
    model.generation_config.length_penalty_type = "transformers"
    model.generation_config.max_length_offset = None
    model.generation_config.max_new_tokens = 30
    model.config._name_or_path = "runs/wmt14-base"  # as from_pretrained() sets it
    export.to_ctranslate2(model, tokenizer, directory)  # replaces the previous export
    assert "from runs/wmt14-base." in (directory / "README.md").read_text()
    assert json.loads((directory / "translate_options.json").read_text())["max_decoding_length"] == 30
    not_expressed = json.loads((directory / "export.json").read_text())["not_expressed"]
    assert [line.split(":")[0] for line in not_expressed] == ["max_input_length=64"]


@pytest.mark.parametrize(
    ("cap", "limit"),
    [
        ({"max_length": 9}, 8),
        ({"max_new_tokens": 8}, 8),
        ({"max_length_b": 200, "max_new_tokens": 8}, 8),
        ({"max_length_b": 200}, 63),  # fairseq's limit beyond the table: generate() stops at its last position
        ({"max_length_a": 0.5}, 63),  # max_length_a alone turns fairseq's limit on, with max_length_b's default
    ],
    ids=lambda value: ",".join(value) if isinstance(value, dict) else str(value),
)
def test_ctranslate2_options_stop_translations_where_generate_stops_them(tokenizer, tmp_path, cap, limit):
    """generate() stops at max_length - 1 new tokens (max_length counts the decoder start token), and within
    fairseq's limit at max_new_tokens; the options took only max_new_tokens, and only without fairseq's limit, and
    let CTranslate2 run on to the positional table's 64 (63 with fairseq's)."""
    model = tiny_model(len(tokenizer))  # random: its translations run to the cap
    settings = {"length_penalty_type": "transformers", "max_length_offset": None, **cap}
    for name, value in settings.items():  # setattr: `update` skips the fairseq fields a paper config lacks
        setattr(model.generation_config, name, value)
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    options = json.loads((tmp_path / "ct2" / "translate_options.json").read_text())
    assert options["max_decoding_length"] == limit
    generated = model.generate(**tokenizer(SOURCES, padding=True, return_tensors="pt"))
    assert ct2_translations(tmp_path / "ct2", tokenizer, **options) == [strip(row) for row in generated.tolist()]


@pytest.mark.parametrize("cap", [{"max_new_tokens": 80}, {"max_length": 81}], ids=lambda value: ",".join(value))
def test_ctranslate2_options_list_a_cap_beyond_the_positional_table_that_they_cut_there(tokenizer, cap):
    """generate() runs on beyond the table's 64 positions (the model computes the rows beyond it) to the cap;
    CTranslate2 has no such position: it stops at 64, which export.json did not say."""
    model = tiny_model(len(tokenizer))  # random: its translations run to the cap
    for name, value in {"length_penalty_type": "transformers", "max_length_offset": None, **cap}.items():
        setattr(model.generation_config, name, value)
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["max_decoding_length"] == 64
    assert model.generate(**tokenizer(SOURCES[:1], return_tensors="pt")).shape[1] == 81  # start token + 80
    assert [line for line in not_expressed if line.startswith("a limit of")] == [
        "a limit of 80 new tokens (max_length or max_new_tokens): CTranslate2 stops every sentence at "
        "max_decoding_length=64 tokens (it has no position beyond the positional table), where generate() lets a "
        "translation run on to 80"
    ]


def test_ctranslate2_options_let_a_long_source_translate_as_far_as_the_paper_limit_lets_generate(tokenizer, tmp_path):
    """Under the paper's limit (source + 50) and no cap, the options took CTranslate2's 256 tokens: the translation
    of a source over 206 tokens, whole from generate(), was cut there without a word."""
    model = tiny_model(len(tokenizer), max_position_embeddings=512)  # random: its translations run to the limit
    model.generation_config.num_beams = 1
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    options = json.loads((tmp_path / "ct2" / "translate_options.json").read_text())
    assert options["max_decoding_length"] == 512
    source = [" ".join(["the dog."] * 70)]
    with torch.no_grad():
        (generated,) = [strip(row) for row in model.generate(**tokenizer(source, return_tensors="pt")).tolist()]
    assert len(generated) > 256
    (translated,) = ct2_translations(tmp_path / "ct2", tokenizer, source, **options)
    assert translated[: len(generated)] == generated


def test_ctranslate2_exports_tokenizer_warns_of_sources_it_cuts(tokenizer, tmp_path):
    """CTranslate2 cuts a source at max_input_length (the positional table's rows) without a word: the exported
    tokenizer's model_max_length was this project's 1024 whatever the table, so nothing warned of it."""
    export.to_ctranslate2(tiny_model(len(tokenizer), max_position_embeddings=40), tokenizer, tmp_path / "ct2")
    assert tokenizer.model_max_length == 1024, "the caller's tokenizer keeps its own"
    assert AutoTokenizer.from_pretrained(tmp_path / "ct2").model_max_length == 40
    not_expressed = json.loads((tmp_path / "ct2" / "export.json").read_text())["not_expressed"]
    assert any(
        line.startswith("max_input_length=40") and "model_max_length at most 40" in line for line in not_expressed
    )


def test_ctranslate2_options_take_min_length_less_the_decoder_start_token(tokenizer):
    model = tiny_model(len(tokenizer))
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    assert torch.equal(model.generate(**batch, min_length=6), model.generate(**batch, min_new_tokens=5))
    model.generation_config.min_length = 6  # was left out: CTranslate2 allowed an empty translation
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["min_decoding_length"] == 5
    assert any(line.startswith("min_new_tokens=5:") for line in not_expressed)
    model.generation_config.min_length = 0  # what transformers 4 wrote into every generation config: no minimum
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["min_decoding_length"] == 0
    assert not any(line.startswith("min_new_tokens") for line in not_expressed)


def test_ctranslate2_options_list_the_decoding_settings_they_leave_out(tokenizer):
    """A generation config's no_repeat_ngram_size (BART's have 3) changes generate()'s translations; the options
    dropped it without a word."""
    model = tiny_model(len(tokenizer))
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    plain = model.generate(**batch)
    model.generation_config.no_repeat_ngram_size, model.generation_config.repetition_penalty = 1, 1.0
    assert not torch.equal(model.generate(**batch), plain)
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert "no_repeat_ngram_size" not in options
    assert [line for line in not_expressed if "not passed on" in line] == [
        "no_repeat_ngram_size=1: not passed on (CTranslate2 decodes as if it were unset)"
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("no_repeat_ngram_size", 3),
        ("encoder_no_repeat_ngram_size", 2),
        ("repetition_penalty", 1.2),
        ("encoder_repetition_penalty", 1.5),
        ("bad_words_ids", [[FIRST_ID]]),
        ("sequence_bias", {(FIRST_ID,): -1.0}),
        ("begin_suppress_tokens", [FIRST_ID]),
        ("forced_bos_token_id", FIRST_ID),
        ("forced_eos_token_id", EOS),
    ],
)
def test_ctranslate2_options_list_each_decoding_setting_they_leave_out(tokenizer, name, value):
    """Each changes generate()'s translations, and translate_batch is given none of them: each is listed alone."""
    model = tiny_model(len(tokenizer))
    setattr(model.generation_config, name, value)
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert name not in options
    assert [line for line in not_expressed if "not passed on" in line] == [
        f"{name}={value!r}: not passed on (CTranslate2 decodes as if it were unset)"
    ]


def test_ctranslate2_options_list_no_setting_left_at_the_value_that_changes_nothing(tokenizer):
    """Generation configs saved by transformers 4 hold every setting, at its default: those change no translation."""
    model = tiny_model(len(tokenizer))
    no_effect = {
        "no_repeat_ngram_size": 0,
        "encoder_no_repeat_ngram_size": 0,
        "repetition_penalty": 1.0,
        "encoder_repetition_penalty": 1.0,
        "bad_words_ids": [],
        "sequence_bias": {},
        "begin_suppress_tokens": [],
        "forced_bos_token_id": None,
        "forced_eos_token_id": None,
        "suppress_tokens": [],
        "do_sample": False,
    }
    for name, value in no_effect.items():
        setattr(model.generation_config, name, value)
    _, not_expressed = export.ctranslate2_translate_options(model)
    assert [line.split("=")[0] for line in not_expressed] == [
        "length_penalty_type",
        "max_length_offset",
        "max_input_length",
    ]


@pytest.mark.parametrize(
    ("settings", "listed"),
    [
        ({"do_sample": True}, ["do_sample=True"]),
        ({"early_stopping": False, "num_beams": 2}, ["early_stopping=False"]),
        ({"early_stopping": "never", "num_beams": 4}, ["early_stopping='never'"]),
        ({"early_stopping": False, "num_beams": 1}, []),  # greedy search has no beams to stop
    ],
    ids=["sampling", "beam-2", "never", "greedy"],
)
def test_ctranslate2_options_list_sampling_and_a_search_that_does_not_stop_early(tokenizer, settings, listed):
    """CTranslate2's translate_batch decodes with beam search and ends a sentence's search once beam_size
    hypotheses have finished: a generation config that samples, or whose beam search goes on, translates otherwise."""
    model = tiny_model(len(tokenizer))
    for name, value in settings.items():
        setattr(model.generation_config, name, value)
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["beam_size"] == settings.get("num_beams", 4)
    paper = ["length_penalty_type", "max_length_offset", "max_input_length"]
    assert [line.split(":")[0] for line in not_expressed if line.split("=")[0] not in paper] == listed


def test_the_gnmt_line_names_the_alpha_ctranslate2_is_given_where_the_generation_config_sets_none(tokenizer):
    """No length_penalty: CTranslate2 is given 1.0, its default and transformers', and the line listing GNMT's
    penalty says which ranking that is."""
    model = tiny_model(len(tokenizer))
    model.generation_config.length_penalty = None
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["length_penalty"] == 1.0
    assert "score / length ** 1.0, not by score / ((5 + length) / 6) ** 1.0" in not_expressed[0]


def test_ctranslate2_options_of_a_generation_config_that_sets_nothing(tokenizer):
    """A generation config of transformers' own defaults (num_beams, length_penalty and every limit unset) decodes
    greedily in generate(), 20 new tokens at most; the options took CTranslate2's default of 256 tokens without a
    word where the positional table is longer."""
    model = tiny_model(len(tokenizer), max_position_embeddings=512)
    model.generation_config = GenerationConfig(decoder_start_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    with torch.no_grad(), pytest.warns(UserWarning, match="model-agnostic default `max_length`"):
        generated = model.generate(**tokenizer(SOURCES[:1], return_tensors="pt"))
    assert generated.shape[1] == 1 + 20, "a random model runs to the limit"
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options == {
        "beam_size": 1,
        "length_penalty": 1.0,
        "max_input_length": 512,
        "max_decoding_length": 256,
        "min_decoding_length": 0,
    }
    assert [line.split(":")[0] for line in not_expressed] == [
        "max_input_length=512",
        "no max_length or max_new_tokens",
    ]
    assert "at max_decoding_length=256 tokens" in not_expressed[1] and "20 new tokens" in not_expressed[1]


def test_ctranslate2_options_ignore_the_length_a_plain_seq2seq_trainer_wrote_into_the_generation_config(
    tokenizer, tmp_path
):
    model = tiny_model(len(tokenizer))
    model.generate(**tokenizer(["a dog."], return_tensors="pt"), max_new_tokens=2)
    model.generation_config.max_length = 20  # its evaluation's fill, which the next generate() undoes
    options, _ = export.ctranslate2_translate_options(model)
    assert options["max_decoding_length"] == 64 and model.generation_config.max_length is None


@pytest.mark.parametrize("target", ["marian", "onnx"])
def test_exports_leave_out_the_length_a_plain_seq2seq_trainer_wrote_into_the_generation_config(
    tokenizer, tmp_path, target
):
    """Exported in the process that trained it (a plain Seq2SeqTrainer's evaluation filled max_length=20 into the
    generation config, which generate() and save_pretrained undo): the MarianMT and ONNX exports saved
    max_length=20, and every translation their runtimes made stopped at 20 tokens."""
    model = tiny_model(len(tokenizer))
    model.generate(**tokenizer(["a dog."], return_tensors="pt"), max_new_tokens=2)
    model.generation_config.max_length = 20  # the evaluation's fill
    if target == "marian":
        export.to_marian(model, tokenizer, tmp_path / "out")
    else:
        export.to_onnx(model, tmp_path / "out", tokenizer=tokenizer)
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert saved.get("max_length") == (model.config.max_position_embeddings if target == "marian" else None)


def test_ctranslate2_readme_of_a_model_under_a_non_ascii_path_is_written_whatever_the_locale(
    tokenizer, tmp_path, ascii_locale
):
    """The README names the model's path, which may hold any character: under LANG=C a write in the locale's
    encoding failed on it."""
    model = tiny_model(len(tokenizer))
    model.config._name_or_path = "runs/wmt14-größe"
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert "from runs/wmt14-größe." in (tmp_path / "ct2" / "README.md").read_text(encoding="utf-8")


def test_ctranslate2_options_of_fairseqs_limit_are_not_cut_at_ctranslate2s_default(tokenizer):
    model = tiny_model(len(tokenizer), max_position_embeddings=1024)
    generation = model.generation_config
    generation.max_length_offset, generation.max_length_b = None, 300  # 300 tokens, then end-of-sentence
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["max_decoding_length"] == 300
    (limit,) = [line for line in not_expressed if line.startswith("max_length_a=0, max_length_b=300:")]
    assert "forces" not in limit, "this config forces no end-of-sentence of its own (forced_eos_keeps_log_prob)"


def test_ctranslate2_options_of_fairseqs_limit_scaled_by_the_source_take_the_longest_source(tokenizer):
    """max_length_a scales fairseq's limit with the source: CTranslate2's one limit is that of the longest source it
    takes (the positional table's 512 tokens), and the per-batch limit is listed."""
    model = tiny_model(len(tokenizer), max_position_embeddings=512)
    generation = model.generation_config
    generation.max_length_offset, generation.max_length_a, generation.max_length_b = None, 0.5, 10
    options, not_expressed = export.ctranslate2_translate_options(model)
    assert options["max_decoding_length"] == int(0.5 * 512 + 10)
    (limit,) = [line for line in not_expressed if line.startswith("max_length_a=0.5, max_length_b=10:")]
    assert "does not follow each batch's source width (a = 0.5)" in limit


def test_the_ctranslate2_readme_code_runs_as_written_and_its_file_translation_keeps_lines(
    trained, tokenizer, tmp_path, monkeypatch, capsys
):
    export.to_ctranslate2(trained["interleaved", False], tokenizer, tmp_path / "ct2")
    readme = (tmp_path / "ct2" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) == 2
    lines = SOURCES[:5] + ["", " \t "] + ["  " + SOURCES[5] + " "] + SOURCES[6:]  # as translate() reads them
    (tmp_path / "news.en").write_text("".join(line + "\n" for line in lines))
    monkeypatch.chdir(tmp_path)  # the code names the export by its directory's name, from beside it
    exec(blocks[0] + blocks[1], {})
    assert capsys.readouterr().out.startswith("['")  # the one sentence's translation, printed
    options = json.loads((tmp_path / "ct2" / "translate_options.json").read_text())
    expected = [tokenizer.decode(ids) for ids in ct2_translations(tmp_path / "ct2", tokenizer, SOURCES, **options)]
    written = (tmp_path / "news.de").read_text().split("\n")
    assert written == expected[:5] + ["", ""] + expected[5:] + [""]  # one line per line, the last one ended


def test_the_ctranslate2_readme_file_translation_writes_a_line_break_inside_a_translation_as_a_space(
    tokenizer, tmp_path, monkeypatch, capsys
):
    export.to_ctranslate2(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ct2")
    blocks = re.findall(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), flags=re.DOTALL)
    (tmp_path / "news.en").write_text("a dog.\nthe cat.\n")
    load = AutoTokenizer.from_pretrained

    def tokenizer_of_web_text(*args, **kwargs):  # a model trained on ParaCrawl emits "\r", U+2028, ... in a sentence
        loaded = load(*args, **kwargs)
        loaded.decode = lambda ids, **settings: "\ra\rdog\u2028runs\x85fast\nnow\r\r"
        return loaded

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tokenizer_of_web_text)
    monkeypatch.chdir(tmp_path)
    exec(blocks[0] + blocks[1], {})
    capsys.readouterr()
    # was a line of each piece; then " a dog runs fast now " where translate() strips them
    assert (tmp_path / "news.de").read_bytes() == b"a dog runs fast now\n" * 2


def test_the_ctranslate2_readme_decodes_translations_without_special_tokens_as_translate_does(
    trained, tokenizer, tmp_path, monkeypatch, capsys
):
    """A model that emits `<unk>` and, resized beyond its tokenizer, a placeholder row: translate() leaves both out
    of the text (skip_special_tokens); the README's code wrote `<unk>` for each."""
    model, extended = copy.deepcopy(trained["interleaved", False]), copy.deepcopy(tokenizer)
    extended.add_tokens(["<ent>", "Zürich"])
    model.resize_token_embeddings(len(extended), pad_to_multiple_of=8)  # 98 tokens, 104 rows
    generation = model.generation_config
    generation.length_penalty_type, generation.max_length_offset, generation.max_new_tokens = "transformers", None, 24
    with torch.no_grad():  # rows that outscore frequent words: the model emits them in their place
        embeddings = model.get_input_embeddings().weight
        embeddings[extended.unk_token_id] = 1.3 * embeddings[extended.convert_tokens_to_ids("▁Ball")]
        embeddings[-1] = 1.3 * embeddings[extended.convert_tokens_to_ids("▁heute")]
    generated = model.generate(**extended(SOURCES[:6], padding=True, return_tensors="pt"))
    assert (generated == extended.unk_token_id).any() and (generated == model.config.vocab_size - 1).any()
    export.to_ctranslate2(model, extended, tmp_path / "ct2")
    blocks = re.findall(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), flags=re.DOTALL)
    (tmp_path / "news.en").write_text("".join(line + "\n" for line in SOURCES[:6]))
    monkeypatch.chdir(tmp_path)
    exec(blocks[0] + blocks[1], {})
    capsys.readouterr()
    assert (tmp_path / "news.de").read_text().splitlines() == translate(model, extended, SOURCES[:6])


def test_ctranslate2_int8_export_is_smaller_translates_and_leaves_the_model_alone(trained, tokenizer, tmp_path):
    model = trained["interleaved", False]
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export.to_ctranslate2(model, tokenizer, tmp_path / "float32")
    export.to_ctranslate2(model, tokenizer, tmp_path / "int8", quantization="int8")
    # CTranslate2 quantises the arrays it is given in place: the exporter hands it copies.
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
    assert (tmp_path / "int8" / "model.bin").stat().st_size < (tmp_path / "float32" / "model.bin").stat().st_size
    assert json.loads((tmp_path / "int8" / "export.json").read_text())["quantization"] == "int8"
    outputs = ct2_translations(tmp_path / "int8", tokenizer)
    assert len(outputs) == len(SOURCES) and all(outputs)


@pytest.mark.parametrize(
    "quantization", ["int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32"]
)
def test_ctranslate2_exports_in_each_weight_type_of_its_converter(tokenizer, tmp_path, quantization):
    """The types of `ct2-transformers-converter --quantization`: each is written, recorded, and translates on CPU
    (CTranslate2 converts a type the CPU lacks when it loads)."""
    export.to_ctranslate2(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ct2", quantization=quantization)
    assert json.loads((tmp_path / "ct2" / "export.json").read_text())["quantization"] == quantization
    assert len(ct2_translations(tmp_path / "ct2", tokenizer, max_decoding_length=4)) == len(SOURCES)


def test_ctranslate2_refuses_an_unknown_quantization_in_one_line_before_writing(tokenizer, tmp_path):
    with pytest.raises(
        ValueError, match=r"^unknown quantization 'int4'; expected float32 \(the default\) or one of \('int8', "
    ) as error:
        export.to_ctranslate2(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ct2", quantization="int4")
    assert "\n" not in str(error.value)
    assert not any(tmp_path.iterdir())


def test_ctranslate2_pads_a_resized_vocabulary_with_placeholders(tokenizer, tmp_path):
    model = tiny_model(len(tokenizer) + 3)
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    vocabulary = json.loads((tmp_path / "ct2" / "shared_vocabulary.json").read_text())
    assert len(vocabulary) == len(tokenizer) + 3 and vocabulary[-1] == f"<unused_{len(tokenizer) + 2}>"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"activation_function": "relu6"}, "activation_function='relu6'"),
        ({"eos_token_id": [2, 3]}, "eos_token_id=[2, 3]"),
        ({"decoder_start_token_id": None}, "decoder_start_token_id=None"),
        ({"eos_token_id": None}, "eos_token_id=None"),
    ],
)
def test_ctranslate2_refuses_what_it_cannot_compute_naming_the_field(tokenizer, tmp_path, override, message):
    model = tiny_model(len(tokenizer), **override)
    refused = f"^cannot export to CTranslate2 exactly: {message.replace('[', '.')}"
    with pytest.raises(ValueError, match=refused):
        export.check_ctranslate2(model)  # the check alone, as a caller runs it before a long export
    with pytest.raises(ValueError, match=refused):
        export.ctranslate2_spec(model, tokenizer)  # the spec alone, as a caller hands it to its own converter
    with pytest.raises(ValueError, match=refused):
        export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists() and not (tmp_path / "ct2.partial").exists()


def test_ctranslate2_refuses_a_tokenizer_whose_ids_leave_a_gap(tmp_path):
    """CTranslate2 maps a token to the id of its position in the vocabulary list: with id 4 unused, "dog" (id 5)
    would read row 4 and every later token the row before its own."""
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, "a": 3, "dog": 5, "runs": 6}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    gapped = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")
    with pytest.raises(ValueError) as error:
        export.to_ctranslate2(tiny_model(8), gapped, tmp_path / "ct2")
    assert (
        str(error.value)
        == "cannot export to CTranslate2: the tokenizer's ids are not 0, 1, ..., 5: no token has id 4."
    )
    assert not any(tmp_path.iterdir())


def test_ctranslate2_without_an_unknown_token_names_one_that_is_not_the_end_of_sentence(tmp_path):
    """CTranslate2's config needs an unknown token; a tokenizer without one gets its first token that is neither
    the end of sentence nor the decoder's start (the padding here), which no translation holds: `disable_unk=True`
    would otherwise forbid </s>, and no translation would end."""
    for vocabulary, eos in ((["<pad>", "</s>"], 1), (["</s>", "<pad>"], 0)):
        tokenizer = word_level_tokenizer(vocabulary, pad_token="<pad>", eos_token="</s>")
        assert tokenizer.unk_token is None
        model = tiny_model(len(tokenizer), eos_token_id=eos, decoder_start_token_id=eos, pad_token_id=1 - eos)
        export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
        config = json.loads((tmp_path / "ct2" / "config.json").read_text())
        assert (config["unk_token"], config["eos_token"]) == ("<pad>", "</s>"), vocabulary


def test_ctranslate2_refusal_of_a_gap_lists_ten_missing_ids_then_an_ellipsis(tmp_path):
    """Ten missing ids are listed whole; from eleven on, the first ten and ", ..." (the list is cut, not complete)."""
    for missing, listed in ((10, "3, 4, 5, 6, 7, 8, 9, 10, 11, 12"), (11, "3, 4, 5, 6, 7, 8, 9, 10, 11, 12, ...")):
        vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2} | {f"w{i}": 3 + missing + i for i in range(missing)}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        gapped = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
        with pytest.raises(ValueError, match=r"^cannot export to CTranslate2: the tokenizer's ids") as error:
            export.to_ctranslate2(tiny_model(3 + 2 * missing), gapped, tmp_path / "ct2")
        assert str(error.value).endswith(f"no token has id {listed}.")


def test_ctranslate2_refuses_in_one_line_to_export_without_a_tokenizer(tokenizer, tmp_path):
    """`export` takes None, as MarianMT and ONNX do; CTranslate2 failed with an AttributeError in its converter."""
    with pytest.raises(ValueError, match="^cannot export to CTranslate2 without a tokenizer: .*pass the model's"):
        export.export(tiny_model(len(tokenizer)), None, tmp_path / "ct2", to="ctranslate2")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["ctranslate2", "marian", "onnx"])
def test_every_export_refuses_a_tokenizer_larger_than_the_vocabulary(tokenizer, tmp_path, target):
    """MarianMT and ONNX wrote such an export, whose runtime then failed on the first id beyond the rows."""
    exporters = {
        "ctranslate2": lambda model: export.to_ctranslate2(model, tokenizer, tmp_path / "out"),
        "marian": lambda model: export.to_marian(model, tokenizer, tmp_path / "out"),
        "onnx": lambda model: export.to_onnx(model, tmp_path / "out", tokenizer=tokenizer),
    }
    with pytest.raises(ValueError, match=rf"vocab_size=40 \(the tokenizer has {len(tokenizer)} tokens"):
        exporters[target](tiny_model(40))
    assert not (tmp_path / "out").exists()


# --- writing the directory ------------------------------------------------------------------------------------


def test_a_failed_export_leaves_the_previous_one_untouched(tokenizer, tmp_path, monkeypatch):
    model = tiny_model(len(tokenizer))
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    before = {path.name: path.read_bytes() for path in (tmp_path / "ct2").iterdir()}

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", fail)  # after model.bin is written
    with pytest.raises(OSError, match="disk full"):
        export.to_ctranslate2(tiny_model(len(tokenizer), seed=1), tokenizer, tmp_path / "ct2")
    assert {path.name: path.read_bytes() for path in (tmp_path / "ct2").iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ct2"]


def test_a_directory_that_is_not_an_export_is_never_replaced(tokenizer, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not an export"):
        export.to_marian(tiny_model(len(tokenizer)), tokenizer, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]


def test_building_directory_appears_whole_under_its_name(tmp_path):
    with export.building_directory(tmp_path / "out") as directory:
        assert directory == tmp_path / "out.partial"
        (directory / "a").write_text("1")
        assert not (tmp_path / "out").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


# --- MarianMT ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_marian_export_round_trips_exactly(trained, tokenizer, tmp_path, layout):
    model = trained[layout, False]
    export.to_marian(model, tokenizer, tmp_path / "marian")
    marian = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    marian_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "marian")
    assert marian_tokenizer(SOURCES)["input_ids"] == tokenizer(SOURCES)["input_ids"]

    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    decoder_input_ids = torch.full((len(SOURCES), 1), EOS)
    with torch.no_grad():
        ours = model(**batch, decoder_input_ids=decoder_input_ids).logits
        theirs = marian(**batch, decoder_input_ids=decoder_input_ids).logits
        marian_outputs = [strip(row) for row in marian.generate(**batch, **SETTINGS).tolist()]
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert marian_outputs == model_translations(model, tokenizer)

    back = from_marian(marian, positional_encoding_layout=layout).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(back[name], tensor), name
    assert all(not back[name].any() for name in back if name.endswith("_proj.bias"))  # the paper has none
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert record["format"] == "marian" and len(record["not_expressed"]) == 4  # GNMT, source + 50, caps, sources


def test_marian_export_carries_generates_decoding_rules_and_lists_fairseqs(tokenizer, tmp_path):
    """The twin took only beam size, length penalty and caps: fairseq decoding's suppressed padding and minimum
    length, a no_repeat_ngram_size, were dropped, and fairseq's limit with them, without a word."""
    model = tiny_model(len(tokenizer))
    set_fairseq_decoding(model.generation_config, pad_token_id=PAD, max_length_b=3)
    model.generation_config.no_repeat_ngram_size = 1
    export.to_marian(model, tokenizer, tmp_path / "marian")
    generation = MarianMTModel.from_pretrained(tmp_path / "marian").generation_config
    assert (generation.suppress_tokens, generation.min_new_tokens, generation.no_repeat_ngram_size) == ([PAD], 1, 1)
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert [line.split(":")[0] for line in record["not_expressed"]] == [
        "max_length_a=0, max_length_b=3",
        "forced_eos_keeps_log_prob=True",
        "beam_finalization='first'",
        "no max_length or max_new_tokens",
        "sources over 64 tokens",
    ]


def test_marian_refuses_positional_encodings_a_little_off_its_sinusoids_naming_the_layout(tokenizer, tmp_path):
    """Marian adds its own sinusoids: a positional module whose table is 1% off them (a formula of its own) would
    be exported as if it added Marian's."""
    model = tiny_model(len(tokenizer))
    for stack in (model.model.encoder, model.model.decoder):
        module = stack.embed_positions
        module.forward = lambda start, length, module=module: 0.99 * module.compute_table(length, start)
    with pytest.raises(ValueError) as error:
        export.to_marian(model, tokenizer, tmp_path / "marian")
    assert str(error.value) == (
        "cannot export to MarianMT exactly: the positional encodings (positional_encoding_layout='interleaved') "
        "differ from Marian's sinusoids, the paper's formula from position 0."
    )
    assert not (tmp_path / "marian").exists()


def test_marian_export_keeps_the_generation_configs_cap_and_lists_fairseqs_limit_of_b_alone(tokenizer, tmp_path):
    """max_new_tokens caps the twin as it caps generate(); max_length_b alone (a at fairseq's default 0) is
    fairseq's limit all the same."""
    model = tiny_model(len(tokenizer))
    generation = model.generation_config
    generation.max_new_tokens, generation.max_length_offset, generation.max_length_b = 12, None, 30
    export.to_marian(model, tokenizer, tmp_path / "marian")
    twin = MarianMTModel.from_pretrained(tmp_path / "marian").generation_config
    assert (twin.max_new_tokens, twin.max_length) == (12, None)
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert [line.split(":")[0] for line in record["not_expressed"]] == [
        "length_penalty_type='gnmt'",
        "max_length_a=None, max_length_b=30",
        "sources over 64 tokens",
    ]


def test_marian_export_keeps_the_generation_configs_max_length(tokenizer, tmp_path):
    model = tiny_model(len(tokenizer))
    model.generation_config.max_length = 30
    export.to_marian(model, tokenizer, tmp_path / "marian")
    twin = MarianMTModel.from_pretrained(tmp_path / "marian").generation_config
    assert (twin.max_length, twin.max_new_tokens) == (30, None)
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert not any(line.startswith("no max_length") for line in record["not_expressed"])


@pytest.mark.parametrize("cap", [{"max_new_tokens": 80}, {"max_length": 81}], ids=lambda value: ",".join(value))
def test_marian_export_cuts_a_cap_beyond_the_positional_table_there_and_lists_it(tokenizer, tmp_path, cap):
    """generate() runs on beyond the table's 64 positions to the cap; the twin, given the cap, failed there with an
    IndexError that named no limit."""
    model = tiny_model(len(tokenizer))  # random: its translations run to the cap
    for name, value in cap.items():
        setattr(model.generation_config, name, value)
    export.to_marian(model, tokenizer, tmp_path / "marian")
    marian = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    with torch.no_grad():
        assert marian.generate(**tokenizer(SOURCES[:1], return_tensors="pt"), num_beams=2).shape[1] == 64
    not_expressed = json.loads((tmp_path / "marian" / "export.json").read_text())["not_expressed"]
    assert [line for line in not_expressed if line.startswith("a limit of")] == [
        "a limit of 80 new tokens (max_length or max_new_tokens): MarianMTModel stops every sentence at "
        "max_length=64 tokens (the positional table: beyond it, it fails with an IndexError), where generate() lets "
        "a translation run on to 80"
    ]


def test_marian_export_does_not_cut_translations_at_transformers_default_length(tokenizer, tmp_path):
    """Without a cap in the generation config (this model's limit is per sentence), the twin's cap is the
    positional table, not transformers' default of 20 tokens: an untrained model, which runs to its limit, shows it."""
    model = tiny_model(len(tokenizer), max_position_embeddings=40)
    export.to_marian(model, tokenizer, tmp_path / "marian")
    marian = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    assert marian.generation_config.max_length == 40
    batch = tokenizer(SOURCES[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert marian.generate(**batch, num_beams=2, min_new_tokens=30).shape[1] > 21
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert any("max_length=40" in line for line in record["not_expressed"])


def test_marian_exports_tokenizer_warns_of_sources_longer_than_the_positional_table(tokenizer, tmp_path):
    """MarianMTModel fails on a source longer than its positional table with "IndexError: index out of range in
    self", naming no limit: the exported tokenizer's model_max_length was this project's 1024 whatever the table,
    so nothing warned of it first (as it does of Marian checkpoints on the Hub), and export.json did not list it."""
    model = tiny_model(len(tokenizer), max_position_embeddings=40)
    export.to_marian(model, tokenizer, tmp_path / "marian")
    assert tokenizer.model_max_length == 1024, "the caller's tokenizer keeps its own"
    exported = AutoTokenizer.from_pretrained(tmp_path / "marian")
    assert exported.model_max_length == 40, "what transformers' tokenizer warns of a longer source by"
    assert len(exported(" ".join(["the dog."] * 20), truncation=True)["input_ids"]) == 40
    record = json.loads((tmp_path / "marian" / "export.json").read_text())
    assert any(line.startswith("sources over 40 tokens: MarianMTModel fails") for line in record["not_expressed"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings=False"),
        ({"eos_token_id": None}, "eos_token_id=None"),  # MarianMTModel.generate() would never end a sentence
        ({"positional_encoding_offset": 2}, "positional_encoding_offset=2"),  # fairseq's positions
        ({"positional_encoding_frequencies": "tensor2tensor"}, "positional_encoding_frequencies='tensor2tensor'"),
    ],
)
def test_marian_refuses_what_it_cannot_compute_naming_the_field(tokenizer, tmp_path, override, message):
    with pytest.raises(ValueError, match=f"^cannot export to MarianMT exactly: {message}"):
        export.to_marian(tiny_model(len(tokenizer), **override), tokenizer, tmp_path / "marian")
    assert not (tmp_path / "marian").exists()


def test_marian_refuses_in_one_line_a_greedy_generation_config_set_by_hand_that_transformers_refuses_to_save(
    tokenizer, tmp_path
):
    """num_beams=1 written into generation_config.json beside the paper's early stopping and length penalty: the
    model loads it with a warning and translates greedily; MarianMTModel.save_pretrained failed on the twin's copy
    with transformers' dozen lines ("GenerationConfig is invalid")."""
    tiny_model(len(tokenizer)).save_pretrained(tmp_path / "model")
    path = tmp_path / "model" / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_beams": 1}))
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "model")
    with pytest.raises(ValueError) as refused:
        export.to_marian(model, tokenizer, tmp_path / "marian")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"cannot export to MarianMT: transformers refuses to save the generation config of {tmp_path / 'model'} ("
    )
    assert "unset `early_stopping`" in message and "unset `length_penalty`" in message
    assert not (tmp_path / "marian").exists()


# --- ONNX -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_export(tokenizer, tmp_path_factory):
    """One export (about 15 s) of a model in training mode, as a training script exports it: (model, directory)."""
    model = tiny_model(len(tokenizer), attention_bias=True, seed=2).train()
    directory = tmp_path_factory.mktemp("onnx") / "onnx"
    assert export.to_onnx(model, directory, tokenizer=tokenizer) == directory
    # The export traces in eval mode with eager attention; the caller's model goes on training as it was.
    assert model.training and model.config._attn_implementation == "sdpa"
    return model.eval(), directory


def onnx_sessions(directory):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return tuple(
        onnxruntime.InferenceSession(str(directory / name), options, providers=["CPUExecutionProvider"])
        for name in ("encoder.onnx", "decoder.onnx")
    )


def test_onnx_logits_match_the_model_on_a_padded_batch(onnx_export, tokenizer):
    model, directory = onnx_export
    encoder, decoder = onnx_sessions(directory)
    pairs = synthetic_pairs(5, seed=11)  # another batch size and other lengths than the export traced
    batch = tokenizer([en for en, _ in pairs], padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()
    targets = tokenizer(text_target=[de for _, de in pairs], padding=True, return_tensors="pt")["input_ids"]
    decoder_input_ids = torch.cat((torch.full((len(pairs), 1), EOS), targets[:, :-1]), dim=1)
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=decoder_input_ids)
    (hidden,) = encoder.run(None, {name: batch[name].numpy() for name in ("input_ids", "attention_mask")})
    (logits,) = decoder.run(
        None,
        {
            "decoder_input_ids": decoder_input_ids.numpy(),
            "encoder_hidden_states": hidden,
            "encoder_attention_mask": batch["attention_mask"].numpy(),
        },
    )
    source_mask = batch["attention_mask"].bool().numpy()
    assert np.abs(hidden - expected.encoder_last_hidden_state.numpy())[source_mask].max() < 1e-4
    target_mask = decoder_input_ids.ne(PAD).numpy()
    assert np.abs(logits - expected.logits.numpy())[target_mask].max() < 1e-4


def test_onnx_decoder_runs_a_first_step_of_one_sentence(onnx_export, tokenizer):
    model, directory = onnx_export
    encoder, decoder = onnx_sessions(directory)
    batch = tokenizer(["the dog."], return_tensors="pt")
    (hidden,) = encoder.run(None, {name: batch[name].numpy() for name in ("input_ids", "attention_mask")})
    start = np.array([[EOS]], dtype=np.int64)
    inputs = {"decoder_input_ids": start, "encoder_hidden_states": hidden}
    (logits,) = decoder.run(None, inputs | {"encoder_attention_mask": batch["attention_mask"].numpy()})
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=torch.from_numpy(start)).logits
    assert logits.shape == (1, 1, len(tokenizer)) and np.abs(logits - expected.numpy()).max() < 1e-4


def test_onnx_directory_holds_config_tokenizer_and_record(onnx_export):
    _, directory = onnx_export
    names = {path.name for path in directory.iterdir()}
    assert {"encoder.onnx", "decoder.onnx", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert not any(name.endswith(".py") for name in names)
    record = json.loads((directory / "export.json").read_text())
    assert record["format"] == "onnx"
    # the opset the graphs were written in, as onnxruntime reads it from them
    graph_opsets = {
        entry.version
        for name in ("encoder.onnx", "decoder.onnx")
        for entry in onnx.load(directory / name).opset_import
        if entry.domain == ""
    }
    assert graph_opsets == {record["opset_version"]}
    # the record says each graph's inputs and outputs as onnxruntime sees them
    for name, session in zip(("encoder.onnx", "decoder.onnx"), onnx_sessions(directory), strict=True):
        inputs, outputs = (
            ", ".join(arg.name for arg in args) for args in (session.get_inputs(), session.get_outputs())
        )
        assert record["graphs"][name] == f"{inputs} -> {outputs}"


def test_the_onnx_export_leaves_the_callers_model_with_its_own_modules(onnx_export, tokenizer):
    """The export traces the stacks with positional modules of its own in place of the model's: left there, a second
    export of the same model wrapped them again and failed on them."""
    model, _ = onnx_export
    never_exported = tiny_model(len(tokenizer), attention_bias=True, seed=2)
    assert [(name, type(module)) for name, module in model.named_modules()] == [
        (name, type(module)) for name, module in never_exported.named_modules()
    ]


def test_onnx_graphs_name_the_dimensions_their_inputs_share(onnx_export):
    """A runtime reads which lengths must agree from the names: the batch everywhere, the source between the
    encoder's inputs and the decoder's encoder inputs, the target apart."""
    model, directory = onnx_export
    encoder, decoder = onnx_sessions(directory)
    shapes = {arg.name: arg.shape for session in (encoder, decoder) for arg in session.get_inputs()}
    assert shapes == {
        "input_ids": ["batch", "source"],
        "attention_mask": ["batch", "source"],
        "decoder_input_ids": ["batch", "target"],
        "encoder_hidden_states": ["batch", "source", model.config.d_model],
        "encoder_attention_mask": ["batch", "source"],
    }


def test_onnx_graphs_take_sources_and_targets_beyond_the_positional_table(onnx_export, tokenizer):
    """As the model computes the positions beyond its table from the formula, so do the graphs: they read the table
    before, and onnxruntime failed on 65 tokens with a broadcast error ("64 by 121") naming no limit."""
    model, directory = onnx_export
    encoder, decoder = onnx_sessions(directory)
    batch = tokenizer([" ".join(["the dog."] * 40)], return_tensors="pt")
    decoder_input_ids = torch.cat((torch.full((1, 1), EOS), batch["input_ids"][:, :-1]), dim=1)
    assert batch["input_ids"].shape[1] > model.config.max_position_embeddings
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=decoder_input_ids)
    (hidden,) = encoder.run(None, {name: batch[name].numpy() for name in ("input_ids", "attention_mask")})
    inputs = {"decoder_input_ids": decoder_input_ids.numpy(), "encoder_hidden_states": hidden}
    (logits,) = decoder.run(None, inputs | {"encoder_attention_mask": batch["attention_mask"].numpy()})
    assert np.abs(hidden - expected.encoder_last_hidden_state.numpy()).max() < 1e-4
    assert np.abs(logits - expected.logits.numpy()).max() < 1e-4


@pytest.mark.parametrize("to", export.FORMATS)
def test_an_int8_model_is_refused_in_one_line_naming_the_float_path(tokenizer, tmp_path, to):
    quantized = quantize_int8(tiny_model(len(tokenizer)))
    with pytest.raises(ValueError, match=r"quantised by quantize_int8 .*export the float model") as error:
        export.export(quantized, tokenizer, tmp_path / "out", to=to)
    assert "\n" not in str(error.value) and not any(tmp_path.iterdir())


def test_onnx_refuses_in_one_line_before_tracing_a_generation_config_set_greedy_that_transformers_refuses(
    tokenizer, tmp_path
):
    """num_beams=1 set on a model beside the paper's early stopping and length penalty: generation_config.json,
    saved after both graphs were traced, failed in transformers' dozen lines ("GenerationConfig is invalid")."""
    model = tiny_model(len(tokenizer))
    model.generation_config.num_beams = 1
    with pytest.raises(ValueError) as refused:
        export.to_onnx(model, tmp_path / "onnx", tokenizer=tokenizer)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"cannot save to {tmp_path / 'onnx'}: GenerationConfig is invalid"
    )
    assert not (tmp_path / "onnx").exists()


def test_onnx_refuses_an_opset_the_exporter_cannot_convert_to_rather_than_record_it_beside_graphs_of_another(
    tokenizer, tmp_path
):
    """opset 16 (an older onnxruntime's): LayerNormalization has no version before 17, and torch kept opset 18 with
    a warning; export.json recorded opset_version=16 beside graphs of opset 18."""
    with pytest.raises(ValueError, match=r"^cannot export to ONNX at opset_version=16: .*encoder\.onnx.*opset 18"):
        export.to_onnx(tiny_model(len(tokenizer)), tmp_path / "onnx", opset_version=16)
    assert not (tmp_path / "onnx").exists()


def test_onnx_export_of_a_bfloat16_model_writes_float32_graphs_that_load(tokenizer, tmp_path):
    model = tiny_model(len(tokenizer), seed=4).to(torch.bfloat16)
    export.to_onnx(model, tmp_path / "onnx", tokenizer=tokenizer)
    assert model.dtype == torch.bfloat16, "the caller's model keeps its dtype"
    encoder, _ = onnx_sessions(tmp_path / "onnx")  # a bfloat16 graph fails here: no CPU kernel for its Mul
    batch = tokenizer(["the dog."], return_tensors="np")
    (hidden,) = encoder.run(None, {name: batch[name] for name in ("input_ids", "attention_mask")})
    with torch.no_grad():
        expected = model.float().model.encoder(**tokenizer(["the dog."], return_tensors="pt")).last_hidden_state
    assert hidden.dtype == np.float32 and np.abs(hidden - expected.numpy()).max() < 1e-4


def test_export_dispatches_by_name_and_refuses_unknown_formats(tokenizer, tmp_path):
    assert export.export(tiny_model(len(tokenizer)), tokenizer, tmp_path / "m", to="marian") == tmp_path / "m"
    with pytest.raises(ValueError, match="unknown export format 'tflite'"):
        export.export(tiny_model(len(tokenizer)), tokenizer, tmp_path / "x", to="tflite")


def test_a_model_loaded_as_remote_code_exports_as_the_package_model_does(trained, tokenizer, tmp_path):
    model = trained["interleaved", False]
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    remote_class = get_class_from_dynamic_module(
        "modeling_transformer.TransformerForConditionalGeneration", str(tmp_path / "saved")
    )
    remote = remote_class.from_pretrained(tmp_path / "saved")  # what trust_remote_code loads without this package
    assert type(remote).__module__.startswith("transformers_modules"), "the checkpoint's own classes"
    for to in ("ctranslate2", "marian"):
        export.export(model, tokenizer, tmp_path / f"package-{to}", to=to)
        export.export(remote, tokenizer, tmp_path / f"remote-{to}", to=to)
    ct2 = [(tmp_path / f"{origin}-ctranslate2" / "model.bin").read_bytes() for origin in ("package", "remote")]
    assert ct2[0] == ct2[1]
    marian = [load_file(tmp_path / f"{origin}-marian" / "model.safetensors") for origin in ("package", "remote")]
    assert marian[0].keys() == marian[1].keys()
    assert all(torch.equal(marian[0][name], marian[1][name]) for name in marian[0])


def test_a_bfloat16_model_loaded_as_remote_code_exports_to_marian_in_bfloat16_as_the_package_model_does(
    tokenizer, tmp_path
):
    model = tiny_model(len(tokenizer)).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "saved")
    remote_class = get_class_from_dynamic_module(
        "modeling_transformer.TransformerForConditionalGeneration", str(tmp_path / "saved")
    )
    remote = remote_class.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    for origin, source in (("package", model), ("remote", remote)):
        export.to_marian(source, tokenizer, tmp_path / origin)
    package, exported = (load_file(tmp_path / origin / "model.safetensors") for origin in ("package", "remote"))
    assert {tensor.dtype for tensor in exported.values()} == {torch.bfloat16}
    assert all(torch.equal(exported[name], package[name]) for name in package)


def test_an_untied_model_of_older_remote_code_exports_without_its_unused_shared_matrix(tokenizer, tmp_path):
    """Untied models saved before `shared` was left out of them carry code that builds it, trained by nothing."""
    model = tiny_model(len(tokenizer), tie_word_embeddings=False)
    model.save_pretrained(tmp_path / "saved")
    code = tmp_path / "saved" / "modeling_transformer.py"
    embedding = "nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)"
    indent = "\n" + " " * 12
    without = f"self.shared = ({indent}{embedding}{indent}if config.tie_word_embeddings{indent}else None\n        )"
    older = f"self.shared = {embedding}"
    assert without in code.read_text()
    code.write_text(code.read_text().replace(without, older))
    remote_class = get_class_from_dynamic_module(
        "modeling_transformer.TransformerForConditionalGeneration", str(tmp_path / "saved")
    )
    remote = remote_class.from_pretrained(tmp_path / "saved")
    assert "model.shared.weight" in remote.state_dict()
    export.export(model, tokenizer, tmp_path / "package", to="ctranslate2")
    export.export(remote, tokenizer, tmp_path / "remote", to="ctranslate2")
    assert (tmp_path / "package" / "model.bin").read_bytes() == (tmp_path / "remote" / "model.bin").read_bytes()


def test_remote_code_whose_modules_differ_from_this_packages_is_refused_in_one_line(tokenizer, tmp_path):
    """Its weights do not load into this package's classes: exported, the twin would hold its random weights."""
    tiny_model(len(tokenizer)).save_pretrained(tmp_path / "saved")
    code = tmp_path / "saved" / "modeling_transformer.py"
    code.write_text(code.read_text().replace("fc1", "inner"))  # code of another release, a module renamed
    remote_class = get_class_from_dynamic_module(
        "modeling_transformer.TransformerForConditionalGeneration", str(tmp_path / "saved")
    )
    remote = remote_class.from_pretrained(tmp_path / "saved")
    with pytest.raises(TypeError) as error:
        export.export(remote, tokenizer, tmp_path / "out", to="ctranslate2")
    message = str(error.value)
    assert "(remote code) does not hold this package's modules (Missing key(s) in state_dict: " in message
    assert message.endswith("load the checkpoint with `import modeling` instead of trust_remote_code.")
    assert "ffn.fc1.weight" in message and "\n" not in message and not (tmp_path / "out").exists()


def test_marian_export_without_a_tokenizer_writes_the_model_alone(tokenizer, tmp_path):
    assert export.to_marian(tiny_model(len(tokenizer)), None, tmp_path / "marian") == tmp_path / "marian"
    assert sorted(path.name for path in (tmp_path / "marian").iterdir()) == [
        "config.json",
        "export.json",
        "generation_config.json",
        "model.safetensors",
    ]


def test_an_export_of_a_model_built_in_memory_records_no_source(tokenizer, tmp_path):
    """export.json's source is the directory the model was loaded from; a model never saved has none: null."""
    export.to_marian(tiny_model(len(tokenizer)), None, tmp_path / "marian")
    assert json.loads((tmp_path / "marian" / "export.json").read_text())["source"] is None


def test_another_model_is_refused_naming_its_class(tokenizer, tmp_path):
    marian = to_marian(tiny_model(len(tokenizer)))
    with pytest.raises(
        TypeError, match=r"expected this project's TransformerForConditionalGeneration, got .*MarianMT"
    ):
        export.export(marian, tokenizer, tmp_path / "out", to="ctranslate2")
    bare = TransformerModel(tiny_model(len(tokenizer)).config)  # what AutoModel loads: of this model_type, no head
    with pytest.raises(TypeError, match=r"got modeling\.modeling_transformer\.TransformerModel\.$"):
        export.export(bare, tokenizer, tmp_path / "out", to="ctranslate2")
    # Another project's class of the same name, of another model_type: refused as such, not rebuilt as ours.
    namesake = type("TransformerForConditionalGeneration", (MarianMTModel,), {})(marian.config)
    with pytest.raises(TypeError, match=r"got test_export\.TransformerForConditionalGeneration\.$"):
        export.export(namesake, tokenizer, tmp_path / "out", to="ctranslate2")
