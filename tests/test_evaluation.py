"""Tests of modeling/evaluation.py: a split translated, scored and recorded with its decoding settings; into a
hypotheses file, resumed after a kill."""

import json
import logging
import shutil
import unicodedata
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers import (
    FAIRSEQ_FIXTURES,
    HUB_TOKEN,
    EchoModel,
    reloaded_with_config,
    save_tiny_checkpoint,
    synthetic_pairs,
    tiny_model,
    tiny_tokenizer,
    tiny_translator,
)
from huggingface_hub import HfApi, constants

from modeling import evaluation, translation
from modeling.checkpoints import weights_record
from modeling.evaluation import evaluate_split, evaluation_record, load_scored_model, metrics_filename
from modeling.files import write_json
from modeling.generation_transformer import MODEL_DECODING_FIELDS, set_fairseq_decoding
from modeling.model_card import collect_card_inputs, render_model_card
from modeling.translation import translate


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_evaluate_split_scores_the_split_and_records_decoding_settings(tokenizer, tmp_path):
    pairs = synthetic_pairs(8, seed=3)
    split = Dataset.from_list([{"translation": {"en": en, "de": en}} for en, _ in pairs])
    metrics, hypotheses = evaluate_split(
        EchoModel(), tokenizer, split, source_lang="en", target_lang="de", max_tokens=64
    )

    assert hypotheses == [en for en, _ in pairs]
    assert metrics["sacrebleu"] == pytest.approx(100.0)
    assert metrics["num_beams"] == 4 and metrics["length_penalty"] == 0.6
    assert metrics["num_sentences"] == 8 and (metrics["source_lang"], metrics["target_lang"]) == ("en", "de")
    assert metrics["max_tokens"] == 64, "the batching the hypotheses were translated with"

    path = write_json(tmp_path / "out" / metrics_filename("test"), metrics)
    assert path.name == "eval_results_test.json"
    assert json.loads(path.read_text()) == metrics


def test_a_python_users_evaluation_records_the_weights_a_model_card_checks(tiny_checkpoint, tmp_path):
    """What scripts/evaluate.py writes, from the library: before, only the script recorded the weights scored, and
    a record written from `evaluate_split` alone reached a card whatever the directory held by then."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_checkpoint[0], model_dir)
    model, tokenizer, scored = load_scored_model(str(model_dir))
    assert scored == {"model": str(model_dir), "model_commit": None, "model_weights": weights_record(model_dir)}
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(3, seed=1)])
    metrics, _ = evaluate_split(model, tokenizer, split, source_lang="en", target_lang="de", max_new_tokens=4)
    record = evaluation_record(
        scored, metrics, dataset="synthetic", language_pair=None, split="test", limit=None, sentences_in_split=3
    )
    write_json(tmp_path / "eval" / metrics_filename("test"), record)
    assert len(collect_card_inputs([tmp_path / "eval"], model_dir)["eval_results"]) == 1
    tiny_model(len(tokenizer), seed=5).save_pretrained(model_dir)  # trained again since
    with pytest.raises(ValueError, match=r"eval_results_test\.json scored other weights than .*model holds now"):
        collect_card_inputs([tmp_path / "eval"], model_dir)


@pytest.mark.parametrize("removed", ["while its weights are hashed", "once it is loaded"])
def test_a_checkpoint_removed_while_it_is_loaded_for_scoring_is_named_as_such(tmp_path, monkeypatch, removed):
    """A run still training rotated it out (save_total_limit): before, "[Errno 2] No such file or directory:
    '.../model.safetensors'", or "its weights changed while they were loaded (averaged or converted again
    meanwhile?): evaluate it once they are written", which they never would be."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    save_tiny_checkpoint(checkpoint)

    def rotate_out() -> None:
        if checkpoint.exists():
            checkpoint.rename(checkpoint.with_name(".checkpoint-2.deleting"))

    if removed == "while its weights are hashed":
        file_states = evaluation.file_states
        monkeypatch.setattr(evaluation, "file_states", lambda paths: rotate_out() or file_states(paths))
    else:
        load = evaluation.load_model_and_tokenizer
        monkeypatch.setattr(
            evaluation, "load_model_and_tokenizer", lambda *args, **kwargs: (load(*args, **kwargs), rotate_out())[0]
        )
    with pytest.raises(FileNotFoundError) as refused:
        load_scored_model(str(checkpoint), device="cpu")
    assert str(refused.value) == (
        f"Model directory '{checkpoint}' was removed while it was loaded (by the save_total_limit rotation of a run "
        "still training there?): load it again, or a checkpoint the run keeps."
    )


