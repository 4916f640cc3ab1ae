"""Tests of modeling/hub.py: what a push refuses, the push at the end of training, and the card it carries."""

import json
import logging
import os
import re
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch
from helpers import (
    HUB_TOKEN,
    closed_port_endpoint,
    save_tiny_checkpoint,
    stalled_endpoint,
    synthetic_pairs,
    tiny_translator,
)
from huggingface_hub import metadata_load

import modeling.hub as hub_module
from modeling import TransformerForConditionalGeneration
from modeling.arguments import TranslationTrainingArguments
from modeling.checkpoints import CURVES_FILE, VOCABULARY_FILES
from modeling.export import to_ctranslate2
from modeling.files import write_json
from modeling.hub import (
    HubTarget,
    MissingHubTokenError,
    check_model_dir,
    prepare_push,
    push_model_dir,
    push_trained_model,
    verify_model_files,
)
from modeling.hub_client import HUB_TIMEOUT_ENV, HubError
from modeling.scoring import corpus_scores
from modeling.translation import load_model_and_tokenizer


def test_check_model_dir_refuses_a_directory_without_remote_code(tmp_path):
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "modeling_transformer.py").unlink()
    with pytest.raises(FileNotFoundError, match="modeling_transformer.py"):
        check_model_dir(tmp_path)


def test_check_model_dir_names_a_directory_that_is_not_there_or_is_a_file(tmp_path):
    """A mistyped --model, or the weights file given for its directory: named as such, not as a directory that lacks
    every file; a path given as a string is read as the Path is."""
    with pytest.raises(FileNotFoundError, match=r"^Model directory .*nowhere does not exist\.$"):
        check_model_dir(str(tmp_path / "nowhere"))
    save_tiny_checkpoint(tmp_path)
    with pytest.raises(NotADirectoryError, match=r"model\.safetensors is a file: give the directory that holds it"):
        check_model_dir(tmp_path / "model.safetensors")
    assert check_model_dir(str(tmp_path)) == tmp_path


@pytest.mark.parametrize(
    "removed, expected",
    [
        ("model.safetensors", r"lacks \*\.safetensors\."),  # no weights at all: a repo nothing can load
        ("tokenizer_config.json", r"lacks tokenizer_config\.json\."),
    ],
)
def test_check_model_dir_names_the_file_a_directory_lacks(tmp_path, removed, expected):
    save_tiny_checkpoint(tmp_path)
    (tmp_path / removed).unlink()
    with pytest.raises(FileNotFoundError, match=expected):
        check_model_dir(tmp_path)


def test_a_run_directory_without_its_final_model_yet_names_its_newest_checkpoint(tmp_path):
    """A push of `runs/x` while x trains (its config.json and weights come at its end): before, "Save the model with
    `import modeling` done first ...", advice about another case."""
    run = tmp_path / "x"
    save_tiny_checkpoint(run / "checkpoint-8")
    save_tiny_checkpoint(run / "checkpoint-10")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # written into output_dir as training starts
        (run / name).write_bytes((run / "checkpoint-10" / name).read_bytes())
    with pytest.raises(FileNotFoundError) as refused:
        check_model_dir(run)
    assert str(refused.value) == (
        f"{run} lacks config.json, generation_config.json, configuration_transformer.py, modeling_transformer.py, "
        f"*.safetensors: a training run's directory, its final model not saved yet. Push one of its checkpoints "
        f"({run / 'checkpoint-10'}), or the directory once the run has ended."
    )


def test_check_model_dir_refuses_a_config_without_auto_map(tmp_path):
    """Saved without `import modeling`: the repo's config names no remote code, which a user without this package
    needs to load it."""
    save_tiny_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    write_json(tmp_path / "config.json", {key: value for key, value in config.items() if key != "auto_map"})
    with pytest.raises(ValueError, match=r"config\.json has no auto_map: save the model with `import modeling` done"):
        check_model_dir(tmp_path)


def test_check_model_dir_requires_the_siblings_the_remote_code_imports(tmp_path):
    save_tiny_checkpoint(tmp_path)
    check_model_dir(tmp_path)
    (tmp_path / "cache_transformer.py").unlink()
    expected = r"lacks cache_transformer\.py \(imported by generation_transformer\.py\)"
    with pytest.raises(FileNotFoundError, match=expected):
        check_model_dir(tmp_path)
    # Code that imports no such sibling (a model saved by an older release of this project) needs none.
    generation = tmp_path / "generation_transformer.py"
    code = generation.read_text(encoding="utf-8")
    generation.write_text(code.replace("from .cache_transformer import", "from cache_transformer_gone import"))
    check_model_dir(tmp_path)


