"""scripts/train.py end to end: flags and YAML over preset defaults, a loadable model, and `--push_to_hub` (one
push at the end of training, with this project's card, through the local Hub look-alike tests/hub_server.py;
the token checked before training and kept out of every record)."""

import importlib.util
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    HUB_TOKEN,
    REPO_ROOT,
    hub_env,
    losses,
    requests_made,
    subprocess_env,
    word_for_word,
    write_corpus,
    write_run_config,
)
from huggingface_hub import metadata_load
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modeling.checkpoints import is_complete
from modeling.training import train


def load_train_script():
    spec = importlib.util.spec_from_file_location("train_script", REPO_ROOT / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_takes_dashes_and_yaml_over_preset_defaults(tmp_path):
    script = load_train_script()
    flags = "--preset tiny --data-dir d --source-lang en --max_steps 7 --d-model 64 --report_to none".split()
    model_args, data_args, args = script.parse([*flags, "--output-dir", str(tmp_path)])
    assert (model_args.preset, model_args.d_model, data_args.data_dir) == ("tiny", 64, "d")
    assert args.max_steps == 7, "an explicit flag wins over the preset"
    assert (args.warmup_steps, args.learning_rate, args.max_grad_norm) == (400, 0.3, 0.0), "preset defaults"
    assert (args.adam_beta2, args.adam_epsilon, args.label_smoothing_factor) == (0.98, 1e-9, 0.1)

    config = tmp_path / "run.yaml"
    config.write_text(f"preset: base\ndata_dir: d\noutput_dir: {tmp_path}\nsave_steps: 7\nreport_to: none\n")
    model_args, data_args, args = script.parse([str(config)])
    assert (model_args.preset, args.save_steps, args.max_steps, args.tokens_per_update) == ("base", 7, 100_000, 25000)

    # The requeue command: the file's values over the preset's, flags over the file's.
    model_args, data_args, args = script.parse([str(config), "--resume_from_checkpoint", "last", "--save_steps", "9"])
    assert (args.resume_from_checkpoint, args.save_steps, data_args.data_dir) == ("last", 9, "d")
    assert args.max_steps == 100_000 and args.output_dir == str(tmp_path)
    model_args, _, args = script.parse([str(config), "--preset", "tiny"])
    assert (model_args.preset, args.save_steps, args.warmup_steps) == ("tiny", 7, 400), "the flag's preset's defaults"
    config.write_text("preset: base\nsave_step: 7\n")
    with pytest.raises(ValueError, match=r"unknown arguments \['save_step'\]"):
        script.parse([str(config)])


def test_train_script_writes_a_loadable_model(tmp_path):
    data_dir = write_corpus(tmp_path / "data", 120, word_for_word)
    output_dir = tmp_path / "run"
    flags = (
        "--preset tiny --source-lang en --target-lang de --max_steps 3 --d_model 32 --num_layers 1 --num_heads 4 "
        "--ffn_dim 64 --vocab_size 64 --max_tokens_per_device 256 --eval_steps 2 --save_steps 2 "
        "--bleu_sample_size 4 --generation_max_length 8 --average_last_checkpoints 2 --report_to tensorboard "
        "--use_cpu --disable_tqdm true"
    ).split()
    script = str(REPO_ROOT / "scripts" / "train.py")
    command = [sys.executable, script, *flags, "--data-dir", str(data_dir), "--output-dir", str(output_dir)]
    env = subprocess_env()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert any("eval_sample_bleu" in entry for entry in state["log_history"])
    assert list(output_dir.glob("runs/*/events.out.tfevents.*")), "TensorBoard logs"
    assert (output_dir / "training_args.json").is_file() and (output_dir / "data_stats.json").is_file()
    generation = json.loads((output_dir / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and "max_length" not in generation, "evaluation left the paper's decoding"
    for model_dir in (output_dir, output_dir / "averaged"):
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        generated = model.generate(**tokenizer(["the dog sees a cat"], return_tensors="pt"), max_new_tokens=5)
        assert generated.shape[0] == 1
    assert math.isfinite(state["log_history"][-1]["train_loss"])


REPO_ID = "user/tiny"


TINY_RUN = (
    "--preset tiny --source-lang en --target-lang de --max_steps 2 --d_model 32 --num_layers 1 --num_heads 2 "
    "--ffn_dim 64 --vocab_size 64 --max_tokens_per_device 256 --eval_strategy no --save_steps 1 --logging_steps 1 "
    "--average_last_checkpoints 2 --report_to none --use_cpu --disable_tqdm true"
).split()


def run_train_script(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *TINY_RUN, *extra]
    command += ["--data-dir", str(data_dir), "--output-dir", str(tmp_path / "run")]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def test_train_script_pushes_the_averaged_model_with_our_card(hub, tmp_path):
    endpoint, root = hub
    env = {**hub_env(endpoint, tmp_path / "home", HUB_TOKEN), "MKL_NUM_THREADS": "1"}
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

    assert HUB_TOKEN not in result.stdout + result.stderr
    for path in [*stored.rglob("*"), *run.rglob("*")]:  # training_args.json/.bin, checkpoints, card, events
        if path.is_file():
            assert HUB_TOKEN.encode() not in path.read_bytes(), f"the token leaked into {path}"


def test_push_without_a_token_fails_before_training(hub, tmp_path):
    endpoint, root = hub
    requests_before = len(requests_made(root))
    env = {**hub_env(endpoint, tmp_path / "empty_home", token=None), "MKL_NUM_THREADS": "1"}
    result = run_train_script(tmp_path, env, "--push_to_hub", "--hub_model_id", "user/no-token")
    assert result.returncode != 0
    assert "error: No Hugging Face token found" in result.stderr and "Traceback" not in result.stderr
    assert "HF_TOKEN" in result.stderr and "hf auth login" in result.stderr
    run = tmp_path / "run"
    assert not list(run.glob("checkpoint-*")) and not (run / "model.safetensors").exists(), "no training"
    assert not (run / "tokenizer.json").exists(), "not even the BPE was trained"
    assert len(requests_made(root)) == requests_before, "nothing reached the Hub"


def test_sigterm_exits_75_with_a_checkpoint_and_the_same_command_resumes_it(tmp_path, datasets_cache):
    """The requeue loop: SIGTERM mid-run → exit 75, preempted.json, a complete checkpoint holding every update
    made; the same command with --resume_from_checkpoint last then finishes with the uninterrupted run's losses."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    write_run_config(config, data_dir, run, max_steps=60, save_steps=1000)
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), str(config)]
    command += ["--resume_from_checkpoint", "last"]  # the same command for the first launch and every requeue
    env = subprocess_env(PYTHONUNBUFFERED="1", HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"))
    with open(tmp_path / "stderr.txt", "w+") as log:  # a file: a full stderr pipe would block the run
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            seen = 0
            for line in process.stdout:  # SIGTERM once 3 updates are logged
                seen += "'loss'" in line
                if seen == 3:
                    process.send_signal(signal.SIGTERM)
                    break
            stdout = process.communicate(timeout=120)[0]
        finally:
            process.kill()
        stderr = (tmp_path / "stderr.txt").read_text()
    assert process.returncode == 75, stderr[-3000:]
    record = json.loads((run / "preempted.json").read_text())
    step = record["step"]
    assert record["signal"] == "SIGTERM" and record["checkpoint"] == str(run / f"checkpoint-{step}")
    assert is_complete(run / f"checkpoint-{step}") and 3 <= step < 60
    assert seen + stdout.count("'loss'") == step, "every update made is in the checkpoint, none made after it"
    assert "Exiting with code 75 (preempted)" in stderr and "Traceback" not in stderr
    assert not (run / "model.safetensors").exists(), "no final model from a preempted run"

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from {run / f'checkpoint-{step}'}" in resumed.stderr
    assert not (run / "preempted.json").exists() and (run / "model.safetensors").is_file()

    script = load_train_script()
    train(*script.parse([str(config), "--output_dir", str(tmp_path / "uninterrupted")]))
    expected = json.loads((tmp_path / "uninterrupted" / "trainer_state.json").read_text())["log_history"]
    actual = json.loads((run / "trainer_state.json").read_text())["log_history"]
    expected_losses, actual_losses = losses(expected), losses(actual)
    assert sorted(actual_losses) == list(range(1, 61))
    for update in range(step + 1, 61):
        assert actual_losses[update] == pytest.approx(expected_losses[update], rel=1e-5, abs=1e-6), update