def test_a_scored_model_is_loaded_onto_the_device_asked_for(tiny_checkpoint):
    # "meta" stands in for a device other than the default one (a GPU machine's user asking for "cpu").
    model, _, _ = load_scored_model(str(tiny_checkpoint[0]), device="meta")
    assert model.device.type == "meta"


def test_an_int8_evaluations_record_is_labelled_so_on_the_card(tokenizer, tmp_path):
    """`--int8` scores the quantised model, not the weights as they load: the card must say so."""
    split = Dataset.from_list([{"translation": {"en": en, "de": en}} for en, _ in synthetic_pairs(3, seed=2)])
    metrics, _ = evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")
    scored = {"model": "tester/echo", "model_commit": None, "model_weights": None}
    where = {"dataset": "synthetic", "language_pair": None, "limit": None, "sentences_in_split": 3}
    write_json(tmp_path / metrics_filename("test"), evaluation_record(scored, metrics, split="test", **where))
    write_json(tmp_path / metrics_filename("dev"), evaluation_record(scored, metrics, split="dev", int8=True, **where))
    results = collect_card_inputs([tmp_path])["eval_results"]
    card = render_model_card(model_name="tiny", repo_id="tester/echo", eval_results=results)
    paragraphs = {p.split("split `")[1].split("`")[0]: p for p in card.text.split("\n\n") if "split `" in p}
    assert "Scored on the model quantised to int8 (`--int8`)" in paragraphs["dev"]
    assert "int8" not in paragraphs["test"]


def test_a_hub_models_record_names_the_commit_loaded_when_the_cache_moved_on(hub_here, tmp_path, monkeypatch):
    """The record read the commit from the cache's branch after loading: another process's load of the repo after a
    push (a shared HF_HOME) moved it on meanwhile, and the record named the next commit and its weights, not those
    scored."""
    from modeling.hub import push_model_dir
    from modeling.hub_client import pinned_commit

    save_tiny_checkpoint(tmp_path / "first")
    save_tiny_checkpoint(tmp_path / "second")
    tiny_translator(len(tiny_tokenizer()), seed=1).save_pretrained(tmp_path / "second")
    push_model_dir(tmp_path / "first", "tester/scored", token=HUB_TOKEN)
    first = HfApi(endpoint=hub_here[0], token=HUB_TOKEN).model_info("tester/scored").sha
    load_weights = translation.AutoModelForSeq2SeqLM.from_pretrained

    def weights_then_another_load_after_a_push(*args, **kwargs):
        weights = load_weights(*args, **kwargs)
        push_model_dir(tmp_path / "second", "tester/scored", token=HUB_TOKEN)
        pinned_commit("tester/scored", None)  # another process starting to load it: the cache's main moves on
        return weights

    monkeypatch.setattr(translation.AutoModelForSeq2SeqLM, "from_pretrained", weights_then_another_load_after_a_push)
    _, _, scored = load_scored_model("tester/scored", device="cpu")
    assert scored["model_commit"] == first
    snapshot = Path(constants.HF_HUB_CACHE) / "models--tester--scored" / "snapshots" / first
    assert scored["model_weights"] == weights_record(snapshot)


def test_a_hub_model_pushed_again_after_its_commit_was_pinned_loads_the_pinned_weights(
    hub_here, tmp_path, monkeypatch
):
    """The record names the commit pinned before loading: the weights loaded must be that commit's, not those of a
    push that came between the pinning and the loading."""
    from modeling.hub import push_model_dir

    save_tiny_checkpoint(tmp_path / "first")
    save_tiny_checkpoint(tmp_path / "second")
    tiny_translator(len(tiny_tokenizer()), seed=1).save_pretrained(tmp_path / "second")
    push_model_dir(tmp_path / "first", "tester/pinned", token=HUB_TOKEN)
    pinned = HfApi(endpoint=hub_here[0], token=HUB_TOKEN).model_info("tester/pinned").sha
    pin = evaluation.pinned_hub_revision

    def pinned_then_pushed_again(*args, **kwargs):
        commit = pin(*args, **kwargs)
        push_model_dir(tmp_path / "second", "tester/pinned", token=HUB_TOKEN)
        return commit

    monkeypatch.setattr(evaluation, "pinned_hub_revision", pinned_then_pushed_again)
    model, _, scored = load_scored_model("tester/pinned", device="cpu")
    first = tiny_translator(len(tiny_tokenizer()))
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), first.state_dict().values(), strict=True)
    )
    assert scored["model_commit"] == pinned


