"""Tests of modeling/model_card.py: the card holds measured numbers only, its model-index validates, the curves
plot."""

import ast
import errno
import json
import os
import re
import shutil
import signal
from unittest import mock

import pytest
import torch
from helpers import (
    LOG_HISTORY,
    convert_fairseq_fixture_into,
    tiny_config,
    tiny_model,
    tiny_tokenizer,
)
from hub_server import card_metadata_errors
from huggingface_hub import ModelCard
from transformers import GenerationConfig

from modeling import export, generation_transformer, model_card
from modeling.arguments import TranslationTrainingArguments
from modeling.checkpoints import weights_record
from modeling.files import DiskFullError, write_json
from modeling.model_card import (
    check_eval_result,
    collect_card_inputs,
    count_parameters,
    plot_training_curves,
    render_model_card,
    training_summary,
)
from modeling.scoring import corpus_scores
from modeling.translation import translate

REPO_ID = "tester/tiny-transformer"


def test_card_metadata_has_the_bleu_results_in_model_index(eval_result):
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result])
    data = ModelCard(str(card)).data  # parse back what would be README.md
    assert data.model_name == "tiny"
    assert data.language == ["en", "de"] and data.pipeline_tag == "translation"
    assert data.library_name == "transformers" and data.license == "apache-2.0"
    assert data.metrics == ["bleu", "chrf"], "the metrics the Hub lists the model under"
    by_name = {result.metric_name: result for result in data.eval_results}
    sacrebleu = by_name["sacreBLEU"]
    assert sacrebleu.metric_type == "bleu" and sacrebleu.task_type == "translation"
    assert sacrebleu.metric_value == round(eval_result["sacrebleu"], 2)
    assert sacrebleu.metric_config == eval_result["sacrebleu_signature"]
    assert sacrebleu.dataset_type == "synthetic" and sacrebleu.dataset_split == "test"
    paper = by_name["BLEU (tokenised as in the paper)"]
    assert paper.metric_value == round(eval_result["paper_bleu"], 2)
    assert by_name["BLEU (tokenised, lowercased)"].metric_value == round(eval_result["tokenized_bleu_lc"], 2)
    assert by_name["chrF"].metric_type == "chrf"
    assert [(result.metric_name, result.metric_type) for result in data.eval_results] == [
        ("sacreBLEU", "bleu"),
        ("BLEU (tokenised as in the paper)", "bleu"),
        ("BLEU (tokenised, lowercased)", "bleu"),
        ("chrF", "chrf"),
    ], "each BLEU is a bleu to the Hub's leaderboards"
    assert {result.task_name for result in data.eval_results} == {"Translation"}
    assert data.tags == ["translation", "transformer", "vaswani-transformer", "custom_code"], "custom_code: the Hub"
    assert f"{eval_result['sacrebleu']:.2f}" in card.text
    assert "@inproceedings{vaswani2017attention" in card.text
    assert f'from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text


def test_a_card_of_a_chinese_evaluation_gives_the_scores_sacrebleu_computed_and_says_why_the_others_are_not():
    references = ["女人吃红球。", "男人喜欢水。", "小狗看见一个红球，很高兴。"]
    hypotheses = ["女人吃红球。", "男人喜欢吃水。", "小狗看见红球，很高兴。"]
    scores = corpus_scores(hypotheses, references, "zh")
    result = {"split": "test", "dataset": "synthetic", "source_lang": "en", "target_lang": "zh", **scores}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[result])
    assert card_metadata_errors(str(card)) == []
    data = ModelCard(str(card)).data
    assert data.language == ["en", "zh"]
    assert [(r.metric_name, r.metric_config) for r in data.eval_results] == [
        ("sacreBLEU", scores["sacrebleu_signature"]),
        ("chrF", scores["chrf_signature"]),
    ]
    assert "|tok:zh|" in scores["sacrebleu_signature"] and "`13a`" not in card.text
    refused = "| not measured | `not computed: Moses tokenisation finds no words in zh (no spaces between words)` |"
    assert f"| BLEU (tokenised as in the paper) {refused}" in card.text


def test_a_score_on_part_of_the_split_or_of_the_int8_model_is_labelled_and_kept_out_of_model_index(eval_result):
    """`evaluate.py --limit 100` or `--int8` (quick checks) gave results the card showed as the model's own scores
    on the whole split, in the text and in the `model-index` the Hub lists."""
    whole = {**eval_result, "num_sentences": 10, "limit": None, "sentences_in_split": 10, "int8": False}
    limited = {**whole, "split": "validation", "num_sentences": 4, "limit": 4, "sacrebleu": 91.25}
    quantised = {**whole, "split": "dev", "int8": True, "sacrebleu": 92.5}
    limit_beyond_the_split = {**whole, "split": "newstest", "limit": 50}  # all 10 sentences scored
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, eval_results=[whole, limited, quantised, limit_beyond_the_split]
    )
    splits = {result.dataset_split for result in ModelCard(str(card)).data.eval_results}
    assert splits == {"test", "newstest"}
    assert card_metadata_errors(str(card)) == []
    paragraphs = {p.split("split `")[1].split("`")[0]: p for p in card.text.split("\n\n") if "split `" in p}
    assert "Scored on the first 4 of 10 sentences only (`--limit`): not this model's score" in paragraphs["validation"]
    assert "Scored on the model quantised to int8 (`--int8`)" in paragraphs["dev"]
    assert "Scored on" not in paragraphs["test"] + paragraphs["newstest"]
    older = {key: value for key, value in limited.items() if key != "sentences_in_split"}  # written before the field
    assert render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[older]).data.eval_results is None
    older_whole = {**older, "sentences_in_split": None, "limit": 50}  # fewer than the limit: the whole split
    listed = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[older_whole]).data.eval_results
    assert {result.dataset_split for result in listed} == {"validation"}


PAPER_GENERATION_CONFIG = {
    "num_beams": 4,
    "length_penalty": 0.6,
    "early_stopping": True,
    "length_penalty_type": "gnmt",
}
PAPER_GENERATION_CONFIG |= {"max_length_offset": 50, "decoder_start_token_id": 2, "transformers_version": "5.25.0"}


def test_a_score_of_other_decoding_than_the_models_is_labelled_and_kept_out_of_model_index(eval_result):
    """`evaluate.py --num-beams 1` beside the beam-4 evaluation of the same split: both went into model-index as the
    model's scores on the split, under the same name and signature, one of them not what generate() does."""
    decoding = {"num_beams": 4, "length_penalty": 0.6, "early_stopping": True, "length_penalty_type": "gnmt"}
    decoding |= {"max_length_offset": 50, "max_new_tokens": None, "suppress_tokens": None}
    beam = {**eval_result, **decoding}
    greedy = {**beam, "split": "greedy", "num_beams": 1, "sacrebleu": 91.25}
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, eval_results=[beam, greedy], generation_config=PAPER_GENERATION_CONFIG
    )
    assert {result.dataset_split for result in card.data.eval_results} == {"test"}
    assert card_metadata_errors(str(card)) == []
    paragraphs = {p.split("split `")[1].split("`")[0]: p for p in card.text.split("\n\n") if "split `" in p}
    assert (
        "Scored on other decoding than its generation_config.json's (num_beams 1), not what `generate()` does"
        in (paragraphs["greedy"])
    )
    assert "Scored on" not in paragraphs["test"]
    assert "beam 4, GNMT length penalty 0.6." in paragraphs["test"], "the penalty's form: GNMT or score / length^α"
    fairseq = render_model_card(
        model_name="tiny", repo_id=REPO_ID, eval_results=[{**beam, "length_penalty_type": "transformers"}]
    )
    assert "beam 4, length penalty 0.6 (score / length^α)." in fairseq.text
    # the generation config changed after the evaluation: the beam-4 score is no longer what the model does
    edited = render_model_card(
        model_name="tiny",
        repo_id=REPO_ID,
        eval_results=[beam],
        generation_config={**PAPER_GENERATION_CONFIG, "num_beams": 5},
    )
    assert edited.data.eval_results is None and "(num_beams 4)" in edited.text
    # a generation config that leaves num_beams out: generate()'s default, greedy, is what --num-beams 1 asked for
    greedy_model = {key: value for key, value in PAPER_GENERATION_CONFIG.items() if key != "num_beams"}
    listed = render_model_card(
        model_name="tiny", repo_id=REPO_ID, eval_results=[greedy], generation_config=greedy_model
    )
    assert {result.dataset_split for result in listed.data.eval_results} == {"greedy"}
    # ... and a beam-4 score of that model is not what its generate() does (unset was not compared at all)
    unset = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[beam], generation_config=greedy_model)
    assert unset.data.eval_results is None and "(num_beams 4)" in unset.text
    # without generation_config.json, generate() decodes as the paper: the greedy score is not the model's
    no_file = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[beam, greedy])
    assert {result.dataset_split for result in no_file.data.eval_results} == {"test"}