def test_check_model_dir_reads_the_remote_code_as_utf8_whatever_the_locale_encoding(tmp_path, ascii_locale):
    """The remote code holds non-ASCII text (its docstrings): a push from a job whose locale encoding is ASCII reads
    it for the siblings it imports rather than failing in UnicodeDecodeError."""
    save_tiny_checkpoint(tmp_path)
    code = tmp_path / "modeling_transformer.py"
    code.write_text(code.read_text(encoding="utf-8") + "# Vaswani et al. — “Attention”\n", encoding="utf-8")
    check_model_dir(tmp_path)


def test_check_model_dir_names_an_export_directory_and_its_model(tmp_path):
    save_tiny_checkpoint(tmp_path / "model")
    to_ctranslate2(*load_model_and_tokenizer(str(tmp_path / "model")), tmp_path / "ct2")
    with pytest.raises(
        ValueError, match=r"is an export for ctranslate2 \(export\.json\), not a model saved with"
    ) as error:
        check_model_dir(tmp_path / "ct2")
    assert str(error.value).endswith(f"exported from ({tmp_path / 'model'}).")


REPO_ID = "user/tiny"


def test_a_repo_name_without_namespace_gets_the_token_owners(tmp_path, monkeypatch):
    """The Trainer's default repo name (output_dir's) has no namespace; the card must name the repo in full."""
    from huggingface_hub import HfApi

    tokens, created = [], []
    monkeypatch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: tokens.append(self.token) or {"name": "me"})
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: created.append(repo_id))
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path / "en-de"), push_to_hub=True, hub_token=HUB_TOKEN, report_to="none", use_cpu=True
    )
    assert prepare_push(args) == HubTarget("me/en-de", HUB_TOKEN) and tokens == [HUB_TOKEN]
    assert HUB_TOKEN not in repr(prepare_push(args))
    args.hub_model_id = "org/name"
    assert prepare_push(args).repo_id == "org/name" and len(tokens) == 2, "a full repo id is taken as given"
    assert created == ["me/en-de", "me/en-de", "org/name"], "the repo is created before training"
    args.hub_model_id = "not a/valid/name"
    with pytest.raises(ValueError, match="not a/valid/name"):
        prepare_push(args)


def test_the_push_at_the_end_of_training_is_prepared_again_by_a_rerun(hub_here, tmp_path, caplog):
    """A requeued or resumed run prepares its push into the repo its first launch created; checkpoints are not
    pushed whatever hub_strategy says, and a revision is refused before training rather than ignored."""

    def push_args(**kwargs) -> TranslationTrainingArguments:
        return TranslationTrainingArguments(
            output_dir=str(tmp_path / "run"),
            push_to_hub=True,
            hub_token=HUB_TOKEN,
            hub_model_id="tester/rerun",
            report_to="none",
            use_cpu=True,
            **kwargs,
        )

    with caplog.at_level(logging.WARNING, logger="modeling.hub"):
        assert prepare_push(push_args()) == prepare_push(push_args()) == HubTarget("tester/rerun", HUB_TOKEN)
        assert "hub_strategy" not in caplog.text, "the default, every_save, pushes nothing else here either"
        prepare_push(push_args(hub_strategy="checkpoint"))
        prepare_push(push_args(hub_strategy="all_checkpoints"))
    assert "hub_strategy=checkpoint is not used: checkpoints are not pushed." in caplog.text
    assert "hub_strategy=all_checkpoints is not used: checkpoints are not pushed." in caplog.text
    with pytest.raises(ValueError, match="--hub_revision is not supported"):
        prepare_push(push_args(hub_revision="v2"))


def eval_json(path: Path, sacrebleu: float) -> Path:
    references = [de for _, de in synthetic_pairs(5, seed=4)]
    scores = corpus_scores(references, references, "de") | {"sacrebleu": sacrebleu}
    record = {"split": "test", "dataset": "synthetic", "source_lang": "en", "target_lang": "de", **scores}
    return write_json(path, record)