def test_references_the_outputs_can_never_match_are_named(tokenizer, caplog):
    # Decomposed umlauts (NFD): the tokenizer's NFKC composes them, so no hypothesis can hold these references' bytes.
    girl, dogs = unicodedata.normalize("NFD", "ein mädchen läuft ."), unicodedata.normalize("NFD", "zwei hünde .")
    references = ["ein hund .", girl, "eine katze .", dogs]
    split = Dataset.from_list([{"translation": {"en": "a dog .", "de": reference}} for reference in references])
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")
    composed = unicodedata.normalize("NFC", girl)
    first = f"(the first: line 2, {girl!r} becomes {composed!r})"
    assert f"2 of 4 references change under the tokenizer's normalisation {first}" in caplog.text
    caplog.clear()
    # Composed (NFC) umlauts, and no-break spaces (French typography) that NFKC makes spaces: the same words, which
    # every score reads alike.
    references = ["ein mädchen läuft .", "le chat dit\xa0: bonjour\u202f!", "il fait 20\xa0°C ."]
    split = Dataset.from_list([{"translation": {"en": "a dog .", "de": reference}} for reference in references])
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")
    assert caplog.text == ""


def test_tokenised_references_scored_against_detokenised_outputs_are_named(tokenizer, caplog):
    """A test set as fairseq's preparation leaves it (Moses-tokenised, escaped): perfect translations of four sentences
    scored sacreBLEU 66, without a word. A model whose outputs are tokenised alike is scored alike, quietly."""
    pairs = [("er sagte : ja .", "er sagte : ja ."), ('er sagte: "ja".', "er sagte : &quot; ja &quot; .")]
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in pairs])
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")
    assert (
        "1 of 2 references hold the Moses tokeniser's escapes or hyphen marks (the first: line 2, "
        "'er sagte : &quot; ja &quot; .'), which no hypothesis holds" in caplog.text
    )
    caplog.clear()
    references = [de for _, de in pairs]
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        evaluation.warn_of_tokenised_references(["er sagte : &quot; nein &quot; .", "ja ."], references)
    assert caplog.text == ""


def test_a_converted_fairseq_models_decoding_settings_are_recorded(tokenizer):
    model = EchoModel()  # with the generation config that scripts/convert_fairseq.py writes
    set_fairseq_decoding(model.generation_config, pad_token_id=tokenizer.pad_token_id, num_beams=5)
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(2, seed=6)])
    metrics, _ = evaluate_split(model, tokenizer, split, source_lang="en", target_lang="de", max_length_b=10)

    expected = {name: getattr(model.generation_config, name) for name in MODEL_DECODING_FIELDS}
    assert {name: metrics[name] for name in MODEL_DECODING_FIELDS} == expected | {"max_length_b": 10}
    assert metrics["beam_finalization"] == "first" and metrics["forced_eos_keeps_log_prob"] is True
    assert (metrics["num_beams"], metrics["suppress_tokens"], metrics["min_new_tokens"]) == (
        5,
        [tokenizer.pad_token_id],
        1,
    )


def test_an_evaluation_into_a_hypotheses_file_resumes_after_a_kill(tokenizer, tmp_path, monkeypatch):
    pairs = synthetic_pairs(7, seed=4)
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in pairs])
    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    in_memory, expected = evaluate_split(model, tokenizer, split, **settings)
    chunks = []

    def killed_at_the_second_chunk(model, tokenizer, sentences, **kwargs):
        if len(chunks) == 1 and interrupting:
            raise KeyboardInterrupt
        chunks.append(len(sentences))
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation, "translate", killed_at_the_second_chunk)
    hypotheses_file, interrupting = tmp_path / "eval" / "hypotheses_test.de", True
    with pytest.raises(KeyboardInterrupt):
        evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, chunk_lines=3, **settings)
    assert not hypotheses_file.exists() and chunks == [3]

    interrupting = False
    metrics, hypotheses = evaluate_split(
        model, tokenizer, split, hypotheses_file=hypotheses_file, chunk_lines=3, **settings
    )
    assert chunks == [3, 3, 1], "the first chunk is not translated again"
    assert hypotheses == expected and metrics == in_memory
    assert hypotheses_file.read_text().split("\n")[:-1] == expected
    assert sorted(path.name for path in hypotheses_file.parent.iterdir()) == ["hypotheses_test.de"], (
        "nothing hidden left"
    )