def test_the_card_describes_the_decoding_its_generation_config_holds():
    """The usage example said "the paper's decoding: beam 4, GNMT length penalty 0.6, max length source + 50" of
    every model, typed in the template: a MarianMT conversion decodes with MarianMT's beam, penalty and max_length."""
    paper = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=PAPER_GENERATION_CONFIG)
    expected = (
        "# generation_config.json holds the paper's decoding: beam 4, GNMT length penalty 0.6, max length source + 50."
    )
    assert expected in paper.text
    assert expected in render_model_card(model_name="tiny", repo_id=REPO_ID).text, "no file: generate() applies it"
    marian = {**PAPER_GENERATION_CONFIG, "num_beams": 6, "length_penalty": 1.0, "max_length": 512}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=marian)
    assert "the paper's decoding" not in card.text
    assert (
        "# generation_config.json holds its decoding: beam 6, GNMT length penalty 1.0, max length source + 50, at "
        "most 512 tokens in all."
    ) in card.text
    for limits, said in (
        ({"max_length_b": 200}, "max length 0 · source width + 200"),
        ({"max_length_a": 2}, "max length 2 · source width + 0"),
    ):
        limited = {**PAPER_GENERATION_CONFIG, "max_length_offset": None, **limits}  # the other one unset
        card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=limited)
        assert f"holds its decoding: beam 4, GNMT length penalty 0.6, {said}." in card.text
    # generate() takes transformers' length penalty where the file sets none: the card says which
    unset = {key: value for key, value in PAPER_GENERATION_CONFIG.items() if key != "length_penalty"}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=unset)
    default = generation_transformer.unset_decoding_defaults()["length_penalty"]
    assert f"holds its decoding: beam 4, GNMT length penalty {default}, max length source + 50." in card.text
    greedy = {key: value for key, value in PAPER_GENERATION_CONFIG.items() if key != "num_beams"}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=greedy)
    assert "holds its decoding: beam 1, GNMT length penalty 0.6," in card.text, "generate()'s default: greedy"
    # a cap on every translation, which the paper's decoding does not have, whether in all or new tokens
    for cap, said in (
        ({"max_length": 200}, "at most 200 tokens in all"),
        ({"max_new_tokens": 16}, "at most 16 new tokens"),
    ):
        card = render_model_card(
            model_name="tiny", repo_id=REPO_ID, generation_config={**PAPER_GENERATION_CONFIG, **cap}
        )
        assert "the paper's decoding" not in card.text
        assert f"holds its decoding: beam 4, GNMT length penalty 0.6, max length source + 50, {said}." in card.text
    plain = {**PAPER_GENERATION_CONFIG, "length_penalty_type": "transformers", "max_length_offset": None}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=plain)
    assert "beam search with the GNMT length penalty" not in card.text
    assert "# generation_config.json holds its decoding: beam 4, score / length^α length penalty 0.6." in card.text


def test_a_generation_config_without_the_penalty_form_is_described_as_the_form_generate_applies():
    """A generation_config.json that leaves `length_penalty_type` out (older, or written by hand) was described as
    "GNMT length penalty 0.6", while generate() then ranks by score / length^α, the library's form."""
    unset = {key: value for key, value in PAPER_GENERATION_CONFIG.items() if key != "length_penalty_type"}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, generation_config=unset)
    assert "GNMT" not in card.text.split("## Deploy")[0] and "beam search with the" not in card.text
    expected = "# generation_config.json holds its decoding: beam 4, score / length^α length penalty 0.6, max length"
    assert expected in card.text
    model, tokenizer = tiny_model(96), tiny_tokenizer()
    model.generation_config = GenerationConfig(**{k: v for k, v in unset.items() if k != "transformers_version"})
    sources = tokenizer(["a b c d", "a"], return_tensors="pt", padding=True)
    with mock.patch.object(generation_transformer, "GNMTLengthPenalty", side_effect=AssertionError("GNMT")):
        model.generate(**sources)  # the library's form: the GNMT penalty is never built


def test_an_evaluation_json_whose_int8_flag_is_not_a_boolean_is_refused(eval_result, tmp_path):
    """`"int8": "false"` decides whether a score reaches the Hub's model-index, so it is checked as a boolean."""
    path = tmp_path / "eval_results_test.json"
    assert check_eval_result(path, {**eval_result, "int8": False}) is not None
    with pytest.raises(ValueError, match=r"eval_results_test\.json: 'int8' is 'false', not a boolean\.$"):
        check_eval_result(path, {**eval_result, "int8": "false"})


def test_the_test_hub_validates_model_index_like_the_hub(eval_result):
    card = str(render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result]))
    assert card_metadata_errors(card) == []
    broken = card.replace("value: ", "value: about ", 1)  # the first metric value becomes a string
    assert card_metadata_errors(broken) == ['"model-index[].results[].metrics[]" needs a "type" and a numeric "value"']


def test_the_architecture_table_shows_the_decoders_heads_and_d_ff_beside_the_encoders():
    config = tiny_config(encoder_attention_heads=2, decoder_attention_heads=8, encoder_ffn_dim=48, decoder_ffn_dim=96)
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, model_config=config.to_dict())
    for row in ("h (encoder attention heads) | 2 |", "h (decoder attention heads) | 8 |", "d_ff (decoder) | 96 |"):
        assert row in card.text


def test_the_architecture_table_has_a_row_for_each_setting_of_the_config():
    """Each setting in the paper's name, its value the config's: a row missing is a model the reader cannot tell
    from the paper's."""
    config = tiny_config(encoder_layers=2, decoder_layers=3, dropout=0.2, attention_dropout=0.05)
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, model_config=config.to_dict())
    table = card.text.split("| d_model |", 1)[1].split("| parameters |", 1)[0]
    rows = [line.strip("| ").split(" | ") for line in table.strip().splitlines()[1:]]
    assert rows == [
        ["N (encoder layers)", "2"],
        ["N (decoder layers)", "3"],
        ["h (encoder attention heads)", str(config.encoder_attention_heads)],
        ["h (decoder attention heads)", str(config.decoder_attention_heads)],
        ["d_ff (encoder)", str(config.encoder_ffn_dim)],
        ["d_ff (decoder)", str(config.decoder_ffn_dim)],
        ["feed-forward activation", "relu"],
        ["P_drop", "0.2"],
        ["dropout on attention weights", "0.05"],
        ["dropout after the activation", str(config.activation_dropout)],
        ["shared vocabulary", str(config.vocab_size)],
        ["positional encoding layout", str(config.positional_encoding_layout)],
        ["positional encoding frequencies", str(config.positional_encoding_frequencies)],
        ["position of the first token", str(config.positional_encoding_offset)],
        ["embeddings scaled by sqrt(d_model)", str(config.scale_embedding)],
        ["biases on the attention projections", str(config.attention_bias)],
        ["layer norm epsilon", str(config.layer_norm_eps)],
        ["tied embeddings / pre-softmax projection", str(config.tie_word_embeddings)],
    ]
    assert f"| d_model | {config.d_model} |" in card.text


def test_a_model_that_differs_from_the_paper_in_its_activation_or_tying_says_so():
    """A Marian conversion (swish) or a gelu or untied model read as the paper's ReLU model with tied embeddings:
    the table omitted the activation, and the text said "tied" whatever the config."""
    paper = render_model_card(model_name="tiny", repo_id=REPO_ID, model_config=tiny_config().to_dict()).text
    assert "| feed-forward activation | relu |" in paper and "tied embeddings and pre-softmax projection" in paper
    assert "feed-forward activation (the paper" not in paper
    config = tiny_config(activation_function="gelu", tie_word_embeddings=False, scale_embedding=False)
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, model_config=config.to_dict()).text
    for said in (
        "separate (untied) embeddings and pre-softmax projection, a gelu feed-forward activation (the paper's is",
        "| feed-forward activation | gelu |",
        "| embeddings scaled by sqrt(d_model) | False |",
        "| tied embeddings / pre-softmax projection | False |",
    ):
        assert said in card


def test_card_without_measurements_says_so_and_invents_nothing():
    card = render_model_card(model_name="tiny", repo_id=REPO_ID)
    assert "model-index" not in str(card)
    assert card.data.eval_results is None
    assert "language:" not in str(card), "no languages known: none listed, not an empty list"
    for sentence in ("Not measured", "Hyperparameters: not recorded", "Data statistics: not recorded"):
        assert sentence in card.text
    assert "Training curves: not recorded" in card.text
    assert "tied embeddings and pre-softmax projection" in card.text, "without config.json: the paper's model"
    assert "feed-forward activation (the paper's" not in card.text, "without config.json: the paper's ReLU"


def test_the_card_ends_with_a_newline_as_a_text_file_does():
    """The template's last newline is kept: README.md without one shows as "No newline at end of file" in a diff."""
    assert str(render_model_card(model_name="tiny", repo_id=REPO_ID)).endswith("\n")


def test_training_curves_and_collected_inputs(card_dir, tmp_path):
    inputs = collect_card_inputs([card_dir])
    assert inputs["log_history"] == LOG_HISTORY and len(inputs["eval_results"]) == 1
    png = plot_training_curves(inputs["log_history"], tmp_path / "curves.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="no train loss"):
        plot_training_curves([{"learning_rate": 1.0, "step": 1}], tmp_path / "empty.png")


def test_the_curves_plot_each_logged_series_against_the_step_in_labelled_panels(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure) or savefig(figure, *args, **kwargs)
    )
    plot_training_curves(LOG_HISTORY, tmp_path / "curves.png")
    (figure,) = drawn
    panels = {
        axes.get_title(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axes.lines}
        for axes in figure.axes
    }
    assert panels == {
        "Loss": {"train": ([10, 20], [5.1, 4.2]), "eval": ([20], [4.6])},
        "BLEU": {"sacrebleu": ([20], [1.5])},
    }
    legends = [[text.get_text() for text in axes.get_legend().get_texts()] for axes in figure.axes]
    assert legends == [["train", "eval"], ["sacrebleu"]], "each curve named in its panel"


