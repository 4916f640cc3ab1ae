"""`scripts/train.py --push_to_hub`: one push at the end of training, with this project's card, through the local
Hub look-alike (tests/hub_server.py); the token checked before training and kept out of every record."""

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hub_server import running_hub_server
from huggingface_hub import metadata_load
from test_hub import hub_env, requests_made
from test_training import word_for_word, write_corpus
from tiny_checkpoint import save_tiny_checkpoint, synthetic_pairs

import modeling.hub as hub_module
from modeling.evaluation import corpus_scores, write_json
from modeling.training import (
    DataArguments,
    ModelArguments,
    TranslationTrainingArguments,
    _HubTarget,
    _prepare_push,
    _push_trained_model,
    _without_hub_push,
    _write_run_records,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_train_push_token_not_a_real_one"
REPO_ID = "user/tiny"
TINY_RUN = (
    "--preset tiny --source-lang en --target-lang de --max_steps 2 --d_model 32 --num_layers 1 --num_heads 2 "
    "--ffn_dim 64 --vocab_size 64 --max_tokens_per_device 256 --eval_strategy no --save_steps 1 --logging_steps 1 "
    "--average_last_checkpoints 2 --report_to none --use_cpu --disable_tqdm true"
).split()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Start tests/hub_server.py on a free port; yield (endpoint, storage root); stop it by its pid."""
    root = tmp_path_factory.mktemp("hub")
    with running_hub_server(root, TOKEN) as endpoint:
        yield endpoint, root


def run_train_script(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *TINY_RUN, *extra]
    command += ["--data-dir", str(data_dir), "--output-dir", str(tmp_path / "run")]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def test_train_script_pushes_the_averaged_model_with_our_card(hub, tmp_path):
    endpoint, root = hub
    env = {**hub_env(endpoint, tmp_path / "home", TOKEN), "MKL_NUM_THREADS": "1"}
    result = run_train_script(tmp_path, env, "--push_to_hub", "--hub_model_id", REPO_ID)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    assert log.index(f"The model will be pushed to {REPO_ID}") < log.index("Training on "), "repo checked first"
    assert f"Pushing the averaged model ({tmp_path / 'run' / 'averaged'}" in log

    flow = [(method, path) for method, path, status in requests_made(root) if status == 200]
    commit = ("POST", f"/api/models/{REPO_ID}/commit/main")
    assert flow.count(commit) == 1, "one push, at the end: none from the Trainer"
    assert flow.index(("POST", "/api/repos/create")) < flow.index(commit)

    run, stored = tmp_path / "run", root / REPO_ID
    expected = {"model.safetensors", "config.json", "generation_config.json", "README.md", "training_curves.png"}
    expected |= {"configuration_transformer.py", "modeling_transformer.py", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= {path.name for path in stored.iterdir()}
    assert (stored / "model.safetensors").read_bytes() == (run / "averaged" / "model.safetensors").read_bytes()
    assert "auto_map" in json.loads((stored / "config.json").read_text())
    assert (stored / "training_curves.png").read_bytes().startswith(b"\x89PNG")

    card = (stored / "README.md").read_text()
    metadata = metadata_load(stored / "README.md")
    assert metadata["pipeline_tag"] == "translation" and metadata["language"] == ["en", "de"]
    assert "@inproceedings{vaswani2017attention" in card and "generated automatically" not in card
    assert "| sentence_pairs.train |" in card and "learning_rate_schedule" in card, "from the run's records"
    assert "![Training and evaluation curves](training_curves.png)" in card

    assert TOKEN not in result.stdout + result.stderr
    for path in [*stored.rglob("*"), *run.rglob("*")]:  # training_args.json/.bin, checkpoints, card, events
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), f"the token leaked into {path}"


def test_push_without_a_token_fails_before_training(hub, tmp_path):
    endpoint, root = hub
    requests_before = len(requests_made(root))
    env = {**hub_env(endpoint, tmp_path / "empty_home", token=None), "MKL_NUM_THREADS": "1"}
    result = run_train_script(tmp_path, env, "--push_to_hub", "--hub_model_id", "user/no-token")
    assert result.returncode != 0
    assert "MissingHubTokenError: No Hugging Face token found" in result.stderr
    assert "HF_TOKEN" in result.stderr and "hf auth login" in result.stderr
    run = tmp_path / "run"
    assert not list(run.glob("checkpoint-*")) and not (run / "model.safetensors").exists(), "no training"
    assert not (run / "tokenizer.json").exists(), "not even the BPE was trained"
    assert len(requests_made(root)) == requests_before, "nothing reached the Hub"


def test_a_hub_token_argument_stays_out_of_records_and_checkpoints(tmp_path):
    """`--hub_token` puts the token in the arguments: training_args.json masks it, the Trainer never gets it."""
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), push_to_hub=True, hub_token=TOKEN, report_to="none", use_cpu=True
    )
    trainer_args = _without_hub_push(args)
    assert (trainer_args.push_to_hub, trainer_args.hub_token) == (False, None)
    assert (args.push_to_hub, args.hub_token) == (True, TOKEN), "the caller's arguments stay as given"
    saved = io.BytesIO()
    torch.save(trainer_args, saved)  # what the Trainer writes as training_args.bin, in every checkpoint too
    assert TOKEN.encode() not in saved.getvalue()
    assert TOKEN not in str(args)

    trainer = SimpleNamespace(args=args, processing_class=[None] * 64)  # the token-holding original: to_dict masks
    model_args, data_args = ModelArguments(preset="tiny"), DataArguments(data_dir="d")
    _write_run_records(trainer, model_args, data_args, {"train": [None] * 3}, {}, hub_model_id=REPO_ID)
    text = (tmp_path / "training_args.json").read_text()
    assert TOKEN not in text
    records = json.loads(text)
    assert (records["hub_token"], records["push_to_hub"], records["hub_model_id"]) == ("<HUB_TOKEN>", True, REPO_ID)


def test_a_repo_name_without_namespace_gets_the_token_owners(tmp_path, monkeypatch):
    """The Trainer's default repo name (output_dir's) has no namespace; the card must name the repo in full."""
    from huggingface_hub import HfApi

    tokens, created = [], []
    monkeypatch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: tokens.append(self.token) or {"name": "me"})
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kwargs: created.append(repo_id))
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path / "en-de"), push_to_hub=True, hub_token=TOKEN, report_to="none", use_cpu=True
    )
    assert _prepare_push(args) == _HubTarget("me/en-de", TOKEN) and tokens == [TOKEN]
    assert TOKEN not in repr(_prepare_push(args))
    args.hub_model_id = "org/name"
    assert _prepare_push(args).repo_id == "org/name" and len(tokens) == 2, "a full repo id is taken as given"
    assert created == ["me/en-de", "me/en-de", "org/name"], "the repo is created before training"
    args.hub_model_id = "not a/valid/name"
    with pytest.raises(ValueError, match="not a/valid/name"):
        _prepare_push(args)


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
    eval_json(model_dir / "eval" / "eval_results_test.json", 33.33)
    pushed = []
    monkeypatch.setattr(hub_module, "push_model_dir", lambda *args, **kwargs: pushed.append(args) or "url")

    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        _push_trained_model(_HubTarget(REPO_ID, TOKEN), model_dir, run, "the averaged model", private=None)
    assert pushed == [(model_dir, REPO_ID)]
    values = [
        metric["value"]
        for entry in metadata_load(model_dir / "README.md")["model-index"]
        for result in entry["results"]
        for metric in result["metrics"]
        if metric["name"] == "sacreBLEU"
    ]
    assert values == [33.33]
    assert "eval_results_valid.json" in caplog.text, "the stale result is named in a warning"