def test_a_first_evaluation_into_a_hypotheses_file_warns_of_nothing(tokenizer, tmp_path, caplog):
    """No record of unscored hypotheses is the ordinary case: nothing to say about one."""
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(3, seed=5)])
    model = tiny_translator(len(tokenizer))
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        evaluate_split(model, tokenizer, split, source_lang="en", target_lang="de", hypotheses_file=tmp_path / "h.de")
    assert caplog.text == ""


@pytest.mark.parametrize(
    "workers, hypotheses_is_a_directory, error, message",
    [
        (0, False, ValueError, "workers must be positive, got 0"),
        (1, True, OSError, "cannot write .*hypotheses_test.de: it is a directory"),
    ],
)
def test_a_refused_evaluation_leaves_no_hidden_source_file(
    workers, hypotheses_is_a_directory, error, message, tokenizer, tmp_path
):
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(3, seed=5)])
    hypotheses_file = tmp_path / "hypotheses_test.de"
    if hypotheses_is_a_directory:
        hypotheses_file.mkdir()
    with pytest.raises(error, match=message):
        evaluate_split(
            EchoModel(),
            tokenizer,
            split,
            source_lang="en",
            target_lang="de",
            hypotheses_file=hypotheses_file,
            workers=workers,
        )
    assert [path.name for path in tmp_path.iterdir()] == (["hypotheses_test.de"] if hypotheses_is_a_directory else [])


def test_an_evaluation_whose_hidden_source_another_run_removed_meanwhile_finishes(tokenizer, tmp_path, monkeypatch):
    """Two evaluations into one hypotheses file share its hidden `.NAME.source`: the one that ends first (refused,
    or killed) removes it, and the other one's own removal must not fail its finished translation."""
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(3, seed=2)])
    hypotheses_file = tmp_path / "hypotheses_test.de"

    def another_run_ends(model, tokenizer, sentences, **kwargs):
        (tmp_path / ".hypotheses_test.de.source").unlink()
        return translate(model, tokenizer, sentences, **kwargs)

    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    _, expected = evaluate_split(model, tokenizer, split, **settings)
    monkeypatch.setattr(translation, "translate", another_run_ends)
    _, hypotheses = evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)
    assert hypotheses == expected
    assert [path.name for path in tmp_path.iterdir()] == ["hypotheses_test.de"]


