"""scripts/train.py end to end: flags and YAML over preset defaults, a loadable model, and `--push_to_hub` (one
push at the end of training, with this project's card, through the local Hub look-alike tests/hub_server.py;
the token checked before training and kept out of every record)."""

import atexit
import contextlib
import importlib.util
import json
import math
import os
import pty
import select
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import (
    HUB_TOKEN,
    REPO_ROOT,
    SCRIPTS,
    hub_env,
    losses,
    requests_made,
    script_error,
    subprocess_env,
    word_for_word,
    word_tokenizer,
    write_corpus,
    write_run_config,
)
from huggingface_hub import metadata_load
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modeling import arguments, callbacks
from modeling.arguments import TranslationTrainingArguments
from modeling.callbacks import (
    DUPLICATE_SIGNAL_SECONDS,
    PREEMPTION_SIGNALS,
    PreemptionCallback,
    SignalledBeforeTraining,
)
from modeling.checkpoints import checkpoint_problems
from modeling.presets import get_preset
from modeling.training import TrainingPreempted, train


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
    assert args.ddp_timeout_delta.total_seconds() == 4 * 3600, "the others wait while the main process prepares data"

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


def test_the_switches_on_by_default_are_turned_off_by_their_no_flags(tmp_path):
    """`--no_paper_schedule` and `--no_clean`, as the help says: the parser makes a `--no_` flag only for a field
    whose default is true."""
    flags = ["--preset", "tiny", "--output_dir", str(tmp_path), "--report_to", "none"]
    _, data_args, args = load_train_script().parse(flags)
    assert (args.paper_schedule, data_args.clean) == (True, True)
    _, data_args, args = load_train_script().parse([*flags, "--no_paper_schedule", "--no_clean"])
    assert (args.paper_schedule, data_args.clean) == (False, False)