def test_card_has_model_index_bleu_of_the_pushed_weights_only(tmp_path, monkeypatch, caplog):
    """Evaluation JSONs of the pushed directory newer than its weights reach model-index; older ones (an earlier
    model in the same output_dir) and those of the final model when the averaged one is pushed do not."""
    run = tmp_path / "run"
    model_dir = run / "averaged"
    save_tiny_checkpoint(model_dir)
    write_json(run / "data_stats.json", {"language_pair": "en-de", "sentence_pairs": {"train": 40}})
    weights_time = (model_dir / "model.safetensors").stat().st_mtime
    stale = eval_json(model_dir / "eval" / "eval_results_valid.json", 11.11)
    os.utime(stale, (weights_time - 60, weights_time - 60))
    eval_json(run / "eval_results_test.json", 22.22)  # the final model's, not the averaged one's
    fresh = eval_json(model_dir / "eval" / "eval_results_test.json", 33.33)
    os.utime(fresh, (weights_time, weights_time))  # written within the same tick as the weights: theirs
    pushed = []
    monkeypatch.setattr(
        hub_module,
        "push_model_dir",
        lambda *args, **kwargs: pushed.append((*args, kwargs["token"], kwargs["private"])) or "url",
    )

    with caplog.at_level(logging.WARNING, logger="modeling.hub"):
        url = push_trained_model(HubTarget(REPO_ID, HUB_TOKEN), model_dir, run, "the averaged model", private=None)
    # the token checked before training; private=None (the Trainer's default): public
    assert pushed == [(model_dir, REPO_ID, HUB_TOKEN, False)] and url == "url"
    assert "| sentence_pairs.train | 40 |" in (model_dir / "README.md").read_text(), "the run's records, staged"
    values = [
        metric["value"]
        for entry in metadata_load(model_dir / "README.md")["model-index"]
        for result in entry["results"]
        for metric in result["metrics"]
        if metric["name"] == "sacreBLEU"
    ]
    assert values == [33.33]
    assert "eval_results_valid.json" in caplog.text, "the stale result is named in a warning"


def test_the_push_at_the_end_of_training_refuses_a_broken_model_before_writing_its_card(tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    save_tiny_checkpoint(model_dir)
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    monkeypatch.setattr(hub_module, "push_model_dir", lambda *args, **kwargs: pytest.fail("nothing may be pushed"))
    with pytest.raises(ValueError, match=r"model\.safetensors is truncated"):
        push_trained_model(HubTarget(REPO_ID, HUB_TOKEN), model_dir, model_dir, "the final model", private=None)
    assert not (model_dir / "README.md").exists()


def test_a_failed_push_at_the_end_of_training_says_how_to_retry_it(tmp_path, monkeypatch, caplog):
    """Hours of training are saved: the error raised, and the log says which command pushes them."""
    model_dir = tmp_path / "run"
    save_tiny_checkpoint(model_dir)

    def hub_down(*args, **kwargs):
        raise HubError("POST http://hub/api/repos/create: cannot connect")

    monkeypatch.setattr(hub_module, "push_model_dir", hub_down)
    with pytest.raises(HubError, match="cannot connect"):
        push_trained_model(HubTarget(REPO_ID, HUB_TOKEN), model_dir, model_dir, "the final model", private=None)
    assert f"Retry with: python scripts/push_to_hub.py --model {model_dir} --repo-id {REPO_ID}" in caplog.text
    assert (model_dir / "README.md").is_file(), "the card is kept for the retry"


def test_a_truncated_weights_file_is_refused_before_any_upload(tmp_path):
    save_tiny_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model\.safetensors is truncated .* refusing to push it"):
        check_model_dir(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"num_beams": 4,')
    with pytest.raises(ValueError, match=r"generation_config\.json does not parse"):
        check_model_dir(tmp_path)


def test_a_tokenizer_config_that_does_not_parse_is_named(tmp_path):
    """Its auto_map is read before every JSON is parsed: the file cut short is named as any other JSON."""
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"auto_map": ')
    with pytest.raises(ValueError, match=r"tokenizer_config\.json does not parse .*refusing to push it"):
        check_model_dir(tmp_path)


def test_push_model_dir_checks_the_directory_before_any_request(tmp_path, monkeypatch):
    save_tiny_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    monkeypatch.setattr(hub_module, "HfApi", lambda *args, **kwargs: pytest.fail("nothing may be pushed"))
    with pytest.raises(ValueError, match=r"model\.safetensors is truncated"):
        push_model_dir(tmp_path, REPO_ID, token=HUB_TOKEN)


def test_weights_of_a_diverged_run_are_refused_before_any_upload(tmp_path):
    model, _ = save_tiny_checkpoint(tmp_path)
    check_model_dir(tmp_path)
    with torch.no_grad():
        model.model.encoder.layers[0].ffn.fc1.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError) as refused:
        check_model_dir(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path / 'model.safetensors'}: model.encoder.layers.0.ffn.fc1.weight holds NaN or infinite values "
        "(its run had diverged): refusing to push it."
    )