def _evaluate_killed_while_scoring(monkeypatch, model, tokenizer, split, hypotheses_file, settings) -> None:
    """An evaluation into `hypotheses_file` killed after the translating, while scoring."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as scoring:
        scoring.setattr(evaluation, "corpus_scores", interrupted)
        with pytest.raises(KeyboardInterrupt):
            evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)


def test_an_evaluation_killed_while_scoring_scores_the_hypotheses_written_without_translating_again(
    tokenizer, tmp_path, monkeypatch, caplog
):
    """Killed after the last chunk was translated, while scoring: the rerun translated everything again, as
    `translate_file` keeps no record of a translation it finished."""
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(5, seed=8)])
    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    in_memory, expected = evaluate_split(model, tokenizer, split, **settings)
    translated = []

    def counted(model, tokenizer, sentences, **kwargs):
        translated.extend(sentences)
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation, "translate", counted)
    hypotheses_file = tmp_path / "hypotheses_test.de"
    _evaluate_killed_while_scoring(monkeypatch, model, tokenizer, split, hypotheses_file, settings)
    assert len(translated) == 5

    with caplog.at_level(logging.INFO, logger="modeling.evaluation"):
        metrics, hypotheses = evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)
    assert f"Scoring the hypotheses an earlier run translated into {hypotheses_file}, not yet scored" in caplog.text
    assert len(translated) == 5, "translated again"
    assert (metrics, hypotheses) == (in_memory, expected)
    assert [path.name for path in tmp_path.iterdir()] == ["hypotheses_test.de"], "nothing hidden left"
    evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)
    assert len(translated) == 10, "a scored evaluation is not reused"


def test_hypotheses_left_unscored_are_scored_by_a_rerun_with_other_workers_or_a_progress_bar(
    tokenizer, tmp_path, monkeypatch, caplog
):
    """Threads and a progress bar leave the hypotheses as they are: a rerun with them need not translate again."""
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(4, seed=7)])
    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    hypotheses_file = tmp_path / "hypotheses_test.de"
    _evaluate_killed_while_scoring(monkeypatch, model, tokenizer, split, hypotheses_file, settings)
    in_memory, expected = evaluate_split(model, tokenizer, split, **settings)

    with caplog.at_level(logging.INFO, logger="modeling.evaluation"):
        metrics, hypotheses = evaluate_split(
            model, tokenizer, split, hypotheses_file=hypotheses_file, workers=2, progress=True, **settings
        )
    assert f"Scoring the hypotheses an earlier run translated into {hypotheses_file}, not yet scored" in caplog.text
    assert (metrics, hypotheses) == (in_memory, expected)


@pytest.mark.parametrize(
    "rerun, why",
    [
        ("another model", "another model"),
        ("another config", "another config"),
        ("another decoding", "another decoding"),
        ("other sources", "another source_sha256"),
        ("hypotheses edited", "hypotheses_test.de changed since"),
        ("hypotheses removed", "hypotheses_test.de is gone"),
        ("record broken", "its record .hypotheses_test.de.unscored.json is unreadable"),
    ],
)
def test_hypotheses_left_unscored_are_translated_again_for_another_evaluation(
    rerun, why, tokenizer, tmp_path, monkeypatch, caplog
):
    """Only the same weights, config, tokenizer, decoding and sources as the hypotheses left unscored skip the
    translating; the others are translated again with a warning saying why."""
    pairs = synthetic_pairs(4, seed=9)
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in pairs])
    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    hypotheses_file = tmp_path / "hypotheses_test.de"
    _evaluate_killed_while_scoring(monkeypatch, model, tokenizer, split, hypotheses_file, settings)
    if rerun == "another model":
        model = tiny_translator(len(tokenizer), seed=1)
    elif rerun == "another config":
        model = reloaded_with_config(model, tmp_path / "model", scale_embedding=False)
    elif rerun == "another decoding":
        settings["max_new_tokens"] = 2
    elif rerun == "other sources":
        split = Dataset.from_list([{"translation": {"en": de, "de": en}} for en, de in pairs])
    elif rerun == "hypotheses edited":
        hypotheses_file.write_text("edited\n" * 4)
    elif rerun == "hypotheses removed":
        hypotheses_file.unlink()
    else:
        (tmp_path / ".hypotheses_test.de.unscored.json").write_text("[]")
    in_memory, expected = evaluate_split(model, tokenizer, split, **settings)

    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        metrics, hypotheses = evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)
    assert (metrics, hypotheses) == (in_memory, expected)
    assert hypotheses_file.read_text().split("\n")[:-1] == expected
    assert f"as they are ({why}" in caplog.text and "translating again" in caplog.text


def test_every_decoding_setting_is_recorded_under_its_name_a_calls_own_first(tokenizer):
    """A score is reproduced from the settings its metrics record: the model's generation config, where the call
    did not set them otherwise (`max_new_tokens`, the length cap, is the call's here)."""
    model = EchoModel()
    model.generation_config.early_stopping = True
    split = Dataset.from_list([{"translation": {"en": en, "de": en}} for en, _ in synthetic_pairs(2, seed=3)])
    metrics, _ = evaluate_split(model, tokenizer, split, source_lang="en", target_lang="de", max_new_tokens=7)
    assert set(evaluation.DECODING_SETTINGS) <= metrics.keys()
    assert (metrics["early_stopping"], metrics["max_new_tokens"], metrics["num_beams"]) == (True, 7, 4)


def test_a_tokenizer_without_a_fast_backend_is_evaluated_without_the_normalisation_check(tokenizer, caplog):
    """A converted fairseq model's tokenizer (Moses and subword-nmt, no `backend_tokenizer`) has no normaliser whose
    changes to the references could be named: nothing is warned of, and the split is scored."""
    from modeling.fairseq import fairseq_tokenizer, read_fairseq_dictionary

    symbols = read_fairseq_dictionary(FAIRSEQ_FIXTURES / "dict.en.txt")
    slow = fairseq_tokenizer(symbols, source_lang="en", target_lang="de", bpe_codes=FAIRSEQ_FIXTURES / "bpecodes")
    assert getattr(slow, "backend_tokenizer", None) is None
    references = [unicodedata.normalize("NFD", "ein mädchen läuft ."), "ein hund ."]
    split = Dataset.from_list([{"translation": {"en": "a dog .", "de": reference}} for reference in references])
    with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
        metrics, hypotheses = evaluate_split(EchoModel(), slow, split, source_lang="en", target_lang="de")
    assert len(hypotheses) == 2 and metrics["num_sentences"] == 2
    assert caplog.text == ""


def test_a_relative_directory_named_like_a_hub_id_is_loaded_from_disk(tiny_checkpoint, tmp_path, monkeypatch):
    """`--model runs/averaged` run beside the directory: it exists, so it is the directory, never pinned as the Hub
    repo id it also reads as, and the record names its weights."""
    shutil.copytree(tiny_checkpoint[0], tmp_path / "runs" / "averaged")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluation, "pinned_hub_revision", lambda *args: pytest.fail(f"pinned as a Hub id: {args}"))
    _, _, scored = load_scored_model("runs/averaged")
    assert scored == {"model": "runs/averaged", "model_commit": None, "model_weights": weights_record("runs/averaged")}