def test_a_config_files_paths_may_start_with_the_home_directory(tmp_path, monkeypatch):
    """No shell expands `~` in a YAML file (nor in `--data_dir=~/x`): transformers expands output_dir's, and
    `data_dir: ~/wmt14` beside it was `data directory ~/wmt14 does not exist`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "run.yaml"
    settings = {"data_dir": "~/data", "output_dir": "~/run", "resume_from_checkpoint": "~/old/checkpoint-8"}
    settings |= {"model_name_or_path": "~/model", "tokenizer_name_or_path": "~/bpe", "report_to": "none"}
    config.write_text(yaml.safe_dump(settings))
    model_args, data_args, args = load_train_script().parse([str(config)])
    assert (data_args.data_dir, args.output_dir) == (str(tmp_path / "data"), str(tmp_path / "run"))
    assert (model_args.model_name_or_path, model_args.tokenizer_name_or_path) == (
        str(tmp_path / "model"),
        str(tmp_path / "bpe"),
    )
    assert args.resume_from_checkpoint == str(tmp_path / "old" / "checkpoint-8")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("base_en_de", ("de", 37000, 0.1, 100_000, 5)),
        ("big_en_de", ("de", 37000, 0.3, 300_000, 20)),
        ("base_en_fr", ("fr", 32000, 0.1, 100_000, 5)),
        ("big_en_fr", ("fr", 32000, 0.1, 300_000, 20)),  # Sec. 6.1: dropout 0.1, not big's 0.3, into French
    ],
)
def test_the_shipped_paper_configs_give_table_2s_recipes(config, expected):
    path = REPO_ROOT / "configs" / "train" / f"{config}.yaml"
    model_args, data_args, args = load_train_script().parse([str(path), "--bf16", "false"])  # no GPU here
    preset = get_preset(model_args.preset)
    model = preset.model_config(data_args.vocab_size or preset.vocab_size, **model_args.config_overrides())
    recipe = (data_args.target_lang, data_args.vocab_size or preset.vocab_size, model.dropout, args.max_steps)
    assert (*recipe, args.average_last_checkpoints) == expected
    assert (data_args.dataset, data_args.source_lang, args.tokens_per_update) == ("wmt/wmt14", "en", 25000)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_steps: 5.5", "max_steps must be an integer, got 5.5"),
        ("max_steps: [5]", "max_steps must be an integer, got [5]"),
        ('max_steps: "five"', "max_steps must be an integer, got 'five'"),
        ("max_steps: true", "max_steps must be an integer, got True"),
        ("d_model: 64.0", "d_model must be an integer or null, got 64.0"),
        ("learning_rate: fast", "learning_rate must be a number, got 'fast'"),
        ("bf16: 1", "bf16 must be true or false, got 1"),
        ("bf16: 'true'", "bf16 must be true or false, got 'true'"),
        ("report_to: [none, 3]", "report_to must be null, a string or a list of strings, got ['none', 3]"),
        ("eval_strategy: sometimes", "eval_strategy must be one of ['no', 'steps', 'epoch'], got 'sometimes'"),
        ("lr_scheduler_kwargs: 3", "lr_scheduler_kwargs must be a mapping, a string or null, got 3"),
    ],
)
def test_config_values_of_the_wrong_type_are_refused_in_one_line_before_any_work(
    line, message, tmp_path, monkeypatch, capsys
):
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: tiny\ndata_dir: {tmp_path / 'data'}\noutput_dir: {tmp_path / 'run'}\n{line}\n")
    assert script_error("train.py", config, monkeypatch=monkeypatch) == f"error: {config}: {message}"
    assert capsys.readouterr().err == "", "no usage, no traceback"
    assert not (tmp_path / "run").exists(), "refused before anything is written"


def test_config_values_of_the_right_type_are_taken(tmp_path):
    script = load_train_script()
    config = tmp_path / "run.json"
    values = {"preset": "tiny", "output_dir": str(tmp_path), "learning_rate": 1, "save_every_minutes": None}
    values |= {"report_to": ["none"], "eval_strategy": "no", "lr_scheduler_kwargs": {}, "bf16": False}
    config.write_text(json.dumps(values))
    model_args, _, args = script.parse([str(config)])
    assert (args.learning_rate, args.save_every_minutes, args.report_to) == (1, None, [])
    assert args.eval_strategy == "no" and model_args.preset == "tiny"
    # YAML 1.1 reads 1e-9 as a string: the file means the number, as a flag would.
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\nadam_epsilon: 1e-9\nlearning_rate: 5.0E-1\n")
    _, _, args = script.parse([str(config)])
    assert (args.adam_epsilon, args.learning_rate) == (1e-9, 0.5)
    # YAML 1.1 reads no / yes / on / off as booleans: `eval_strategy: no` was refused, Norwegian taken for false.
    config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\neval_strategy: no\ntarget_lang: no\nbf16: false\n")
    _, data_args, args = script.parse([str(config)])
    assert (args.eval_strategy, data_args.target_lang, args.bf16) == ("no", "no", False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--learning_rate", "inf"], "learning_rate must be a finite number, got inf."),  # trained to NaN, exit 0
        (["--max_train_minutes", "nan"], "max_train_minutes must be a finite number, got nan."),  # was no limit
        (["--learning_rate", "-1"], "learning_rate must not be negative, got -1.0."),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps must be at least 1, got 0."),
        (["--gradient_accumulation_steps", "-1"], "gradient_accumulation_steps must be at least 1, got -1."),
        (["--tokens_per_update", "0"], "tokens_per_update must be positive, got 0."),
        (["--save_every_minutes", "0"], "save_every_minutes must be positive, got 0.0."),
        (
            ["--warmup_steps", "0"],
            "The schedule of Sec. 5.3 needs a warmup of at least one update (the paper: 4000), got 0.",
        ),
        (["--vocab_size", "0"], "vocab_size must exceed the 3 special tokens, got 0"),  # was the preset's 6,000
        (["--average_last_checkpoints", "-3"], "average_last_checkpoints must not be negative, got -3."),  # was none
        (["--bleu_sample_size", "-1"], "--bleu_sample_size must not be negative, got -1."),  # was none, silently
        # Named after the data was read: a Hub connection error (55 s online), or a Marian tokenizer's `langs`.
        (
            ["--tokenizer", "/"],
            "--tokenizer_name_or_path / holds no tokenizer (no tokenizer.json or tokenizer_config.json)",
        ),
        (
            ["--tokenizer", __file__],
            f"--tokenizer_name_or_path {__file__} is a file: give the directory that holds it",
        ),
    ],
)
def test_settings_that_fail_a_run_late_are_refused_before_anything_is_written(flags, message, tmp_path, monkeypatch):
    """Before, some trained to NaN weights and exited 0, others failed once the BPE was trained and the run recorded
    in --output_dir, where the corrected command then found an "earlier run"."""
    common = ["--preset", "tiny", "--data_dir", tmp_path / "data", "--output_dir", tmp_path / "run"]
    assert script_error("train.py", *common, "--report_to", "none", *flags, monkeypatch=monkeypatch) == (
        f"error: {message}"
    )
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_tokenizer_directory_without_tokenizer_json_is_named_before_anything_is_written(tmp_path, monkeypatch):
    """Before, once the data was read: "You need to have sentencepiece or tiktoken installed to convert a slow
    tokenizer to a fast one", no file named."""
    word_tokenizer().save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "tokenizer" / "tokenizer.json").unlink()
    data = write_corpus(tmp_path / "data", 20, word_for_word)
    flags = ["--preset", "tiny", "--data_dir", data, "--output_dir", tmp_path / "run", "--report_to", "none"]
    message = script_error("train.py", *flags, "--tokenizer", tmp_path / "tokenizer", monkeypatch=monkeypatch)
    assert (
        message == f"error: --tokenizer_name_or_path {tmp_path / 'tokenizer'} holds a tokenizer without tokenizer.json"
    )
    assert not (tmp_path / "run").exists()


def test_a_config_file_after_a_flag_is_named_as_one_that_goes_first(tmp_path, monkeypatch):
    """Before: "Some specified arguments are not used by the HfArgumentParser: ['run.yaml']"."""
    config = write_run_config(tmp_path / "run.yaml", tmp_path / "data", tmp_path / "run")
    message = script_error("train.py", "--max_steps", "2", config, monkeypatch=monkeypatch)
    assert message == f"error: {config}: a config file is read as the first argument only, before any flag"
    message = script_error("train.py", "--max_steps", "2", "--no_such_flag", "1", monkeypatch=monkeypatch)
    assert message == "error: Some specified arguments are not used by the HfArgumentParser: ['--no_such_flag', '1']"
    assert not (tmp_path / "run").exists()


def test_a_setting_that_transformers_refuses_is_refused_in_one_line(tmp_path, monkeypatch):
    """transformers' message spans three lines ("... but found\n- Evaluation strategy: ...\n- Save strategy: ...")."""
    flags = ["--preset", "tiny", "--output_dir", tmp_path / "run", "--report_to", "none", "--eval_strategy", "no"]
    message = script_error("train.py", *flags, "--load_best_model_at_end", "true", monkeypatch=monkeypatch)
    assert message.startswith("error: --load_best_model_at_end requires the save and eval strategy to match")
    assert message.endswith("but found - Evaluation strategy: IntervalStrategy.NO - Save strategy: SaveStrategy.STEPS")