def test_a_converted_fairseq_model_gets_its_own_card(converted_fairseq_dir, tmp_path, eval_result):
    """write_model_card finds fairseq_conversion.json in the model directory: the card says where the weights come
    from, how it decodes, what fairseq reports for its published checkpoints; its metadata still validate."""
    import shutil

    from modeling.fairseq import CONVERSION_FILE as WRITTEN
    from modeling.model_card import CONVERSION_FILE, write_model_card

    assert WRITTEN == CONVERSION_FILE
    model_dir = tmp_path / "model"
    shutil.copytree(converted_fairseq_dir, model_dir)
    (tmp_path / "eval").mkdir()
    write_json(tmp_path / "eval" / "eval_results_test.json", {**eval_result, "num_beams": 4, "length_penalty": 0.6})
    card = write_model_card(model_dir, repo_id=REPO_ID, card_from=[tmp_path / "eval"]).read_text()
    assert card_metadata_errors(card) == []
    assert "## Converted from fairseq" in card and "`transformer_wmt_en_de`" in card
    assert "\nlicense: mit\n" in card, "fairseq published its weights under MIT"
    assert "beam 4, length penalty\n0.6 as score / length^α" in card and "sacremoses" in card
    assert (
        "- `transformer.wmt16.en-de` (`wmt16.en-de.joined-dict.transformer.tar.bz2`, en-de): 29.3 tokenised BLEU with "
        "compound splitting, 28.6 sacreBLEU" in card
    )
    assert (
        "- `transformer.wmt14.en-fr` (`wmt14.en-fr.joined-dict.transformer.tar.bz2`, en-fr): 43.2 tokenised BLEU, "
        "41.4 sacreBLEU" in card
    )
    assert "GNMT length penalty 0.6, max length source + 50" not in card and "- fairseq" in card
    assert "| positional encoding frequencies | tensor2tensor |" in card
    assert f"| parameters | {count_parameters(model_dir):,} |" in card, "counted from the model's safetensors"
    paper = str(render_model_card(model_name="tiny", repo_id=REPO_ID))
    assert "fairseq" not in paper and "GNMT length penalty 0.6, max length source + 50" in paper


def test_a_converted_models_card_without_evaluations_has_the_conversions_languages(converted_fairseq_dir, tmp_path):
    """Converted and not yet evaluated: no data_stats.json and no evaluation names the languages; the conversion's
    record does, for the card's language tags and its usage example."""
    model_dir = tmp_path / "model"
    shutil.copytree(converted_fairseq_dir, model_dir)
    card = ModelCard(model_card.write_model_card(model_dir, repo_id=REPO_ID).read_text())
    assert card.data.language == ["en", "de"]
    assert "The small dog sees a red ball." in card.text, "the example in the source language"


def test_a_converted_model_whose_generation_config_was_edited_says_what_it_holds_now(converted_fairseq_dir, tmp_path):
    """The conversion's record said "generation_config.json holds what fairseq-interactive --beam 4 does: beam 4" of
    a model whose generation config now says beam 5, beside a beam-4 score labelled "other decoding than its
    generation_config.json's"."""
    import shutil

    from modeling.model_card import write_model_card

    model_dir = tmp_path / "model"
    shutil.copytree(converted_fairseq_dir, model_dir)
    unchanged = write_model_card(model_dir, repo_id=REPO_ID).read_text()
    assert "`generation_config.json` holds what" in unchanged
    assert "# generation_config.json holds fairseq's decoding" in unchanged and "edited since" not in unchanged
    generation_config = json.loads((model_dir / "generation_config.json").read_text())
    write_json(model_dir / "generation_config.json", {**generation_config, "num_beams": 5})
    card = write_model_card(model_dir, repo_id=REPO_ID).read_text()
    assert "`generation_config.json` holds what" not in card
    assert "The conversion wrote into\n`generation_config.json` what `fairseq-interactive" in card
    assert "kept; it was edited since, and holds: beam 5, score / length^α length penalty 0.6," in card
    assert "# generation_config.json holds its decoding: beam 5, score / length^α length penalty 0.6" in card


def kill_a_card_render(model_dir, card_dir) -> None:
    """Render the card of `model_dir` in a child process that is killed (SIGKILL) once the figure is drawn."""
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest runs here; it leaves by SIGKILL or os._exit
        try:
            model_card._render_card_of = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
            model_card.write_model_card(model_dir, repo_id=REPO_ID, card_from=[card_dir])
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_card_render_killed_midway_leaves_nothing_that_a_new_conversion_refuses(
    converted_fairseq_dir, card_dir, tmp_path
):
    """push_to_hub.py killed while it rendered the card left the figure's staging directory in the model's, under a
    new name at every kill (tmpXXXXXXXX): converting again into that directory was refused, after the whole
    conversion, for holding it."""
    model_dir = shutil.copytree(converted_fairseq_dir, tmp_path / "model")
    converted = sorted(path.name for path in model_dir.iterdir())
    kill_a_card_render(model_dir, card_dir)
    model_card.write_model_card(model_dir, repo_id=REPO_ID, card_from=[card_dir])  # a new render clears it away
    assert sorted(path.name for path in model_dir.iterdir()) == sorted(
        [*converted, "README.md", "training_curves.png"]
    )
    kill_a_card_render(model_dir, card_dir)  # and a kill that no render follows
    convert_fairseq_fixture_into(model_dir)
    assert sorted(path.name for path in model_dir.iterdir()) == converted


def test_a_card_the_disk_cannot_hold_keeps_the_earlier_card_and_its_curves(
    converted_fairseq_dir, card_dir, tmp_path, monkeypatch
):
    """The new curves were moved in before the card was written: a full disk then kept the earlier card beside the
    new curves, which push_to_hub.py without --card-from uploaded together."""
    model_dir = shutil.copytree(converted_fairseq_dir, tmp_path / "model")
    model_card.write_model_card(model_dir, repo_id=REPO_ID, card_from=[card_dir])
    before = {name: (model_dir / name).read_bytes() for name in ("README.md", "training_curves.png")}
    longer = shutil.copytree(card_dir, tmp_path / "longer")
    write_json(
        longer / "trainer_state.json", {"global_step": 30, "log_history": [*LOG_HISTORY, {"step": 30, "loss": 1}]}
    )
    fsync = os.fsync

    def full_for_the_card(fd):
        if ".README.md.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_the_card)
    with pytest.raises(DiskFullError, match=f"^No space left on device while writing {model_dir / 'README.md'}"):
        model_card.write_model_card(model_dir, repo_id=REPO_ID, card_from=[longer])
    assert {name: (model_dir / name).read_bytes() for name in before} == before


def test_a_fine_tuned_models_card_names_its_base_model_as_training_recorded_it():
    from_hub = {"model_name_or_path": "vaswani/tiny-en-de", "base_model": "vaswani/tiny-en-de"}
    fine_tuned = render_model_card(model_name="tiny", repo_id=REPO_ID, training_args=from_hub)
    assert fine_tuned.data.base_model == "vaswani/tiny-en-de" and card_metadata_errors(str(fine_tuned)) == []
    local = {"model_name_or_path": "runs/base", "base_model": None}  # a directory: no model tree link
    assert render_model_card(model_name="tiny", repo_id=REPO_ID, training_args=local).data.base_model is None


def test_the_training_loss_is_the_whole_runs_after_a_resume():
    # Updates 1-8 in a first launch (to its max_steps), checkpoint-8; the resumed launch made 9-12 and logged its own
    # train_loss and runtime.
    resumed = [
        {"loss": 4.0, "epoch": 0.2, "step": 4},
        {"loss": 3.0, "epoch": 0.4, "step": 8},
        {"train_runtime": 9.0, "train_loss": 3.5, "epoch": 0.4, "step": 8},
        {"loss": 2.0, "epoch": 0.6, "step": 12},
        {"train_runtime": 5.0, "train_loss": 2.0, "epoch": 0.6, "step": 12},
    ]
    assert training_summary(resumed) == {
        "steps": 12,
        "epochs": 0.6,
        "mean_train_loss": 3.0,
        "last_launch_runtime_s": 5.0,
    }
    card = str(render_model_card(model_name="tiny", repo_id=REPO_ID, log_history=resumed))
    assert "- mean_train_loss: 3.0" in card and "train_loss: 2.0" not in card


def test_an_evaluation_logged_between_training_losses_does_not_count_as_one():
    """eval_steps that are not a multiple of logging_steps: an evaluation at update 6, between the losses of 4 and
    8."""
    log_history = [
        {"loss": 4.0, "step": 4},
        {"eval_loss": 3.5, "eval_sacrebleu": 1.0, "step": 6},
        {"loss": 2.0, "step": 8},
    ]
    assert training_summary(log_history) == {"steps": 8, "mean_train_loss": 3.0}


def test_a_log_history_whose_entries_name_no_step_gives_the_training_length_it_holds():
    """`check_log_history` takes entries without a step (a trainer_state.json written by hand or another tool): the
    card shows what they hold instead of failing on the missing step count."""
    log_history = [{"loss": 4.0, "epoch": 0.5}, {"loss": 3.0, "epoch": 1.0}]
    summary = training_summary(log_history)
    assert summary["epochs"] == 1.0 and "steps" not in summary
    card = str(render_model_card(model_name="tiny", repo_id=REPO_ID, log_history=log_history))
    assert "- epochs: 1.0" in card and "- steps:" not in card