def test_a_stalled_hub_fails_within_the_timeout_in_one_line(tiny_checkpoint, quick_hub):
    model_dir = tiny_checkpoint[0]
    with stalled_endpoint() as endpoint:
        quick_hub(endpoint)
        start = time.monotonic()
        with pytest.raises(HubError) as error:
            push_model_dir(model_dir, REPO_ID, token=HUB_TOKEN)
        elapsed = time.monotonic() - start
    message = str(error.value)
    assert message.startswith(f"POST {endpoint}/api/repos/create: no answer within 0.3 s (2 attempts)")
    assert HUB_TIMEOUT_ENV in message and "\n" not in message and isinstance(error.value, OSError)
    # Two attempts of 0.3 s, a 0.1 s pause, and huggingface_hub's own one-off telemetry fetch (3 s timeout), where
    # its default client would have waited forever.
    assert elapsed < 6, elapsed


def test_a_refused_connection_names_the_url(tiny_checkpoint, quick_hub):
    endpoint = closed_port_endpoint()
    quick_hub(endpoint)
    with pytest.raises(HubError, match=rf"^POST {endpoint}/api/repos/create: cannot connect \(.*\) \(2 attempts\)$"):
        push_model_dir(tiny_checkpoint[0], REPO_ID, token=HUB_TOKEN)


def test_check_model_dir_refuses_a_tokenizer_that_does_not_load(tmp_path):
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ValueError) as error:
        check_model_dir(tmp_path)
    # it also said "tokenizer.model is missing": a sentencepiece model, which this tokenizer neither has nor needs
    assert (
        str(error.value)
        == f"{tmp_path}: its tokenizer cannot be loaded: tokenizer.json is missing. Save the tokenizer again."
    )


def test_check_model_dir_refuses_a_tokenizer_of_another_model(tmp_path):
    from helpers import tiny_translator

    save_tiny_checkpoint(tmp_path)
    tiny_translator(304).save_pretrained(tmp_path)  # 96 tokens against a vocabulary of 304: wrong ids, no error
    check_model_dir(tmp_path)
    tiny_translator(50).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"tokenizer has 96 tokens, more than config\.json's vocab_size 50"):
        check_model_dir(tmp_path)


@pytest.mark.parametrize(
    "removed, expected",
    [
        ("tokenization_fairseq.py", r"lacks tokenization_fairseq\.py \(named by tokenizer_config\.json's auto_map\)"),
        ("vocab-tgt.json", r"tokenizer cannot be loaded: vocab-tgt\.json is missing"),
    ],
)
def test_check_model_dir_refuses_a_converted_model_without_its_tokenizer_files(
    converted_fairseq_dir, tmp_path, removed, expected
):
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(converted_fairseq_dir, model_dir)
    check_model_dir(model_dir)
    (model_dir / removed).unlink()
    with pytest.raises((OSError, ValueError), match=expected):
        check_model_dir(model_dir)


def test_check_model_dir_loads_the_tokenizer_with_the_code_the_repo_serves(converted_fairseq_dir, tmp_path):
    """This package registers its own fairseq tokenizer: loaded without the directory's code, a copy that does not
    import passed the check, and the repo's users would have met the error."""
    import shutil

    model_dir = shutil.copytree(converted_fairseq_dir, tmp_path / "model")
    code = model_dir / "tokenization_fairseq.py"
    code.write_text(code.read_text(encoding="utf-8") + '\nraise ImportError("an older release\'s code")\n')
    with pytest.raises(ValueError, match=r"its tokenizer cannot be loaded: an older release's code\."):
        check_model_dir(model_dir)