def test_deepspeed_asked_for_where_it_is_not_installed_is_refused_in_one_line(tmp_path, monkeypatch):
    """transformers' PackageNotFoundError escaped as a traceback."""
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed")
    (tmp_path / "ds.json").write_text("{}")
    flags = ["--preset", "tiny", "--output_dir", tmp_path / "run", "--report_to", "none"]
    message = script_error("train.py", *flags, "--deepspeed", tmp_path / "ds.json", monkeypatch=monkeypatch)
    assert message.startswith("error: ") and "deepspeed" in message
    assert not (tmp_path / "run").exists()


def test_a_failure_during_the_run_is_one_line_where_transformers_message_spans_two(tmp_path, monkeypatch):
    """transformers' "couldn't connect" error, raised by a load once the data is read, spanned two lines."""
    script = load_train_script()
    message = (
        "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
        "files.\nCheck your internet connection or see how to run the library in offline mode at 'https://hf.co'."
    )

    def fail(*arguments):
        raise OSError(message)

    monkeypatch.setattr(script, "parse", lambda argv: (None, None, SimpleNamespace(should_log=False)))
    monkeypatch.setattr(script, "train", fail)
    with pytest.raises(SystemExit) as exit_info:
        script.main()
    assert exit_info.value.code == f"error: {message.replace(chr(10), ' ')}"


def test_the_corpus_directory_is_refused_as_the_output_directory(tmp_path, monkeypatch):
    data = write_corpus(tmp_path / "data", 20, word_for_word)
    card = "---\nlicense: cc-by-4.0\n---\n# Our corpus\n"  # a dataset card: front matter, as a model card's
    (data / "README.md").write_text(card)
    flags = ["--preset", "tiny", "--data_dir", data, "--output_dir", data, "--report_to", "none", "--max_steps", "2"]
    message = script_error("train.py", *flags, "--overwrite_output_dir", monkeypatch=monkeypatch)
    assert message.startswith(f"error: --output_dir {data} is --data_dir: ")
    assert (data / "README.md").read_text() == card


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "run.yaml",
            "preset: tiny\n  bad: [\n",
            "invalid YAML at line 2, column 6: mapping values are not allowed here",
        ),
        (
            "run.yml",
            "max_steps: [5\n",
            "invalid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence from line 1, column 12)",
        ),
        (
            "run.json",
            '{"preset": "tiny", bad}',
            "invalid JSON at line 1, column 20: Expecting property name enclosed in double quotes",
        ),
        ("run.yaml", "1: 2\nfoo: 3\n", "unknown arguments [1, 'foo']."),
        ("run.yaml", "max_steps: 5\nmax_steps: 7\n", "invalid YAML at line 2, column 1: 'max_steps' is given twice"),
        ("run.json", '{"max_steps": 5, "max_steps": 7}', "['max_steps'] given twice"),
        ("run.yaml", "[a]: 1\n", "invalid YAML at line 1, column 1: a key that cannot be a name"),  # a TypeError
        ("run.yaml", "preset: caf\xe9\n".encode("latin-1"), "'utf-8' codec can't decode byte 0xe9 in position 11"),
        # Once read as no settings: the run then failed on the data it needed, naming neither the file nor the fault.
        ("run.yaml", "", "no settings in it, and no flags after it"),
        ("run.yaml", "# base, EN-DE\n", "no settings in it, and no flags after it"),
        ("run.json", "{}", "no settings in it, and no flags after it"),
    ],
)
def test_a_malformed_config_file_is_one_line_naming_it(name, text, message, tmp_path, monkeypatch, capsys):
    config = tmp_path / name
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert script_error("train.py", config, monkeypatch=monkeypatch).startswith(f"error: {config}: {message}")
    assert capsys.readouterr().err == ""


def test_save_on_each_node_is_refused_across_nodes_only(tmp_path, monkeypatch):
    """Across nodes it gave the others checkpoints without weights, which no requeue resumed (the 2-node config once
    advised it without a shared file system); on one node it changes nothing."""
    flags = ["--preset", "tiny", "--output_dir", str(tmp_path), "--report_to", "none", "--save_on_each_node"]
    assert load_train_script().parse(flags)[2].save_on_each_node
    monkeypatch.setenv("WORLD_SIZE", "16")  # what torchrun sets on each of 2 machines of 8 GPUs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert arguments._node_count() == 2
    monkeypatch.delenv("WORLD_SIZE")  # the arguments themselves must stay one process here
    assert arguments._node_count() == 1, "without the world size, one machine"
    for nodes in (2, None):  # None: a launcher that sets the world size alone, which may span machines
        monkeypatch.setattr(arguments, "_node_count", lambda nodes=nodes: nodes)
        with pytest.raises(ValueError, match=r"^save_on_each_node is not supported: rank 0 writes each checkpoint"):
            load_train_script().parse(flags)