def test_the_parameter_count_is_the_loaded_models_even_beside_a_sharded_save_over_it(tmp_path):
    """A sharded save leaves the earlier model.safetensors in place: both were counted, twice the parameters."""
    model = tiny_model(50)
    model.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 2, "shards beside the single file"
    assert count_parameters(tmp_path) == model.num_parameters()


def test_the_training_loss_after_a_resume_weighs_each_log_by_the_updates_it_covers():
    # Logs every 4 updates; killed after update 6, resumed from checkpoint-6: the log at 8 covers updates 7-8 only.
    resumed = [
        {"loss": 4.0, "step": 4, "updates_logged": 4},
        {"loss": 1.0, "step": 8, "updates_logged": 2},
        {"loss": 3.0, "step": 12, "updates_logged": 4},
    ]
    assert training_summary(resumed)["mean_train_loss"] == pytest.approx((4 * 4.0 + 2 * 1.0 + 4 * 3.0) / 10)


def test_a_card_shows_local_paths_by_their_last_component_only(eval_result):
    """A card is public: the directories of the writer's machine stay off it."""
    local = {**eval_result, "dataset": "/home/alice/corpora/multi30k"}
    card = str(
        render_model_card(
            model_name="tiny",
            repo_id=REPO_ID,
            eval_results=[local],
            training_args={"model_name_or_path": "/home/alice/runs/base/averaged", "learning_rate": 1.0},
            data_stats={"dataset": "/home/alice/corpora/multi30k", "vocab_size": 64, "bpe": "~/corpora/bpe.codes"},
        )
    )
    assert "/home/alice" not in card and "~/" not in card and card_metadata_errors(card) == []
    assert "| bpe | bpe.codes |" in card, "a path from the home directory, by its last component"
    assert "| model_name_or_path | averaged |" in card and "| dataset | multi30k |" in card
    assert "**multi30k" in card, "the evaluation's dataset, named"


@pytest.mark.parametrize(
    ("data_dir", "cwd"),
    [
        ("../corpora/multi30k", "runs"),
        ("./corpora/multi30k", "."),
        ("corpora/multi30k", "."),
        (".", "corpora/multi30k"),  # `--data_dir .` in the corpus' directory: the card named it "."
        ("..", "corpora/multi30k/bpe"),
    ],
)
def test_a_relative_data_directory_is_named_by_its_last_component_and_kept_out_of_the_datasets_metadata(
    data_dir, cwd, tmp_path, monkeypatch
):
    """README's own main job trains from `../shared/data/multi30k`: the card said "trained on
    **../shared/data/multi30k**" and listed it in `datasets`, the metadata of Hub dataset ids."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "corpora" / "multi30k" / "bpe").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / cwd)
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, dataset_name=data_dir, data_stats={"dataset": data_dir}
    )
    assert card.data.datasets is None
    assert "trained on **multi30k**" in card.text and "| dataset | multi30k |" in card.text
    hub = render_model_card(model_name="tiny", repo_id=REPO_ID, dataset_name="wmt/wmt14")
    assert hub.data.datasets == ["wmt/wmt14"], "a Hub dataset id stays one"


def test_the_cards_ctranslate2_code_runs_as_written_on_an_export(tmp_path, monkeypatch, capsys):
    card = render_model_card(model_name="tiny", repo_id=REPO_ID).text
    deploy = card.split("## Deploy with CTranslate2", 1)[1]
    code = re.search(r"```python\n(.*?)```", deploy, flags=re.DOTALL).group(1)
    tokenizer = tiny_tokenizer()
    export.to_ctranslate2(tiny_model(len(tokenizer)), tokenizer, tmp_path / "ct2")  # what the card's command writes
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    printed = ast.literal_eval(capsys.readouterr().out.strip())
    assert isinstance(printed, list) and len(printed) == 1


def test_the_cards_ctranslate2_code_decodes_without_special_tokens_as_translate_does(tmp_path, monkeypatch, capsys):
    """A model that emits `<unk>`: translate() leaves it out of the text (skip_special_tokens); the card's code
    printed `<unk>` for each."""
    card = render_model_card(model_name="tiny", repo_id=REPO_ID).text
    code = re.search(r"```python\n(.*?)```", card.split("## Deploy with CTranslate2", 1)[1], flags=re.DOTALL).group(1)
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), tie_word_embeddings=False)
    head = torch.nn.Linear(model.config.d_model, model.config.vocab_size)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()[tokenizer.unk_token_id] = 5.0  # <unk> outscores every word
    model.set_output_embeddings(head)
    generation = model.generation_config
    generation.length_penalty_type, generation.max_length_offset, generation.max_new_tokens = "transformers", None, 6
    export.to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    sentence = re.search(r'tokenizer\(\["(.*?)"\]\)', code).group(1)
    assert ast.literal_eval(capsys.readouterr().out.strip()) == translate(model, tokenizer, [sentence])


@pytest.mark.parametrize(
    "content, expected",
    [
        ({"num_sentences": None}, r"eval_results_test\.json has no 'num_sentences'"),
        ({"source_lang": None}, r"eval_results_test\.json has no 'source_lang'"),
        ({"target_lang": None}, r"eval_results_test\.json has no 'target_lang'"),
        ([1, 2], r"eval_results_test\.json holds a JSON list, not an object"),
        ({"sacrebleu": "27.1"}, r"eval_results_test\.json: 'sacrebleu' is '27\.1', not a number"),
        ({"sacrebleu": True}, r"eval_results_test\.json: 'sacrebleu' is True, not a number"),  # model-index's 1.0
        # printed on the card and put in model-index as the dataset's split and the score's signature
        ({"split": 3}, r"eval_results_test\.json: 'split' is 3, not a string\.$"),
        ({"sacrebleu_signature": 1.0}, r"eval_results_test\.json: 'sacrebleu_signature' is 1\.0, not a string\.$"),
        # compared with num_sentences to tell a score on part of the split (`result_caveats`)
        ({"limit": "100"}, r"eval_results_test\.json: 'limit' is '100', not a number\.$"),
        ({"sentences_in_split": 6.0}, r"eval_results_test\.json: 'sentences_in_split' is 6\.0, not a number\.$"),
    ],
)
def test_an_unexpected_eval_json_is_refused_naming_file_and_field(tmp_path, eval_result, content, expected):
    record = content if isinstance(content, list) else {**eval_result, **content}
    if isinstance(content, dict):  # None: the field left out
        record = {key: value for key, value in record.items() if value is not None}
    write_json(tmp_path / "eval_results_test.json", record)
    with pytest.raises(ValueError, match=expected) as error:
        collect_card_inputs([tmp_path])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("score", ["NaN", "Infinity"])
def test_an_evaluation_json_whose_score_is_not_finite_is_refused_naming_it(tmp_path, eval_result, score):
    """json reads NaN and Infinity as floats: they reached model-index as the model's sacreBLEU."""
    text = json.dumps({**eval_result, "sacrebleu": 0.0}).replace('"sacrebleu": 0.0', f'"sacrebleu": {score}')
    (tmp_path / "eval_results_test.json").write_text(text)
    with pytest.raises(ValueError, match=rf"eval_results_test\.json: 'sacrebleu' is {score.lower()[:3]}") as error:
        collect_card_inputs([tmp_path])
    assert "\n" not in str(error.value)


def test_an_evaluation_json_without_a_score_shows_it_as_not_measured(tmp_path, eval_result):
    """A JSON from before chrF was scored: the scores it holds reach the card, the one it lacks is "not measured"."""
    older = {key: value for key, value in eval_result.items() if not key.startswith("chrf")}
    write_json(tmp_path / "eval_results_test.json", older)
    results = collect_card_inputs([tmp_path])["eval_results"]
    assert results == [older]
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=results)
    assert "| chrF | not measured |  |" in card.text
    assert "chrF" not in {result.metric_name for result in card.data.eval_results}


def test_an_evaluation_json_cut_short_is_refused_naming_it(tmp_path, eval_result):
    (tmp_path / "eval_results_test.json").write_text(json.dumps(eval_result)[:-10])
    with pytest.raises(ValueError, match=r"eval_results_test\.json does not parse \("):
        collect_card_inputs([tmp_path])


def test_nested_data_statistics_are_shown_by_their_dotted_names():
    stats = {"language_pair": "en-de", "sentence_pairs": {"train": 200, "removed": {"too_long": 3}}}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, data_stats=stats)
    assert "| sentence_pairs.train | 200 |" in card.text and "| sentence_pairs.removed.too_long | 3 |" in card.text


def test_a_bar_or_a_line_break_in_a_recorded_value_stays_in_its_table_cell():
    """A `|` in a data statistic or a hyperparameter split its row into more cells; a line break ended the table."""
    stats = {"filter": "len < 250 | ratio < 1.5", "note": "cleaned\nby hand"}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, data_stats=stats, training_args={"rule": "a|b"})
    assert "| filter | len < 250 \\| ratio < 1.5 |" in card.text and "| note | cleaned by hand |" in card.text
    assert "| rule | a\\|b |" in card.text