def test_a_hub_datasets_record_names_its_configuration_for_the_cards_model_index(tokenizer):
    """`--dataset wmt14 --language-pair de-en`: the model-index entry names the dataset's configuration ("de-en"),
    its split and commit, so that the Hub links the score to the very test set."""
    from modeling.model_card import _eval_results_metadata

    split = Dataset.from_list([{"translation": {"en": en, "de": en}} for en, _ in synthetic_pairs(2, seed=4)])
    metrics, _ = evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")
    scored = {"model": "tester/echo", "model_commit": None, "model_weights": None}
    where = {"dataset": "wmt14", "language_pair": "de-en", "split": "test", "dataset_commit": "0" * 40}
    record = evaluation_record(scored, metrics, limit=None, sentences_in_split=2, **where)
    assert {key: record[key] for key in where} == where
    [entry, *_] = _eval_results_metadata([record], None)
    assert (entry.dataset_type, entry.dataset_config, entry.dataset_split) == ("wmt14", "de-en", "test")
    assert entry.dataset_revision == "0" * 40


def test_a_metrics_file_holding_no_json_object_is_replaced_without_a_warning(tmp_path, caplog):
    """A file of another tool (a JSON list, a number) where the scores go: nothing of it to compare, and no crash
    before the evaluation writes its own."""
    scored = {"model": "tester/echo", "model_commit": None, "model_weights": None}
    for content in ("[1, 2]", "3", '"text"'):
        (tmp_path / metrics_filename("test")).write_text(content)
        with caplog.at_level(logging.WARNING, logger="modeling.evaluation"):
            evaluation.warn_of_replaced_scores(tmp_path / metrics_filename("test"), scored)
    assert caplog.text == ""


def test_an_evaluation_whose_record_another_run_removed_while_it_scored_finishes(tokenizer, tmp_path, monkeypatch):
    """Two evaluations into one hypotheses file share its `.NAME.unscored.json`: the one that scores first removes
    it, and the other one's own removal must not fail its finished scoring."""
    split = Dataset.from_list([{"translation": {"en": en, "de": de}} for en, de in synthetic_pairs(3, seed=2)])
    hypotheses_file = tmp_path / "hypotheses_test.de"
    score = evaluation.corpus_scores

    def another_run_scored_first(*args, **kwargs):
        (tmp_path / ".hypotheses_test.de.unscored.json").unlink()
        return score(*args, **kwargs)

    model, settings = tiny_translator(len(tokenizer)), {"source_lang": "en", "target_lang": "de", "num_beams": 2}
    in_memory, expected = evaluate_split(model, tokenizer, split, **settings)
    monkeypatch.setattr(evaluation, "corpus_scores", another_run_scored_first)
    metrics, hypotheses = evaluate_split(model, tokenizer, split, hypotheses_file=hypotheses_file, **settings)
    assert (metrics, hypotheses) == (in_memory, expected)
    assert [path.name for path in tmp_path.iterdir()] == ["hypotheses_test.de"]