def test_a_config_file_without_settings_is_taken_when_flags_follow_it(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("# all settings by flags\n")
    args = load_train_script().parse([str(config), "--preset", "tiny", "--output_dir", str(tmp_path / "run")])[2]
    assert args.output_dir == str(tmp_path / "run")


def test_a_config_files_suffix_is_read_in_any_case(tmp_path):
    """RUN.YAML was "Some specified arguments are not used by the HfArgumentParser: ['RUN.YAML']", which said neither
    why nor what to do."""
    script = load_train_script()
    yaml_config, json_config = tmp_path / "RUN.YAML", tmp_path / "Run.Json"
    yaml_config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\nmax_steps: 7\n")
    json_config.write_text(json.dumps({"preset": "tiny", "output_dir": str(tmp_path), "max_steps": 8}))
    assert script.parse([str(yaml_config)])[2].max_steps == 7
    assert script.parse([str(json_config)])[2].max_steps == 8
    with pytest.raises(ValueError, match=r"RUN.YAML: a config file is read as the first argument only"):
        script.parse(["--max_steps", "3", str(yaml_config)])


def test_micro_batches_per_update_given_replace_the_presets_tokens_per_update(tmp_path):
    """Before, `--preset base --gradient_accumulation_steps 4` was refused as giving both (the preset gave one), and no
    flag could unset the preset's tokens_per_update. A flag replaces it whatever its number (1: one micro-batch,
    as a refused requeue may advise); in a config file, 1, Hugging Face's default that configs copied from elsewhere
    spell out, keeps the preset's 25,000 tokens per update (it once made base's updates 6x smaller)."""
    script = load_train_script()
    flags = ["--preset", "base", "--output_dir", str(tmp_path), "--report_to", "none"]
    assert script.parse(flags)[2].tokens_per_update == 25000
    args = script.parse([*flags, "--gradient_accumulation_steps", "1"])[2]
    assert (args.tokens_per_update, args.gradient_accumulation_steps) == (None, 1)
    args = script.parse([*flags, "--gradient_accumulation_steps", "4"])[2]
    assert (args.tokens_per_update, args.gradient_accumulation_steps) == (None, 4)
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: base\noutput_dir: {tmp_path}\ngradient_accumulation_steps: 2\n")
    assert script.parse([str(config)])[2].tokens_per_update is None
    config.write_text(f"preset: base\noutput_dir: {tmp_path}\ngradient_accumulation_steps: 1\n")
    assert script.parse([str(config)])[2].tokens_per_update == 25000
    with pytest.raises(ValueError, match="Give tokens_per_update or gradient_accumulation_steps, not both"):
        script.parse([*flags, "--gradient_accumulation_steps", "4", "--tokens_per_update", "8000"])


def test_flags_replace_the_config_files_choice_of_update_size(tmp_path):
    """`run.yaml --gradient_accumulation_steps 2` over a file's tokens_per_update was refused as giving both."""
    script = load_train_script()
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: base\noutput_dir: {tmp_path}\ntokens_per_update: 2000\n")
    args = script.parse([str(config), "--gradient_accumulation_steps", "2"])[2]
    assert (args.tokens_per_update, args.gradient_accumulation_steps) == (None, 2)
    config.write_text(f"preset: base\noutput_dir: {tmp_path}\ngradient_accumulation_steps: 3\n")
    args = script.parse([str(config), "--tokens_per_update", "8000"])[2]
    assert (args.tokens_per_update, args.gradient_accumulation_steps) == (8000, 1)
    assert script.parse([str(config), "--max_steps", "9"])[2].gradient_accumulation_steps == 3, "the file's, kept"


def test_the_preset_keeps_every_checkpoint_the_run_averages(tmp_path):
    script = load_train_script()
    flags = ["--preset", "tiny", "--output_dir", str(tmp_path), "--report_to", "none"]
    assert script.parse(flags)[2].save_total_limit == 5, "the preset keeps the 5 it averages"
    args = script.parse([*flags, "--average_last_checkpoints", "8"])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (8, 8), "rotation must not delete them"
    assert script.parse([*flags, "--average-last-checkpoints", "2"])[2].save_total_limit == 5, "raised, not lowered"
    args = script.parse([*flags, "--average_last_checkpoints", "8", "--save_total_limit", "9"])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (9, 8), "the user's own"
    args = script.parse([*flags, "--save_total_limit", "2"])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (2, 2), "the preset averages what is kept"
    assert script.parse([*flags, "--save_total_limit", "0"])[2].average_last_checkpoints == 5, "0 keeps them all"
    # load_best_model_at_end: rotation keeps the best checkpoint beside the newest ones, in one more place.
    best = [*flags, "--eval_steps", "100", "--save_steps", "100", "--load_best_model_at_end"]
    args = script.parse(best)[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (6, 5)
    args = script.parse([*best, "--save_total_limit", "3"])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (3, 2), "the preset averages the newest kept"
    assert script.parse([*best, "false"])[2].save_total_limit == 5
    tracked = [*flags, "--eval_steps", "100", "--save_steps", "100", "--metric_for_best_model", "eval_sample_bleu"]
    assert script.parse(tracked)[2].save_total_limit == 6, "a best checkpoint is recorded, and kept, all the same"

    config = tmp_path / "run.yaml"
    config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\naverage_last_checkpoints: 8\n")
    assert script.parse([str(config)])[2].save_total_limit == 8
    assert script.parse([str(config), "--save-total-limit", "10"])[2].save_total_limit == 10, "the user's own"
    config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\naverage_last_checkpoints: 8\nsave_total_limit: null\n")
    args = script.parse([str(config)])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (None, 8), "the user's own: keep every one"
    config.write_text(f"preset: tiny\noutput_dir: {tmp_path}\nsave_total_limit: 1\n")
    args = script.parse([str(config)])[2]
    assert (args.save_total_limit, args.average_last_checkpoints) == (1, 1), "one checkpoint kept: none averaged"


def test_a_help_whose_reader_is_gone_ends_quietly():
    """`train.py --help | head`: its 50 KB of help, written within the run's streams that give themselves up, said
    "Not writing to standard output any more, the run goes on" (with a closed pipe: at once)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = subprocess_env()
    env.pop("PYTHONUNBUFFERED", None)
    command = [sys.executable, str(SCRIPTS / "train.py"), "--help"]
    result = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


def test_help_and_flag_errors_are_the_parsers_own(tmp_path, capsys):
    script = load_train_script()
    with pytest.raises(SystemExit) as exit_info:
        script.parse(["--preset", "tiny", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--save_total_limit SAVE_TOTAL_LIMIT" in help_text and "<object" not in help_text
    with pytest.raises(SystemExit) as exit_info:
        script.parse(["--preset", "tiny", "--max_steps", "five", "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    # one line: argparse's usage before it listed every flag, 134 lines
    error = capsys.readouterr().err
    assert error.endswith(": error: argument --max_steps/--max-steps: invalid int value: 'five' (all flags: --help)\n")
    assert error.count("\n") == 1


@pytest.mark.parametrize(
    ("in_file", "flags"),
    [
        ("", ["--save_total_limit", "3", "--average_last_checkpoints", "8"]),
        ("save_total_limit: 3\n", ["--average_last_checkpoints", "8"]),
        ("save_total_limit: 3\naverage_last_checkpoints: 8\n", []),
    ],
)
def test_a_save_total_limit_below_average_last_checkpoints_is_refused_before_any_work(
    in_file, flags, tmp_path, monkeypatch
):
    config = tmp_path / "run.yaml"
    config.write_text(f"preset: tiny\ndata_dir: {tmp_path / 'data'}\noutput_dir: {tmp_path / 'run'}\n{in_file}")
    message = script_error("train.py", config, *flags, monkeypatch=monkeypatch)
    assert message == (
        "error: save_total_limit 3 keeps fewer checkpoints than average_last_checkpoints 8 averages: raise "
        "save_total_limit (or leave it out: the preset keeps as many as are averaged) or average fewer."
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="save_total_limit 3 keeps fewer checkpoints"):
        TranslationTrainingArguments(output_dir=str(tmp_path), save_total_limit=3, average_last_checkpoints=8)
    for unlimited in (None, 0):  # every checkpoint is kept
        TranslationTrainingArguments(output_dir=str(tmp_path), save_total_limit=unlimited, average_last_checkpoints=8)


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


def test_a_diverging_run_stops_in_one_line_naming_its_checkpoint_and_averages_nothing(tmp_path):
    """A learning rate of 1e25: the weights overflow at update 1 and update 2's gradients are NaN. Before, the run
    trained, averaged and saved NaN weights and exited 0."""
    result = run_train_script(tmp_path, subprocess_env(), "--learning_rate", "1e25", "--max_steps", "4")
    run = tmp_path / "run"
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(
        f"error: Training diverged at update 2 of {run}: its gradient norm is nan. The update was not applied and "
        f"nothing was saved after it; the newest complete checkpoint is {run / 'checkpoint-1'} "
    )
    assert [path.name for path in sorted(run.glob("checkpoint-*"))] == ["checkpoint-1"]
    assert not (run / "averaged").exists() and not (run / "model.safetensors").exists()

    # The way out it names, from a checkpoint whose weights had already overflowed: the first update says so.
    flags = "--source-lang en --target-lang de --max_steps 2 --max_tokens_per_device 256 --eval_strategy no --use_cpu"
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *flags.split(), "--model_name_or_path"]
    command += [str(run / "checkpoint-1"), "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "new")]
    restarted = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert restarted.returncode == 1
    assert restarted.stderr.strip().splitlines()[-1] == (
        f"error: Training diverged at update 1 of {tmp_path / 'new'}: its gradient norm is nan, at the first update "
        "of this launch: the weights it started from give non-finite gradients (the weights of a run that had "
        "diverged already?), or its batches do. Nothing was saved."
    )


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
    assert not checkpoint_problems(run / f"checkpoint-{step}") and 3 <= step < 60
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


def read_until_updates_logged(fd: int, updates: int, timeout: float = 120) -> None:
    """Read a run's output from `fd` until `updates` updates are logged (or it ends)."""
    output, deadline = b"", time.monotonic() + timeout
    while output.count(b"'loss'") < updates and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # a terminal whose other side is gone (EIO)
                break
            if not chunk:
                break
            output += chunk
    assert output.count(b"'loss'") >= updates, output[-3000:]


def tiny_run_command(tmp_path: Path, max_steps: int) -> tuple[list[str], dict[str, str]]:
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    config = write_run_config(tmp_path / "run.yaml", data_dir, tmp_path / "run", max_steps=max_steps, save_steps=1000)
    command = [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), str(config), "--disable_tqdm", "false"]
    return command, subprocess_env(PYTHONUNBUFFERED="1", HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"))


def test_a_terminal_that_hangs_up_stops_the_run_with_75_and_a_checkpoint(tmp_path):
    """An interactive run whose ssh connection drops: SIGHUP, and a terminal that raises EIO on every write. The
    signal's default action killed the run, losing every update since its last checkpoint; and once it was caught,
    the next print of the logs (EIO) ended the run without a checkpoint."""
    command, env = tiny_run_command(tmp_path, max_steps=1000)
    terminal, terminal_device = pty.openpty()
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=terminal_device,
        stderr=terminal_device,
        # A terminal session's SIGHUP: the suite may run under nohup, whose ignored SIGHUP a run keeps ignoring.
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    os.close(terminal_device)
    try:
        read_until_updates_logged(terminal, 3)
        os.close(terminal)  # the connection drops: the terminal hangs up
        process.send_signal(signal.SIGHUP)
        process.wait(timeout=120)
    finally:
        process.kill()
    run = tmp_path / "run"
    assert process.returncode == 75
    record = json.loads((run / "preempted.json").read_text())
    assert record["signal"] == "SIGHUP" and record["checkpoint"] == str(run / f"checkpoint-{record['step']}")
    assert not checkpoint_problems(record["checkpoint"]) and 3 <= record["step"] < 1000


def test_a_killed_tee_leaves_the_run_to_finish(tmp_path):
    """`train.py ... 2>&1 | tee log` with tee killed: every write to the pipe raises EPIPE. The next print of the
    logs ended the run with "error: [Errno 32] Broken pipe", which nobody could read, and no checkpoint."""
    command, env = tiny_run_command(tmp_path, max_steps=20)
    read_end, write_end = os.pipe()
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end)
    os.close(write_end)
    try:
        read_until_updates_logged(read_end, 3)
        os.close(read_end)
        process.wait(timeout=120)
    finally:
        process.kill()
    run = tmp_path / "run"
    assert process.returncode == 0
    assert (run / "model.safetensors").is_file() and not checkpoint_problems(run / "checkpoint-20")


def handles(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (Linux: the SigCgt mask of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (sig - 1) & 1)


def test_a_signal_while_the_libraries_load_stops_the_launch_with_75_and_preempted_json(tmp_path):
    """A scheduler's SIGTERM in the first seconds of a launch, while torch and transformers are imported: no
    handler existed yet, so it killed the launch with 143 and no preempted.json, which README's requeue loop reports
    as a failure. The signal is sent as soon as the process handles SIGTERM at all."""
    data_dir = write_corpus(tmp_path / "data", 20, word_for_word)
    config = write_run_config(tmp_path / "run.yaml", data_dir, tmp_path / "run", max_steps=5)
    command = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "train.py"),
        str(config),
        "--resume_from_checkpoint",
        "last",
    ]
    env = subprocess_env(HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"))
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while process.poll() is None and not handles(process.pid, signal.SIGTERM):
            time.sleep(0.002)
        process.send_signal(signal.SIGTERM)
        stderr = process.communicate(timeout=120)[1]
    finally:
        process.kill()
    assert process.returncode == 75, stderr[-3000:]
    assert "Got SIGTERM while the run was starting: stopping before training" in stderr
    record = json.loads((tmp_path / "run" / "preempted.json").read_text())
    assert record["signal"] == "SIGTERM" and record["step"] == 0 and record["checkpoint"] is None


# A preempted run under `nohup` (SIGHUP ignored), after its checkpoint: a SIGHUP (the terminal closing), then
# another at exit.
AFTER_THE_CHECKPOINT_UNDER_NOHUP = """
import atexit, importlib.util, signal, sys
signal.signal(signal.SIGHUP, signal.SIG_IGN)
atexit.register(lambda: signal.raise_signal(signal.SIGHUP) or print("after the SIGHUP at exit", flush=True))
spec = importlib.util.spec_from_file_location("train_script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
script.exit_now_on_signal(script.EXIT_PREEMPTED)
signal.raise_signal(signal.SIGHUP)
print("after the SIGHUP", flush=True)
"""


def test_a_signal_the_run_was_started_ignoring_stays_ignored_after_its_checkpoint():
    """`nohup train.py ...`, preempted: after the checkpoint a further signal exits at once with 75 (a launcher
    stopping the other workers), and so did the SIGHUP that nohup ignores, when the terminal closed a moment later:
    `os._exit`, which skipped the flush of nohup.out, and with it the run's last logs."""
    command = [sys.executable, "-c", AFTER_THE_CHECKPOINT_UNDER_NOHUP, str(REPO_ROOT / "scripts" / "train.py")]
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert (result.returncode, result.stdout) == (0, "after the SIGHUP\nafter the SIGHUP at exit\n"), result.stderr


def test_the_signals_kept_at_launch_are_handed_to_the_preemption_callback_and_then_restored():
    script = load_train_script()
    assert set(PREEMPTION_SIGNALS) == {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP}, "named there too"
    previous = signal.getsignal(signal.SIGUSR1)
    at_launch = script.SignalsAtLaunch((signal.SIGUSR1,))
    signal.raise_signal(signal.SIGUSR1)
    signal.raise_signal(signal.SIGUSR1)
    assert at_launch.received == signal.SIGUSR1
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        assert callback.requested == signal.SIGUSR1
        with pytest.raises(SignalledBeforeTraining):
            with callback.stopping_at_once():
                pass
    assert signal.getsignal(signal.SIGUSR1) is previous, "the handler from before the launch is back, not the keeper"

    quiet = script.SignalsAtLaunch((signal.SIGUSR1,))  # the ordinary launch: no signal while the libraries loaded
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        assert callback.requested is None, "nothing to stop for"
    assert signal.getsignal(signal.SIGUSR1) is previous and quiet.received is None

    unused = script.SignalsAtLaunch((signal.SIGUSR1,))  # a launch that failed before training: nothing took over
    unused.release()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_second_signal_while_the_libraries_load_gets_out_at_once(monkeypatch, sigint_raises_keyboard_interrupt):
    """Ctrl-C twice while the libraries load (or hang loading): the keeper swallowed every signal after the first,
    where README and `PreemptionCallback` promise that a second SIGINT or SIGTERM stops at once. A launcher's copy
    of the first (the same signal within a second) is still one request."""
    script = load_train_script()
    assert script.DUPLICATE_SIGNAL_SECONDS == DUPLICATE_SIGNAL_SECONDS, "the script names it too"
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    previous = signal.getsignal(signal.SIGINT)
    at_launch = script.SignalsAtLaunch((signal.SIGINT, signal.SIGUSR1))
    try:
        signal.raise_signal(signal.SIGINT)
        clock[0] += 0.5
        signal.raise_signal(signal.SIGINT)  # forwarded by a launcher: the same request
        signal.raise_signal(signal.SIGUSR1)  # not a request to stop at once
        assert at_launch.received == signal.SIGINT and signal.getsignal(signal.SIGINT) is at_launch
        clock[0] += 1.0
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is previous, "the handler from before the launch is back"
    finally:
        at_launch.release()


def test_a_second_signal_after_the_hand_over_is_timed_from_the_first_one(
    monkeypatch, sigint_raises_keyboard_interrupt
):
    """Ctrl-C while the libraries load, and again half a second after the preemption callback took the first one
    over, five seconds after it: the callback timed the first from its takeover, took the second for a launcher's
    copy of it and dropped it, where a second SIGINT more than a second after the first stops at once."""
    script = load_train_script()
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    previous = signal.getsignal(signal.SIGINT)
    at_launch = script.SignalsAtLaunch((signal.SIGINT,))
    try:
        signal.raise_signal(signal.SIGINT)
        clock[0] += 5.0  # the libraries load
        callback = PreemptionCallback(signals=(signal.SIGINT,))
        with callback.handling():
            clock[0] += 0.5
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is previous
    finally:
        at_launch.release()


def test_a_sigint_or_sigterm_after_a_sighup_while_the_libraries_load_is_no_second_signal(
    monkeypatch, sigint_raises_keyboard_interrupt, sighup_handled
):
    """A dropped ssh connection where systemd-logind ends the session's processes: the shell's SIGHUP, then logind's
    SIGTERM (SIGINT stands in for it here). Taken for a user's second signal, it killed the launch (143, no
    preempted.json), which README's requeue loop reports as a failure."""
    script = load_train_script()
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    at_launch = script.SignalsAtLaunch((signal.SIGINT, signal.SIGHUP))
    try:
        signal.raise_signal(signal.SIGHUP)
        clock[0] += 0.1
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("the SIGINT after the SIGHUP got out at once")
        assert at_launch.received == signal.SIGINT and signal.getsignal(signal.SIGINT) is at_launch
    finally:
        at_launch.release()


def test_a_signal_after_the_run_finished_leaves_it_finished(tmp_path, monkeypatch):
    """A scheduler's SIGTERM at the end of a job, once `train` has returned: it killed the finished run while the
    interpreter shut down (about a second measured), exit 143 and no preempted.json, which the README's requeue
    loop reports as a failure. Here the handler before the script's stands for that default action.

    A caller that goes on after `main()` (IPython's `%run`, this test session) gets its handlers back: left
    ignored, the signal tests after this one found SIGTERM ignored, and their runs' preemption handlers were not
    installed. They are ignored again at exit, before the interpreter's shutdown."""
    script = load_train_script()
    received, at_exit = [], []
    monkeypatch.setattr(script, "parse", lambda argv: (None, None, SimpleNamespace(should_log=False)))
    monkeypatch.setattr(script, "train", lambda *arguments: str(tmp_path))
    monkeypatch.setattr(script, "leave_process_group", lambda: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.setattr(atexit, "register", at_exit.append)
    monkeypatch.setattr(callbacks, "_IGNORING_AT_EXIT", False)  # as in a process that has not registered it yet
    record = lambda signum, frame: received.append(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}
    try:
        script.main()
        time.sleep(0.05)  # a handler runs between bytecodes: the signal has arrived
        assert received == [], "the finished run ends with code 0"
        assert all(signal.getsignal(sig) is record for sig in PREEMPTION_SIGNALS), "the caller's handlers are back"
        for callback in at_exit:
            callback()
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in PREEMPTION_SIGNALS), "ignored at exit"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_after_a_preempted_run_the_callers_handlers_are_back_and_the_exit_code_holds_at_exit(tmp_path, monkeypatch):
    """A caller that goes on after a preempted `main()` (IPython's `%run`, a notebook) kept handlers that
    `os._exit(75)` the process: its next Ctrl-C or "interrupt kernel" ended the whole kernel. They hold for the
    rest of `main()` (the launcher stopping the other workers) and again at exit. The last run decides how the
    process ends: `%run` executes the script anew, and each run's atexit callback was added to the earlier ones',
    the first run's last, so that a signal at exit after a finished run ended it with the preempted run's 75."""
    at_exit, during = [], []
    monkeypatch.setattr(atexit, "register", at_exit.append)
    monkeypatch.setattr(callbacks, "_IGNORING_AT_EXIT", False)  # as in a process that has not registered it yet
    record = lambda signum, frame: None  # noqa: E731
    previous = {sig: signal.signal(sig, record) for sig in PREEMPTION_SIGNALS}

    def run_main(outcome):
        script = load_train_script()  # `%run`: the file executed anew
        monkeypatch.setattr(script, "parse", lambda argv: (None, None, SimpleNamespace(should_log=False)))
        monkeypatch.setattr(script, "train", lambda *arguments: outcome())
        monkeypatch.setattr(script, "leave_process_group", lambda: during.append(signal.getsignal(signal.SIGTERM)))
        script.main()

    def preempted():
        raise TrainingPreempted("SIGTERM", 3, None)

    try:
        with pytest.raises(SystemExit) as stopped:
            run_main(preempted)
        assert stopped.value.code == 75
        assert during[0] not in (record, signal.SIG_IGN), "a signal while leaving the process group exits with 75"
        assert all(signal.getsignal(sig) is record for sig in PREEMPTION_SIGNALS), "the caller's handlers are back"
        for callback in at_exit:
            callback()
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in PREEMPTION_SIGNALS), (
            "ignored at exit: the process is exiting with 75 by then"
        )
        for sig in PREEMPTION_SIGNALS:  # the caller's again, for the next run
            signal.signal(sig, record)
        run_main(lambda: str(tmp_path))
        assert all(signal.getsignal(sig) is record for sig in PREEMPTION_SIGNALS)
        for callback in at_exit:
            callback()
        assert len(at_exit) == 1, "one callback, however many runs"
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in PREEMPTION_SIGNALS), "the finished run's exit"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# Loads scripts/train.py (argv[1]) as `script`, its arguments parsed as nothing, in a child Python.
TRAIN_SCRIPT_LOADED = """
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("train_script", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
script.parse = lambda argv: (None, None, types.SimpleNamespace(should_log=False))
"""