def test_a_result_found_in_two_directories_is_listed_once(tmp_path, eval_result):
    """`--card-from runs/x runs/x/averaged` where evaluate.py's JSON was copied into both: the card listed the
    same scores twice, and model-index held every metric twice."""
    validation = {**eval_result, "split": "validation", "sacrebleu": 12.5}
    for directory in ("run", "run/averaged"):
        write_json(tmp_path / directory / "eval_results_test.json", eval_result)
    write_json(tmp_path / "run" / "eval_results_validation.json", validation)
    results = collect_card_inputs([tmp_path / "run", tmp_path / "run" / "averaged"])["eval_results"]
    assert results == [eval_result, validation]
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=results)
    sacrebleu = [
        (r.dataset_split, r.metric_value)
        for r in ModelCard(str(card)).data.eval_results
        if r.metric_name == "sacreBLEU"
    ]
    assert sacrebleu == [("test", round(eval_result["sacrebleu"], 2)), ("validation", 12.5)]


def test_two_evaluations_of_one_split_with_the_models_decoding_and_other_scores_are_refused(eval_result):
    """Evaluated again (another sacreBLEU, another copy of the test set under the same name): model-index held two
    sacreBLEU scores for one split, and the card did not say which was the model's. The same scores twice are
    listed once."""
    again = {**eval_result, "sacrebleu": 12.5, "model": "/runs/copy"}
    with pytest.raises(
        ValueError, match=r"^Two evaluations score the model on synthetic en-de, split test, "
    ) as error:
        render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result, again])
    assert "sacreBLEU 12.5" in str(error.value) and "\n" not in str(error.value)
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result, {**eval_result, "model": "x"}]
    )
    assert [r.metric_value for r in card.data.eval_results if r.metric_name == "sacreBLEU"] == [
        round(eval_result["sacrebleu"], 2)
    ]
    limited = {**again, "limit": 5, "num_sentences": 5, "sentences_in_split": 10}  # labelled, not in model-index
    render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result, limited])


def test_evaluations_of_both_directions_without_the_trainings_are_refused(eval_result):
    """With no data_stats.json to say the model's direction, a de → en score reached model-index under the en → de
    score's dataset name (the Hub groups results by dataset and split): the card listed it as en → de's."""
    reverse = {**eval_result, "source_lang": "de", "target_lang": "en", "sacrebleu": 11.0}
    with pytest.raises(ValueError, match=r"^The evaluations translate en → de and de → en, and no record") as error:
        render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result, reverse])
    assert "\n" not in str(error.value)
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, source_lang="en", target_lang="de", eval_results=[eval_result, reverse]
    )
    assert {r.metric_value for r in card.data.eval_results if r.metric_name == "sacreBLEU"} == {
        round(eval_result["sacrebleu"], 2)
    }, "the training's direction known: the other one is labelled and kept out"


def test_the_training_records_of_the_first_card_input_directory_that_has_them_are_the_cards(tmp_path):
    """`--card-from runs/x/checkpoint-10 runs/x`: the card is of the checkpoint's log and records, not of the run's
    later ones that the directory after it holds."""
    first, later = LOG_HISTORY[:1], LOG_HISTORY
    write_json(tmp_path / "checkpoint" / "trainer_state.json", {"global_step": 10, "log_history": first})
    write_json(tmp_path / "checkpoint" / "training_args.json", {"learning_rate": 7e-4})
    write_json(tmp_path / "checkpoint" / "data_stats.json", {"language_pair": "en-de"})
    write_json(tmp_path / "run" / "trainer_state.json", {"global_step": 20, "log_history": later})
    write_json(tmp_path / "run" / "training_args.json", {"learning_rate": 1e-3})
    write_json(tmp_path / "run" / "data_stats.json", {"language_pair": "en-fr"})
    inputs = collect_card_inputs([tmp_path / "checkpoint", tmp_path / "run"])
    assert inputs["log_history"] == first
    assert inputs["training_args"] == {"learning_rate": 7e-4} and inputs["data_stats"] == {"language_pair": "en-de"}


def test_scores_of_another_local_model_are_refused(tmp_path, eval_result):
    (tmp_path / "model").mkdir()
    (tmp_path / "other").mkdir()
    write_json(tmp_path / "eval" / "eval_results_test.json", {**eval_result, "model": str(tmp_path / "other")})
    with pytest.raises(ValueError, match=r"eval_results_test\.json scored the model .*other, not .*model: refusing"):
        collect_card_inputs([tmp_path / "eval"], tmp_path / "model")
    write_json(tmp_path / "eval" / "eval_results_test.json", {**eval_result, "model": str(tmp_path / "model/.")})
    assert len(collect_card_inputs([tmp_path / "eval"], tmp_path / "model")["eval_results"]) == 1
    write_json(tmp_path / "eval" / "eval_results_test.json", {**eval_result, "model": "someone/on-the-hub"})
    assert len(collect_card_inputs([tmp_path / "eval"], tmp_path / "model")["eval_results"]) == 1


def test_scores_of_weights_since_replaced_are_refused(tmp_path, eval_result, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"the weights evaluated")
    scored = {**eval_result, "model": str(tmp_path / "model"), "model_weights": weights_record(tmp_path / "model")}
    write_json(tmp_path / "eval" / "eval_results_test.json", scored)
    write_json(tmp_path / "eval" / "eval_results_valid.json", {**scored, "split": "valid"})
    hashed = []
    monkeypatch.setattr(model_card, "weights_record", lambda directory: hashed.append(1) or weights_record(directory))
    assert len(collect_card_inputs([tmp_path / "eval"], tmp_path / "model")["eval_results"]) == 2
    assert len(hashed) == 1, "the model's weights hashed once for both results"
    (tmp_path / "model" / "model.safetensors").write_bytes(b"converted again")  # the same path, other weights
    with pytest.raises(ValueError, match=r"eval_results_test\.json scored other weights than .*model holds now") as e:
        collect_card_inputs([tmp_path / "eval"], tmp_path / "model")
    assert "(trained, averaged or converted again since): evaluate it again." in str(e.value), "an average, too"
    assert len(collect_card_inputs([tmp_path / "eval"])["eval_results"]) == 2, "no model given: nothing to compare"


def test_a_copied_run_shows_the_scores_its_weights_got_where_they_were_evaluated(tmp_path, eval_result):
    """`cp -r runs/A runs/B`: B's evaluation names runs/A/averaged, where it was evaluated. It scored the weights B
    holds (its record says which), and was refused as another model's; the weights decide, whatever A holds now."""
    for run in ("A", "B"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "model.safetensors").write_bytes(b"the weights evaluated")
    scored = {**eval_result, "model": str(tmp_path / "A"), "model_weights": weights_record(tmp_path / "A")}
    write_json(tmp_path / "B" / "eval" / "eval_results_test.json", scored)
    assert len(collect_card_inputs([tmp_path / "B" / "eval"], tmp_path / "B")["eval_results"]) == 1
    (tmp_path / "A" / "model.safetensors").write_bytes(b"A trained again")  # B's weights are still those scored
    assert len(collect_card_inputs([tmp_path / "B" / "eval"], tmp_path / "B")["eval_results"]) == 1
    (tmp_path / "B" / "model.safetensors").write_bytes(b"B trained on")
    with pytest.raises(ValueError, match=r"eval_results_test\.json scored other weights than .*B holds now"):
        collect_card_inputs([tmp_path / "B" / "eval"], tmp_path / "B")


def test_a_result_naming_its_model_but_not_its_weights_is_refused_once_the_weights_are_newer(tmp_path, eval_result):
    """scripts/evaluate.py before 2026-12-03 recorded the model directory only: a model trained again or averaged
    since kept the old score on its card."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"the weights evaluated")
    record = write_json(
        tmp_path / "eval" / "eval_results_test.json", {**eval_result, "model": str(tmp_path / "model")}
    )
    os.utime(tmp_path / "model" / "model.safetensors", (1_000_000, 1_000_000))  # written before the evaluation
    assert len(collect_card_inputs([tmp_path / "eval"], tmp_path / "model")["eval_results"]) == 1
    os.utime(record, (1_000_000, 1_000_000))  # within the same tick of a coarse clock: not written after it
    assert len(collect_card_inputs([tmp_path / "eval"], tmp_path / "model")["eval_results"]) == 1
    (tmp_path / "model" / "model.safetensors").write_bytes(b"averaged again")
    os.utime(record, (2_000_000, 2_000_000))  # evaluated before: its weights are now newer
    with pytest.raises(ValueError) as refused:
        collect_card_inputs([tmp_path / "eval"], tmp_path / "model")
    assert str(refused.value) == (
        f"{record} does not record the weights it scored, and {tmp_path / 'model'}'s weights were written after it "
        "(trained again or averaged since?): evaluate it again."
    )


@pytest.mark.parametrize(
    "template, expected",
    [
        ("{{ no_such_variable }}", r"card\.md cannot be rendered: 'no_such_variable' is undefined"),
        ("line\n{% if %}", r"card\.md, line 2: "),
    ],
)
def test_a_broken_template_is_one_line_naming_it(tmp_path, template, expected):
    (tmp_path / "card.md").write_text(template)
    with pytest.raises(ValueError, match=expected) as error:
        render_model_card(tmp_path / "card.md", model_name="tiny", repo_id=REPO_ID)
    assert "\n" not in str(error.value)


def test_a_template_path_that_is_not_a_file_is_named_as_such(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^Model card template .*absent\.md does not exist\.$"):
        render_model_card(tmp_path / "absent.md", model_name="tiny", repo_id=REPO_ID)
    with pytest.raises(IsADirectoryError, match=r"^Model card template .* is a directory: give the template file\.$"):
        render_model_card(tmp_path, model_name="tiny", repo_id=REPO_ID)


def test_training_records_of_another_run_are_refused(card_dir, tmp_path):
    """`--card-from runs/B` for runs/A/averaged: the card showed B's hyperparameters, length, data and curves as
    A's. Both record their run; a copy of A (`cp -r`) records the same one."""
    identity = {"config": {"d_model": 32}, "tokenizer": "abc", "data": {"files": []}, "seed": 42, "preset": "tiny"}
    write_json(tmp_path / "A" / "averaged" / "run_identity.json", identity)
    for run, seed in (("A", 42), ("B", 7)):
        (tmp_path / run).mkdir(exist_ok=True)
        for record in ("trainer_state.json", "training_args.json", "data_stats.json"):
            (tmp_path / run / record).write_bytes((card_dir / record).read_bytes())
        write_json(tmp_path / run / "run_identity.json", {**identity, "seed": seed})
    assert collect_card_inputs([tmp_path / "A"], tmp_path / "A" / "averaged")["log_history"] == LOG_HISTORY
    with pytest.raises(ValueError) as refused:
        collect_card_inputs([tmp_path / "B"], tmp_path / "A" / "averaged")
    assert str(refused.value) == (
        f"{tmp_path / 'B' / 'run_identity.json'} is of another run than {tmp_path / 'A' / 'averaged'} (seed: 42 vs 7, "
        "the model's vs theirs): refusing to put its training records on the model's card."
    )
    (tmp_path / "B" / "run_identity.json").unlink()  # records of a run that wrote none: nothing tells
    assert collect_card_inputs([tmp_path / "B"], tmp_path / "A" / "averaged")["log_history"] == LOG_HISTORY