def test_check_model_dir_names_a_missing_shard(tmp_path):
    model, _ = save_tiny_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    check_model_dir(tmp_path)
    shards[-1].unlink()
    with pytest.raises(FileNotFoundError, match=rf"lacks {shards[-1].name} \(named by model\.safetensors\.index"):
        check_model_dir(tmp_path)
    write_json(tmp_path / "model.safetensors.index.json", {"metadata": {}})  # edited: no weight_map
    with pytest.raises(ValueError, match=r"index\.json has no weight_map of tensor names to shard files"):
        check_model_dir(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "model-00001')  # cut short
    with pytest.raises(ValueError, match=r"index\.json does not parse \(Unterminated string .*\): refusing"):
        check_model_dir(tmp_path)


def test_check_model_dir_refuses_the_weights_of_two_saves(tmp_path):
    """Saved sharded over a single file: save_pretrained deletes earlier shards only, and from_pretrained loads
    model.safetensors first, so the pushed repo served the earlier weights."""
    save_tiny_checkpoint(tmp_path)
    tiny_translator(96, seed=1).save_pretrained(tmp_path, max_shard_size="20KB")
    with pytest.raises(ValueError) as error:
        check_model_dir(tmp_path)
    assert str(error.value) == (
        f"{tmp_path} holds both model.safetensors and model.safetensors.index.json: the weights of two saves, of "
        "which from_pretrained loads model.safetensors only. Delete the earlier save's weights (the newer file is "
        "model.safetensors.index.json), then push again."
    )
    later = (tmp_path / "model.safetensors.index.json").stat().st_mtime + 60
    os.utime(tmp_path / "model.safetensors", (later, later))  # the single file saved last: it is named the newer
    with pytest.raises(ValueError, match=r"\(the newer file is model\.safetensors\)"):
        check_model_dir(tmp_path)


def test_a_text_file_that_is_not_utf8_is_scanned_for_the_token(tmp_path, monkeypatch):
    """The token is ASCII: its bytes are found in a file of any ASCII-compatible encoding, which is not ours to
    require of a user's notes."""
    save_tiny_checkpoint(tmp_path)
    monkeypatch.setattr(hub_module, "HfApi", lambda *args, **kwargs: pytest.fail("nothing may be pushed"))
    (tmp_path / "NOTES.txt").write_bytes(b"caf\xe9 " + HUB_TOKEN.encode())
    with pytest.raises(ValueError, match=r"NOTES\.txt contains the Hugging Face token"):
        push_model_dir(tmp_path, REPO_ID, token=HUB_TOKEN)


@pytest.mark.parametrize("name", ["README.md", "example.py", "notes.json"])
def test_the_token_in_a_card_code_or_json_file_is_refused(tmp_path, monkeypatch, name):
    """A card, code or JSON file that a push would publish, holding the token (pasted into an example, or a record
    of the run's arguments), is refused before any request."""
    save_tiny_checkpoint(tmp_path)
    monkeypatch.setattr(hub_module, "HfApi", lambda *args, **kwargs: pytest.fail("nothing may be pushed"))
    (tmp_path / name).write_text(json.dumps({"hub_token": HUB_TOKEN}), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{re.escape(name)} contains the Hugging Face token"):
        push_model_dir(tmp_path, REPO_ID, token=HUB_TOKEN)


def test_the_test_hub_writes_times_as_huggingface_hub_reads_them(hub):
    """`model_info` (which `Trainer.push_to_hub` calls) parses the Hub's times: the loopback Hub must write them
    the Hub's way for a plain transformers push to be tested against it."""
    from huggingface_hub import HfApi

    endpoint, _ = hub
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo("user/times")
    assert api.model_info("user/times").last_modified is not None


def test_a_push_deletes_the_files_of_the_repos_previous_model(hub_here, tmp_path, converted_fairseq_dir, caplog):
    """A repo holding a converted fairseq model (one model.safetensors, its conversion record and tokenizer files),
    then a sharded native model pushed into it: before, the old model.safetensors stayed beside the new index, and
    `from_pretrained` loaded it, the old weights, without a word. A user's own files (a licence, pages, figures,
    notes, code) and subfolders stay."""
    from huggingface_hub import HfApi

    endpoint, root = hub_here
    repo_id = "tester/replaced"
    push_model_dir(converted_fairseq_dir, repo_id, token=HUB_TOKEN)
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.upload_file(path_or_fileobj=b"a user's export", path_in_repo="onnx/model.json", repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"Apache-2.0", path_in_repo="LICENSE", repo_id=repo_id)
    for page_or_figure in ("USAGE.md", "bleu_by_length.png", "requirements.txt", "example.py", "training_curves.png"):
        api.upload_file(path_or_fileobj=b"a user's own", path_in_repo=page_or_figure, repo_id=repo_id)
    model_dir = tmp_path / "model"
    model, _ = save_tiny_checkpoint(model_dir)
    (model_dir / "model.safetensors").unlink()
    model.save_pretrained(model_dir, max_shard_size="20KB")
    stored = root / repo_id
    users_own = {"LICENSE", "USAGE.md", "bleu_by_length.png", "requirements.txt", "example.py"}
    previous = {path.name for path in stored.iterdir() if path.is_file()} - users_own
    assert not api.model_info(repo_id).private, "public unless asked"

    with caplog.at_level(logging.WARNING, logger="modeling.hub"):
        push_model_dir(model_dir, repo_id, token=HUB_TOKEN)
    deleted = sorted(previous - {path.name for path in model_dir.iterdir()})
    assert "model.safetensors" in deleted
    assert [record.getMessage() for record in caplog.records if record.name == "modeling.hub"] == [
        f"Deleting from {repo_id} the files of its previous model that this push does not replace: "
        + ", ".join(deleted)
    ], "those, and none of those the push replaces"
    assert {path.name for path in stored.iterdir() if path.is_file()} == {
        path.name for path in model_dir.iterdir()
    } | users_own
    assert (stored / "onnx" / "model.json").is_file()
    assert not (stored / "training_curves.png").exists(), "the previous model's curves, which the card manages"
    loaded = TransformerForConditionalGeneration.from_pretrained(stored)  # what `from_pretrained(repo_id)` reads
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


def test_a_push_without_a_token_argument_takes_hf_token_and_without_any_token_is_refused(
    hub_here, tmp_path, monkeypatch
):
    """`scripts/push_to_hub.py` without --token: HF_TOKEN (or `hf auth login`'s); none at all is refused before any
    request, naming the ways to give one."""
    from huggingface_hub import constants

    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_saved_token"))
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    assert push_model_dir(model_dir, "tester/from-env").endswith("tester/from-env")
    assert (hub_here[1] / "tester/from-env" / "model.safetensors").is_file()
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(MissingHubTokenError, match="^No Hugging Face token found: set the HF_TOKEN environment"):
        push_model_dir(model_dir, "tester/no-token")
    assert not (hub_here[1] / "tester/no-token").exists()


def test_curves_the_card_does_not_show_are_left_out_of_the_push(hub_here, tmp_path):
    """training_curves.png beside a card that does not show it is an earlier card's (or the user's): not uploaded;
    beside a card that shows it, uploaded."""
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    (model_dir / "training_curves.png").write_bytes(b"\x89PNG curves")
    (model_dir / "README.md").write_text("# A model\n\nNo curves here.\n", encoding="utf-8")
    stored = hub_here[1] / "tester/curves"
    push_model_dir(model_dir, "tester/curves", token=HUB_TOKEN)
    assert (stored / "README.md").is_file() and not (stored / "training_curves.png").exists()
    (model_dir / "README.md").write_text("# A model\n\n![curves](training_curves.png)\n", encoding="utf-8")
    push_model_dir(model_dir, "tester/curves", token=HUB_TOKEN)
    assert (stored / "training_curves.png").read_bytes() == b"\x89PNG curves"
    # A card that no longer shows them: the repo's copy, an earlier card's, is deleted with the push.
    (model_dir / "README.md").write_text("# A model\n\nNo curves here.\n", encoding="utf-8")
    push_model_dir(model_dir, "tester/curves", token=HUB_TOKEN)
    assert not (stored / "training_curves.png").exists()


def test_a_checkpoint_removed_while_it_is_pushed_is_named_and_the_repo_left_as_it_was(hub_here, tmp_path, monkeypatch):
    """A run still training rotated it out (save_total_limit) once it was checked: before, "Provided path:
    '.../checkpoint-4' is not a directory"."""
    first, checkpoint = tmp_path / "run" / "checkpoint-2", tmp_path / "run" / "checkpoint-4"
    save_tiny_checkpoint(first)
    save_tiny_checkpoint(checkpoint)
    push_model_dir(first, "tester/rotated", token=HUB_TOKEN)
    stored = hub_here[1] / "tester/rotated"
    before = {path.name: path.read_bytes() for path in stored.iterdir()}
    stale_repo_files = hub_module._stale_repo_files

    def rotated_out_once_checked(*args):
        os.replace(checkpoint, checkpoint.with_name(".checkpoint-4.deleting"))
        return stale_repo_files(*args)

    monkeypatch.setattr(hub_module, "_stale_repo_files", rotated_out_once_checked)
    with pytest.raises(FileNotFoundError) as refused:
        push_model_dir(checkpoint, "tester/rotated", token=HUB_TOKEN)
    assert str(refused.value) == (
        f"{checkpoint} was removed while it was pushed (by the save_total_limit rotation of a run still training "
        "there?): the repo is unchanged; push a checkpoint the run keeps, or a copy."
    )
    assert {path.name: path.read_bytes() for path in stored.iterdir()} == before


def test_a_private_push_creates_its_repo_private_before_training(hub_here, tmp_path):
    """The repo made before training is the one the push at the end goes to (`exist_ok`): made public, it would
    publish a run asked to be private."""
    from huggingface_hub import HfApi

    args = TranslationTrainingArguments(
        output_dir=str(tmp_path / "run"),
        push_to_hub=True,
        hub_token=HUB_TOKEN,
        hub_model_id="tester/private-run",
        hub_private_repo=True,
        report_to="none",
        use_cpu=True,
    )
    prepare_push(args)
    assert HfApi(endpoint=hub_here[0], token=HUB_TOKEN).model_info("tester/private-run").private


def test_an_earlier_models_sentencepiece_model_is_deleted_by_a_push(hub_here, tmp_path):
    """A `.model` file (a SentencePiece tokenizer's) is a model file: an earlier model's, left beside the new one,
    would describe another tokenizer. A user's notes stay."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    api.create_repo("tester/spm")
    for name in ("sentencepiece.bpe.model", "notes.txt"):
        api.upload_file(path_or_fileobj=b"earlier", path_in_repo=name, repo_id="tester/spm")
    save_tiny_checkpoint(tmp_path / "model")
    push_model_dir(tmp_path / "model", "tester/spm", token=HUB_TOKEN)
    stored = hub_here[1] / "tester/spm"
    assert not (stored / "sentencepiece.bpe.model").exists() and (stored / "notes.txt").is_file()


def test_the_tokenizer_code_auto_map_names_is_required_one_reference_or_several(tmp_path):
    """tokenizer_config.json's auto_map may name one module ("module.Class") or a list; code in another repo
    ("owner/repo--module.Class") is that repo's to serve."""
    config = tmp_path / "tokenizer_config.json"
    write_json(config, {"auto_map": {"AutoTokenizer": "tokenization_mine.MyTokenizer"}})
    assert hub_module._missing_tokenizer_code(tmp_path) == [
        "tokenization_mine.py (named by tokenizer_config.json's auto_map)"
    ]
    (tmp_path / "tokenization_mine.py").write_text("", encoding="utf-8")
    assert hub_module._missing_tokenizer_code(tmp_path) == []
    write_json(config, {"auto_map": {"AutoTokenizer": ["owner/repo--tokenization_theirs.Theirs", None]}})
    assert hub_module._missing_tokenizer_code(tmp_path) == []


def test_weights_that_safetensors_cannot_read_are_refused_though_their_header_adds_up(tmp_path):
    """A header whose offsets end at the file's end passes the size check; safetensors still refuses a tensor whose
    offsets do not hold its shape."""
    header = json.dumps({"weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(ValueError, match=r": model\.safetensors cannot be read \(.+\): refusing to push it\."):
        verify_model_files(tmp_path)
    with pytest.raises(ValueError, match=r": model\.safetensors cannot be read"):
        verify_model_files(str(tmp_path))  # a path from the command line: read as the Path is


def test_a_push_uploads_every_vocabulary_file_a_tokenizer_saves(hub_here, tmp_path):
    """A MarianMT model fine-tuned here keeps its MarianTokenizer, saved as source.spm and target.spm beside
    vocab.json: left out of the upload (no pattern took `.spm`), the repo's tokenizer did not load, though the
    directory's did. Every vocabulary file that a push deletes from a repo as a model file it also uploads."""
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    for name in VOCABULARY_FILES:
        if not (model_dir / name).exists():
            (model_dir / name).write_text("{}" if name.endswith(".json") else "vocabulary", encoding="utf-8")
    push_model_dir(model_dir, "tester/vocabularies", token=HUB_TOKEN)
    stored = hub_here[1] / "tester/vocabularies"
    assert [name for name in VOCABULARY_FILES if not (stored / name).is_file()] == []


def test_every_kind_of_file_a_push_deletes_as_the_models_it_also_uploads():
    """The kinds a push uploads (`UPLOAD_PATTERNS`) and those it deletes from the repo as an earlier model's
    (`_is_model_file`) are two lists: drifted apart, a push deleted a repo's source.spm and uploaded none."""
    names = [*VOCABULARY_FILES, *hub_module.REMOTE_CODE_MODULES, CURVES_FILE, "model.safetensors", "config.json"]
    assert all(hub_module._is_model_file(name) for name in names)
    assert [name for name in names if not any(fnmatch(name, kind) for kind in hub_module.UPLOAD_PATTERNS)] == []


def test_a_push_uploads_neither_pickles_nor_subdirectories(hub_here, tmp_path):
    """An output_dir pushed as it is holds the Trainer's pickles and its checkpoints: none of them is the model the
    repo serves, and a checkpoint's optimizer state is large."""
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    # The Trainer's pickled arguments hold hub_token: not uploaded, so not refused for it either.
    (model_dir / "training_args.bin").write_bytes(b"a pickle of " + HUB_TOKEN.encode())
    (model_dir / "checkpoint-2").mkdir()
    (model_dir / "checkpoint-2" / "config.json").write_text((model_dir / "config.json").read_text())
    (model_dir / "checkpoint-2" / "optimizer.pt").write_bytes(b"a pickle")
    push_model_dir(model_dir, "tester/pickles", token=HUB_TOKEN)
    stored = hub_here[1] / "tester/pickles"
    assert not (stored / "training_args.bin").exists() and not (stored / "checkpoint-2").exists()
    assert (stored / "model.safetensors").is_file()


def test_a_private_push_makes_a_private_repo(hub_here, tmp_path):
    """`scripts/push_to_hub.py --private`: a repo the push creates is private, one it creates without is public."""
    from huggingface_hub import HfApi

    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    push_model_dir(model_dir, "tester/private-push", token=HUB_TOKEN, private=True)
    push_model_dir(model_dir, "tester/public-push", token=HUB_TOKEN)
    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    assert api.model_info("tester/private-push").private and not api.model_info("tester/public-push").private


def test_nothing_is_asked_of_the_hub_without_push_to_hub_or_off_the_main_process(tmp_path, monkeypatch):
    """Without push_to_hub there is no push; with it, only the main process pushes: the others neither need a token
    nor create the repo (each asking the Hub at once, before training)."""
    monkeypatch.setattr(hub_module, "resolve_token", lambda *args: pytest.fail("no token may be asked for"))
    args = TranslationTrainingArguments(output_dir=str(tmp_path / "run"), report_to="none", use_cpu=True)
    assert prepare_push(args) is None
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path / "run"), push_to_hub=True, hub_token=HUB_TOKEN, report_to="none", use_cpu=True
    )
    monkeypatch.setattr(TranslationTrainingArguments, "process_index", property(lambda self: 1))
    assert prepare_push(args) is None


def test_an_earlier_models_weights_of_another_format_are_deleted_by_a_push(hub_here, tmp_path):
    """A repo holding another model's `pytorch_model.bin` (and TensorFlow weights), then this project's model pushed
    into it: before, they stayed beside the new model.safetensors, and `from_pretrained(repo_id,
    use_safetensors=False)` loaded the earlier model's weights."""
    from huggingface_hub import HfApi

    endpoint, root = hub_here
    repo_id = "tester/other-formats"
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo(repo_id)
    for name in ("pytorch_model.bin", "pytorch_model-00001-of-00002.bin", "tf_model.h5", "flax_model.msgpack"):
        api.upload_file(path_or_fileobj=b"an earlier model's weights", path_in_repo=name, repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"a user's own", path_in_repo="notes.bin", repo_id=repo_id)
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)

    push_model_dir(model_dir, repo_id, token=HUB_TOKEN)
    stored = {path.name for path in (root / repo_id).iterdir() if path.is_file()}
    assert stored == {path.name for path in model_dir.iterdir()} | {"notes.bin"}