SIGNAL_AS_A_PREEMPTED_RUN_EXITS = (
    TRAIN_SCRIPT_LOADED
    + """
import os, signal, threading, time
def preempted(*arguments):
    raise script.TrainingPreempted("SIGTERM", 3, None)
script.train = preempted
def signal_once_main_returned(main=threading.main_thread()):  # the interpreter waits for it before atexit
    while main.is_alive():
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)  # the launcher stopping the other workers
    time.sleep(0.2)
class SignalWhileShuttingDown:  # deleted as the interpreter clears the modules, after its atexit callbacks
    def __del__(self, kill=os.kill, pid=os.getpid(), sigterm=signal.SIGTERM, sleep=time.sleep):
        kill(pid, sigterm)
        sleep(0.1)
if sys.argv[2] == "before atexit":
    threading.Thread(target=signal_once_main_returned).start()
else:
    late = SignalWhileShuttingDown()
script.main()
"""
)


@pytest.mark.parametrize("moment", ["before atexit", "shutting down"])
def test_a_signal_as_a_preempted_run_exits_leaves_its_exit_code(moment):
    """A launcher's SIGTERM to the other workers once one has exited with 75 reaches them as they exit too. The
    interpreter's shutdown (about a second, measured: a second SIGTERM 50 ms and 500 ms after "Exiting with code
    75" was 143) puts the default action back in place of the `os._exit(75)` handler; and between `main()`'s end
    and the atexit callbacks, the caller's handlers were back: the signal killed the run."""
    ended = subprocess.run(
        [sys.executable, "-c", SIGNAL_AS_A_PREEMPTED_RUN_EXITS, str(REPO_ROOT / "scripts" / "train.py"), moment],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.returncode == 75, ended.stderr


SECOND_CTRL_C = (
    TRAIN_SCRIPT_LOADED
    + """
def interrupted(*arguments):
    raise KeyboardInterrupt  # what PreemptionCallback's second Ctrl-C raises in train()
script.train = interrupted
try:
    script.main()  # a notebook's `%run`: the kernel catches it
except KeyboardInterrupt:
    print("went on", flush=True)
script.main()  # the script itself: nothing catches it
"""
)


def test_a_second_ctrl_c_ends_the_script_by_sigint_and_a_caller_that_catches_it_goes_on():
    """Ctrl-C twice: the script killed its own process by SIGINT, so that a shell loop around it stops. Called
    in-process (IPython's `%run`, a notebook), that killed the kernel; the KeyboardInterrupt it raises instead
    reaches the caller, and uncaught, Python itself ends the process by SIGINT."""
    ended = subprocess.run(
        [sys.executable, "-c", SECOND_CTRL_C, str(REPO_ROOT / "scripts" / "train.py")],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ended.stdout == "went on\n", ended.stderr
    assert ended.returncode == -signal.SIGINT, ended.stderr


class Trainer:
    """What a run leaves: a trainer in a reference cycle (as the real one is), which holds the process group."""

    def __init__(self):
        self.itself = self


@pytest.mark.parametrize(
    ("outcome", "exit_code"),
    [
        ("finished", None),
        ("preempted", 75),
        ("failed", "error: disk on fire"),
        ("crashed", 1),
        ("interrupted", KeyboardInterrupt),  # uncaught, Python ends the process by SIGINT: a shell loop stops
    ],
)
def test_the_script_leaves_its_process_group_holding_nothing_of_the_run(
    outcome, exit_code, tmp_path, monkeypatch, capsys
):
    """A gloo group left to interpreter shutdown can abort a finished worker with SIGABRT (pytorch#190489): a
    2-node run exited 1 after saving everything. The script destroys the group after the run, however it ended,
    once nothing of the run holds it: not the exception it ended with (whose traceback holds the trainer), not a
    reference cycle left to the garbage collector. Here, a group of one, as each rank has its own."""
    script = load_train_script()
    trainers = []

    def run(*arguments):
        trainer = Trainer()
        trainers.append(weakref.ref(trainer))
        if outcome == "preempted":
            raise TrainingPreempted("SIGTERM", 3, str(tmp_path / "checkpoint-3"))
        if outcome == "failed":
            raise OSError("disk on fire")
        if outcome == "crashed":  # what no check foresaw (a CUDA error, a bug): the group was left to shutdown
            raise RuntimeError("CUDA out of memory")
        if outcome == "interrupted":
            raise KeyboardInterrupt
        return str(tmp_path)

    left = []
    leave = script.leave_process_group

    def leave_and_record():
        leave()
        left.append(trainers[0]() is None and not torch.distributed.is_initialized())

    monkeypatch.setattr(script, "parse", lambda argv: (None, None, SimpleNamespace(should_log=False)))
    monkeypatch.setattr(script, "train", run)
    monkeypatch.setattr(script, "exit_now_on_signal", lambda code: {})  # would os._exit pytest on a signal
    monkeypatch.setattr(script, "leave_process_group", leave_and_record)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        raised = exit_code if isinstance(exit_code, type) else SystemExit
        with pytest.raises(raised) if exit_code else contextlib.nullcontext() as stopped:
            script.main()
        assert stopped is None or raised is not SystemExit or stopped.value.code == exit_code
        assert left == [True], "the group destroyed once, after the trainer was gone"
        if outcome == "crashed":
            assert "Traceback" in capsys.readouterr().err.splitlines()[0]
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