def test_the_card_of_an_average_or_a_checkpoint_describes_those_weights(card_dir, tmp_path):
    """`--model runs/A/checkpoint-10` or an average of earlier checkpoints (`average_checkpoints.py --checkpoints`)
    with `--card-from runs/A`: the card gave the run's last update, loss and curves, and said nothing of averaging;
    the final model's card and the average's were the same."""
    average, checkpoint = tmp_path / "average", tmp_path / "checkpoint-10"
    for model in (average, checkpoint):
        write_json(model / "config.json", tiny_config().to_dict())
    write_json(average / "checkpoint_averaging.json", {"checkpoints": ["../checkpoint-5", "../checkpoint-10"]})
    write_json(checkpoint / "trainer_state.json", {"global_step": 10, "log_history": LOG_HISTORY[:1]})
    for model in (average, checkpoint):
        card = model_card.write_model_card(model, repo_id=REPO_ID, card_from=[card_dir]).read_text()
        assert "- steps: 10\n" in card and "- steps: 20" not in card
        assert "- mean_train_loss: 5.1\n" in card and "last_launch_runtime_s" not in card
        assert (
            "![Training and evaluation curves](training_curves.png)" in card
            and (model / "training_curves.png").is_file()
        )
    assert (
        "the average of 2 checkpoints of the run (checkpoint averaging, the\npaper's Sec. 6.1): "
        in (average / "README.md").read_text()
    )
    assert "`checkpoint-5`, `checkpoint-10`" in (average / "README.md").read_text()
    assert "average of" not in (checkpoint / "README.md").read_text()
    for edited in ([], ["../checkpoint-5", 10], "../checkpoint-10"):  # edited by hand
        write_json(average / "checkpoint_averaging.json", {"checkpoints": edited})
        with pytest.raises(ValueError, match=r"checkpoint_averaging\.json does not list the checkpoints averaged\.$"):
            model_card.write_model_card(average, repo_id=REPO_ID, card_from=[card_dir])
    run = tmp_path / "run"  # the run's final model, with its records
    write_json(run / "config.json", tiny_config().to_dict())
    for record in ("trainer_state.json", "training_args.json", "data_stats.json"):
        (run / record).write_bytes((card_dir / record).read_bytes())
    final = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "- steps: 20\n" in final and "average of" not in final


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("training_args.json", [1, 2], r"training_args\.json holds a JSON list, not an object\.$"),
        ("data_stats.json", "en-de", r"data_stats\.json holds a JSON str, not an object\.$"),
        ("data_stats.json", {"language_pair": 5}, r"data_stats\.json: 'language_pair' is not a string such as"),
        ("data_stats.json", {"target_lang": ["de"]}, r"data_stats\.json: 'target_lang' is not a string such as"),
        ("trainer_state.json", [], r"trainer_state\.json holds a JSON list, not an object\.$"),
        ("trainer_state.json", {"log_history": {"loss": 1}}, r"'log_history' is a JSON dict, not a list of log"),
        ("trainer_state.json", {"log_history": [3]}, r"log_history\[0\] is a JSON int, not an object\.$"),
        ("trainer_state.json", {"log_history": [{"loss": "1.5", "step": 1}]}, r"\['loss'\] is '1\.5', not a number"),
        ("trainer_state.json", {"log_history": [{"loss": 1.5, "step": "4"}]}, r"\['step'\] is '4', not a number"),
        ("trainer_state.json", {"log_history": [{"train_runtime": "9 s"}]}, r"\['train_runtime'\] is '9 s', not a"),
        ("trainer_state.json", {"log_history": [{"loss": 1.5, "step": 4, "epoch": "0.5"}]}, r"\['epoch'\] is '0\.5'"),
        ("trainer_state.json", {"log_history": [{"loss": 1.5, "step": 4, "updates_logged": "4"}]}, r"\['updates_"),
        ("trainer_state.json", {"log_history": [{"eval_loss": "4.6", "step": 4}]}, r"\['eval_loss'\] is '4\.6'"),
        ("generation_config.json", [], r"generation_config\.json holds a JSON list, not an object\.$"),
    ],
)
def test_an_edited_training_record_is_refused_naming_the_file(tmp_path, name, content, expected):
    """A record edited by hand into another shape failed with a TypeError or AttributeError (a traceback from
    push_to_hub.py, which reports ValueErrors in one line), or, a log_history object, rendered without a word."""
    write_json(tmp_path / "config.json", tiny_config().to_dict())
    write_json(tmp_path / name, content)
    with pytest.raises(ValueError, match=expected) as refused:
        model_card.write_model_card(tmp_path, repo_id=REPO_ID, card_from=[tmp_path])
    assert str(tmp_path / name) in str(refused.value) and "\n" not in str(refused.value)


def test_a_score_of_the_other_direction_is_labelled_and_kept_out_of_model_index(eval_result, converted_fairseq_dir):
    """`evaluate.py --source-lang de --target-lang en` of an en→de model went into model-index as its de-en score."""
    reverse = {**eval_result, "split": "reverse", "source_lang": "de", "target_lang": "en"}
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, source_lang="en", target_lang="de", eval_results=[reverse, eval_result]
    )
    assert {result.dataset_name for result in card.data.eval_results} == {"synthetic en-de"}
    assert card.data.language == ["en", "de"]
    assert (
        "Scored on translation de → en, not the en → de this model was made for: not this model's score" in card.text
    )
    converted = json.loads((converted_fairseq_dir / "fairseq_conversion.json").read_text())  # its pair: en-de
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[reverse], conversion=converted)
    assert card.data.eval_results is None
    # nothing recorded of the model's pair: the results' own is the card's
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[reverse])
    assert {result.dataset_name for result in card.data.eval_results} == {"synthetic de-en"}


def test_the_card_says_the_model_was_trained_on_its_training_data_not_an_evaluations(eval_result, tmp_path):
    """A model trained on local Multi30k files and evaluated on wmt/wmt14: the card said "trained on **wmt/wmt14**"
    and listed wmt/wmt14 as its training data (`datasets` metadata), taking the first evaluation's dataset."""
    wmt = {**eval_result, "dataset": "wmt/wmt14", "language_pair": "de-en"}
    write_json(tmp_path / "model" / "config.json", tiny_config().to_dict())
    write_json(tmp_path / "eval" / "eval_results_test.json", wmt)
    write_json(tmp_path / "run" / "data_stats.json", {"dataset": "/home/alice/multi30k", "language_pair": "en-de"})
    card = model_card.write_model_card(
        tmp_path / "model", repo_id=REPO_ID, card_from=[tmp_path / "eval", tmp_path / "run"]
    )
    text = card.read_text()
    assert "trained on **multi30k**" in text and "trained on **wmt" not in text
    metadata = ModelCard(text).data
    assert metadata.datasets is None and {r.dataset_type for r in metadata.eval_results} == {"wmt/wmt14"}
    # the Hub configuration the evaluation read (wmt14's de-en holds both directions), not the translation's
    assert {(r.dataset_name, r.dataset_config) for r in metadata.eval_results} == {("wmt/wmt14 de-en", "de-en")}
    assert metadata.model_name == "tiny-transformer" and "\n# tiny-transformer\n" in text, (
        "the repo's name, not its owner's"
    )
    # unrecorded training data: the card names none
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[wmt])
    assert "trained on" not in card.text.split("## Results")[0] and card.data.datasets is None
    hub = render_model_card(model_name="tiny", repo_id=REPO_ID, dataset_name="wmt/wmt14", eval_results=[wmt])
    assert hub.data.datasets == ["wmt/wmt14"] and "trained on **wmt/wmt14**" in hub.text


def test_the_cards_languages_are_the_trainings_even_with_a_hyphen_in_a_code(eval_result, tmp_path):
    """A pt-BR → en run: data_stats.json's "pt-BR-en", split at its first hyphen, made the card claim the languages
    `pt` and `BR-en`, translating "pt → BR-en"."""
    write_json(tmp_path / "model" / "config.json", tiny_config().to_dict())
    stats = {"language_pair": "pt-BR-en", "source_lang": "pt-BR", "target_lang": "en"}
    write_json(tmp_path / "run" / "data_stats.json", stats)
    text = model_card.write_model_card(tmp_path / "model", repo_id=REPO_ID, card_from=[tmp_path / "run"]).read_text()
    assert ModelCard(text).data.language == ["pt-BR", "en"] and "translating **pt-BR → en**" in text
    # A record older than source_lang / target_lang: the pair is ambiguous, the evaluations' languages are used.
    write_json(tmp_path / "run" / "data_stats.json", {"language_pair": "pt-BR-en"})
    evaluated = {**eval_result, "source_lang": "pt-BR", "target_lang": "en"}
    write_json(tmp_path / "eval" / "eval_results_test.json", evaluated)
    card_from = [tmp_path / "run", tmp_path / "eval"]
    text = model_card.write_model_card(tmp_path / "model", repo_id=REPO_ID, card_from=card_from).read_text()
    assert ModelCard(text).data.language == ["pt-BR", "en"]
    write_json(tmp_path / "run" / "data_stats.json", {"language_pair": "en-de"})  # unambiguous, as it always was
    text = model_card.write_model_card(tmp_path / "model", repo_id=REPO_ID, card_from=[tmp_path / "run"]).read_text()
    assert ModelCard(text).data.language == ["en", "de"]


def test_a_fine_tuned_models_card_says_it_was_fine_tuned_and_that_its_length_is_the_fine_tunings():
    """A 7-update run fine-tuned for 2: the card said "trained on **data**" and "Training length: steps: 2", and named
    the model it started from only in the hyperparameter table."""
    local = {"model_name_or_path": "/runs/base/averaged", "max_steps": 2}
    card = render_model_card(
        model_name="tiny", repo_id=REPO_ID, dataset_name="data", training_args=local, log_history=LOG_HISTORY
    )
    assert "fine-tuned from `averaged` on **data**," in card.text and "trained on **data**" not in card.text
    assert "Fine-tuning length (from the trainer's log; the training of `averaged` not included):" in card.text
    trained = render_model_card(model_name="tiny", repo_id=REPO_ID, dataset_name="data", log_history=LOG_HISTORY)
    assert "trained on **data**," in trained.text and "fine-tuned" not in trained.text.split("## Results")[0]
    assert "Training length (from the trainer's log):" in trained.text


def test_num_train_epochs_is_not_shown_where_max_steps_set_the_length():
    """The Trainer ignores num_train_epochs when max_steps > 0: a run of 52 epochs had "num_train_epochs | 3.0"."""
    for steps in (1, 100000):
        by_steps = render_model_card(
            model_name="tiny", repo_id=REPO_ID, training_args={"max_steps": steps, "num_train_epochs": 3.0}
        )
        assert f"| max_steps | {steps} |" in by_steps.text and "num_train_epochs" not in by_steps.text
    for unset in (-1, 0):  # the Trainer counts epochs unless max_steps > 0
        by_epochs = render_model_card(
            model_name="tiny", repo_id=REPO_ID, training_args={"max_steps": unset, "num_train_epochs": 3.0}
        )
        assert "| num_train_epochs | 3.0 |" in by_epochs.text


def hyperparameter_rows(card: ModelCard) -> list[list[str]]:
    """The card's hyperparameter table, `[name, value]` per row."""
    table = card.text.split("| hyperparameter | value |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip("| ").split(" | ") for line in table.splitlines()]


def test_the_hyperparameter_table_shows_the_recipe_in_its_order_then_the_projects_extras():
    """The settings a reader needs to train the model again, as training_args.json records them (every
    TrainingArguments field, the project's own after them): the recipe's in their order, then the extras; the
    trainer's plumbing (output_dir, logging) left out."""
    recipe = {
        "learning_rate": 2.0,
        "lr_scheduler_type": "inverse_sqrt",
        "warmup_steps": 4000,
        "warmup_ratio": 0.0,
        "max_steps": 100000,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "optim": "adamw_torch",
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-09,
        "weight_decay": 0.01,
        "max_grad_norm": 0.0,
        "label_smoothing_factor": 0.1,
        "seed": 0,
        "data_seed": 3,
        "bf16": True,
        "fp16": False,
    }
    recorded = {"tokens_per_update": 25000, "output_dir": "/x", "logging_steps": 10, "num_train_epochs": 3.0}
    recorded |= dict(reversed(recipe.items()))  # the record's order is not the table's
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, training_args=recorded)
    expected = [[key, str(value)] for key, value in recipe.items()] + [["tokens_per_update", "25000"]]
    assert hyperparameter_rows(card) == expected


def test_the_hyperparameter_table_leaves_out_the_trainers_plumbing_and_unset_extras():
    """training_args.json holds every field of the run's arguments: Seq2SeqTrainingArguments' own (the validation's
    decoding, a sampler token batching replaces) and --overwrite_output_dir are no recipe, and an extra left unset
    is none either (the example cards showed "generation_config | None", "tokens_per_update | None")."""
    arguments = TranslationTrainingArguments(
        output_dir="/x", predict_with_generate=True, max_train_minutes=90.0, average_last_checkpoints=5
    )
    recorded = arguments.to_dict() | {"preset": "tiny", "model_name_or_path": None, "world_size": 1}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, training_args=recorded)
    rows = hyperparameter_rows(card)
    assert [name for name, _ in rows][-6:] == [
        "max_tokens_per_device",
        "paper_schedule",
        "max_train_minutes",
        "average_last_checkpoints",
        "preset",
        "world_size",
    ]
    assert all(value != "None" for _, value in rows)
    for plumbing in ("predict_with_generate", "sortish_sampler", "generation_", "overwrite_output_dir"):
        assert not any(name.startswith(plumbing) for name, _ in rows)


def test_a_data_seed_is_shown_beside_the_seed_where_it_set_the_batch_order():
    """The trainer shuffles batches with data_seed when given: a card showing seed 0 alone did not reproduce them."""
    own = render_model_card(model_name="tiny", repo_id=REPO_ID, training_args={"seed": 0, "data_seed": 7})
    assert "| seed | 0 |" in own.text and "| data_seed | 7 |" in own.text
    from_seed = render_model_card(model_name="tiny", repo_id=REPO_ID, training_args={"seed": 0, "data_seed": None})
    assert "| seed | 0 |" in from_seed.text and "data_seed" not in from_seed.text


def test_the_card_of_a_run_that_loaded_its_best_checkpoint_describes_that_checkpoint(card_dir, tmp_path):
    """Under load_best_model_at_end the final model holds its best checkpoint's weights: the card gave the last
    update's length, loss and curves."""
    run = tmp_path / "run"
    write_json(run / "config.json", tiny_config().to_dict())
    state = {"global_step": 20, "best_model_checkpoint": str(run / "checkpoint-10"), "log_history": LOG_HISTORY}
    write_json(run / "trainer_state.json", state)
    args = {"load_best_model_at_end": True, "metric_for_best_model": "loss", "max_steps": 20}
    write_json(run / "training_args.json", args)
    card = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "These weights are those of `checkpoint-10`, the run's best checkpoint by\n`loss`, which training" in card
    assert "- steps: 10\n" in card and "- steps: 20" not in card
    write_json(run / "training_args.json", {**args, "load_best_model_at_end": False})  # the last update's weights
    card = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "- steps: 20\n" in card and "best checkpoint" not in card
    write_json(run / "training_args.json", args)
    write_json(run / "trainer_state.json", {**state, "best_model_checkpoint": str(run / "checkpoint-20")})
    card = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "- steps: 20\n" in card and "best checkpoint" not in card, "the best is the last"
    write_json(run / "trainer_state.json", {**state, "best_model_checkpoint": None})  # stopped before an evaluation
    card = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "- steps: 20\n" in card and "best checkpoint" not in card, "no best checkpoint yet"
    write_json(run / "trainer_state.json", {**state, "best_model_checkpoint": str(run / "best")})  # edited by hand
    card = model_card.write_model_card(run, repo_id=REPO_ID, card_from=[run]).read_text()
    assert "- steps: 20\n" in card and "best checkpoint" not in card, "no checkpoint's update to tell"


def test_a_model_fine_tuned_from_a_converted_one_gets_the_conversions_card(converted_fairseq_dir, tmp_path):
    """A fine-tune of a converted fairseq model holds no fairseq_conversion.json: its training record carries the
    conversion, and the card says where the weights come from, under fairseq's license."""
    model_dir = shutil.copytree(converted_fairseq_dir, tmp_path / "model")
    conversion = json.loads((model_dir / "fairseq_conversion.json").read_text())
    (model_dir / "fairseq_conversion.json").unlink()
    record = {"model_name_or_path": "/runs/converted", "learning_rate": 1e-4, "fairseq_conversion": conversion}
    write_json(tmp_path / "run" / "training_args.json", record)
    text = model_card.write_model_card(model_dir, repo_id=REPO_ID, card_from=[tmp_path / "run"]).read_text()
    assert "## Converted from fairseq" in text and f"`{conversion['arch']}`" in text
    assert "This model was fine-tuned from `converted`, which comes from weights trained with" in text
    assert ModelCard(text).data.license == "mit" and "- fairseq" in text
    assert "| fairseq_conversion |" not in text, "the record, not a hyperparameter"


def test_the_curves_of_a_log_with_bleu_but_no_loss_have_the_bleu_panel(tmp_path, monkeypatch):
    """Only losses counted as something to plot: a log of eval BLEU alone was refused as holding nothing."""
    from matplotlib.figure import Figure

    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure) or savefig(figure, *args, **kwargs)
    )
    png = plot_training_curves(
        [{"eval_sacrebleu": 1.5, "step": 10}, {"eval_sacrebleu": 2.5, "step": 20}], tmp_path / "c.png"
    )
    assert png.read_bytes().startswith(b"\x89PNG")
    (figure,) = drawn
    assert [(axes.get_title(), [line.get_label() for line in axes.lines]) for axes in figure.axes] == [
        ("BLEU", ["sacrebleu"])
    ]


def test_a_loss_logged_without_its_update_or_twice_at_one_is_not_counted_again():
    """Each logged loss weighs by the updates it covers: one at an update already covered, or at none, covers none."""
    log_history = [
        {"loss": 9.0},  # edited by hand: no update, before any other
        {"loss": 4.0, "step": 4, "updates_logged": 4},
        {"loss": 9.0, "step": 4, "updates_logged": 4},  # the same log written twice
        {"loss": 9.0},  # edited by hand: no update
        {"loss": 2.0, "step": 8, "updates_logged": 4},
    ]
    assert training_summary(log_history) == {"steps": 8, "mean_train_loss": 3.0}


def test_an_evaluation_that_names_no_dataset_is_listed_under_the_training_data_as_the_text_says(eval_result):
    """An evaluation JSON without its dataset (written by hand, or before the field): the text heads it with the
    training data's name, and model-index names the same; without either, "unknown"."""
    unnamed = {**eval_result, "dataset": None}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, dataset_name="wmt/wmt14", eval_results=[unnamed])
    assert "**wmt/wmt14, split `test`**" in card.text
    assert {result.dataset_type for result in card.data.eval_results} == {"wmt/wmt14"}
    nameless = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[unnamed])
    assert "**Unnamed dataset, split `test`**" in nameless.text
    assert {result.dataset_type for result in nameless.data.eval_results} == {"unknown"}
    assert card_metadata_errors(str(card)) == [] and card_metadata_errors(str(nameless)) == []


def test_model_index_names_the_dataset_commit_an_evaluation_read(eval_result):
    """An evaluation of a Hub dataset pinned at a commit (`dataset_commit`): model-index gives it as the dataset's
    revision, so the Hub's reader knows which version of the split was scored."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    pinned = {**eval_result, "dataset": "wmt/wmt14", "language_pair": "de-en", "dataset_commit": commit}
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[pinned])
    assert {result.dataset_revision for result in card.data.eval_results} == {commit}
    assert card_metadata_errors(str(card)) == []
    unpinned = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result])
    assert {result.dataset_revision for result in unpinned.data.eval_results} == {None}


def test_a_trainer_state_without_a_log_history_gives_a_card_without_curves(tmp_path):
    """A trainer_state.json that holds no log_history (edited, or written by another tool): nothing to plot or
    summarise, which the card says; not a refusal."""
    write_json(tmp_path / "config.json", tiny_config().to_dict())
    write_json(tmp_path / "trainer_state.json", {"global_step": 20})
    assert collect_card_inputs([tmp_path])["log_history"] is None
    card = model_card.write_model_card(tmp_path, repo_id=REPO_ID, card_from=[tmp_path]).read_text()
    assert "Training curves: not recorded" in card and not (tmp_path / "training_curves.png").exists()


def test_a_run_ended_before_its_first_loss_log_gets_a_card_without_curves(tmp_path):
    """`logging_steps` above the run's length: the log holds only the Trainer's closing summary (`train_loss`, not
    `loss`), nothing to plot; the card says so, and is written."""
    write_json(tmp_path / "config.json", tiny_config().to_dict())
    summary = {"step": 20, "epoch": 1.0, "train_loss": 5.2, "train_runtime": 3.0}
    write_json(tmp_path / "trainer_state.json", {"global_step": 20, "log_history": [summary]})
    card = model_card.write_model_card(tmp_path, repo_id=REPO_ID, card_from=[tmp_path]).read_text()
    assert "Training curves: not recorded" in card and not (tmp_path / "training_curves.png").exists()
    assert "training_curves.png" not in card


def test_the_curves_written_to_a_path_given_as_a_string_are_returned_as_a_path(tmp_path):
    png = plot_training_curves(LOG_HISTORY, str(tmp_path / "curves.png"))
    assert png == tmp_path / "curves.png" and png.read_bytes().startswith(b"\x89PNG")


def test_a_card_is_written_for_directories_given_as_strings(card_dir, tmp_path):
    """scripts/push_to_hub.py passes --model and --card-from as the strings argparse gives."""
    write_json(tmp_path / "model" / "config.json", tiny_config().to_dict())
    card = model_card.write_model_card(str(tmp_path / "model"), repo_id=REPO_ID, card_from=[str(card_dir)])
    assert card == tmp_path / "model" / "README.md" and "- steps: 20\n" in card.read_text()


def test_a_card_input_directory_that_does_not_exist_is_refused_naming_it(card_dir, tmp_path):
    """A mistyped --card-from would otherwise give a card of nothing measured, and push it."""
    with pytest.raises(FileNotFoundError, match=r"^Card input directory .*runs/typo does not exist\.$"):
        collect_card_inputs([card_dir, tmp_path / "runs" / "typo"])


@pytest.mark.parametrize(
    "source_lang, target_lang, sentence",
    [
        ("en", "de", "The small dog sees a red ball."),
        ("de", "en", "Der kleine Hund sieht einen roten Ball."),
        ("fr", "en", "Le petit chien voit une balle rouge."),
        ("cs", "en", "A sentence to translate."),  # a language the card has no example in
    ],
)
def test_the_usage_example_is_a_sentence_in_the_models_source_language(source_lang, target_lang, sentence):
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, source_lang=source_lang, target_lang=target_lang)
    assert f'tokenizer(["{sentence}' in card.text


def test_a_fine_tune_of_a_converted_model_into_another_direction_is_scored_in_the_trainings(
    converted_fairseq_dir, eval_result
):
    """The training's pair is the model's, a conversion's only where training recorded none: a de→en fine-tune of
    the converted en→de model, scored de→en, has that score as its own."""
    converted = json.loads((converted_fairseq_dir / "fairseq_conversion.json").read_text())
    assert (converted["source_lang"], converted["target_lang"]) == ("en", "de")
    reverse = {**eval_result, "source_lang": "de", "target_lang": "en"}
    card = render_model_card(
        model_name="tiny",
        repo_id=REPO_ID,
        source_lang="de",
        target_lang="en",
        eval_results=[reverse],
        conversion=converted,
    )
    assert {result.dataset_name for result in card.data.eval_results} == {"synthetic de-en"}
    assert card.data.language == ["de", "en"] and "Scored on" not in card.text


def test_evaluations_kept_in_another_runs_directory_are_judged_by_the_weights_they_scored(tmp_path, eval_result):
    """Only training records must be the model's run: an evaluation JSON written into another run's directory
    (`evaluate.py --output-dir runs/base`) is the model's score if it scored the model's weights."""
    identity = {"config": {"d_model": 32}, "tokenizer": "abc", "data": {"files": []}, "seed": 42, "preset": "tiny"}
    model = tmp_path / "fine-tuned"
    write_json(model / "run_identity.json", identity)
    (model / "model.safetensors").write_bytes(b"the weights evaluated")
    write_json(tmp_path / "base" / "run_identity.json", {**identity, "seed": 7})
    scored = {**eval_result, "model": str(model), "model_weights": weights_record(model)}
    write_json(tmp_path / "base" / "eval_results_test.json", scored)
    assert collect_card_inputs([tmp_path / "base"], model)["eval_results"] == [scored]


def test_a_checkpoint_describes_its_own_weights_beside_the_runs_records_or_copied_under_another_name(
    card_dir, tmp_path
):
    """A checkpoint of a load_best_model_at_end run names the best checkpoint so far; its weights are its own, also
    with the run's training_args.json copied beside it, or copied out as `release` without it."""
    state = {"global_step": 10, "best_model_checkpoint": str(tmp_path / "checkpoint-5"), "log_history": LOG_HISTORY}
    checkpoint, release = tmp_path / "checkpoint-10", tmp_path / "release"
    for model in (checkpoint, release):
        write_json(model / "config.json", tiny_config().to_dict())
        write_json(model / "trainer_state.json", state)
    write_json(checkpoint / "training_args.json", {"load_best_model_at_end": True, "metric_for_best_model": "loss"})
    for model in (checkpoint, release):
        card = model_card.write_model_card(model, repo_id=REPO_ID, card_from=[card_dir]).read_text()
        assert "- steps: 10\n" in card and "best checkpoint" not in card


def test_a_relative_path_that_does_not_exist_here_is_still_named_by_its_last_component(tmp_path, monkeypatch):
    """A card rendered where the run's data directory is not (another machine, the data moved since): `../data/x`
    is still a local path, not a Hub dataset id."""
    monkeypatch.chdir(tmp_path)
    for data_dir in ("../data/multi30k", "./data/multi30k"):
        card = render_model_card(
            model_name="tiny", repo_id=REPO_ID, dataset_name=data_dir, data_stats={"dataset": data_dir}
        )
        assert card.data.datasets is None and "| dataset | multi30k |" in card.text
