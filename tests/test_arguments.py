"""Tests of modeling/arguments.py: each setting taken at the edge of its range and refused past it, when the
arguments are made; how --resume_from_checkpoint is read; checkpoint rotation against averaging. The script's
parsing (presets, config files, flags) is tested in tests/scripts/test_train_script.py, and the launcher's settings
(ddp_backend, mixed precision) in tests/test_trainer.py."""

import dataclasses
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import LAUNCHER_PROCESS_COUNTS, subprocess_env, training_args
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from modeling import arguments
from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments, checkpoint_to_resume


@pytest.mark.parametrize(
    "setting",
    [
        {"max_tokens_per_device": 1},
        {"tokens_per_update": 1},
        {"label_smoothing_factor": 0.0},
        {"label_smoothing_factor": 1.0},
        {"save_every_minutes": 0.5},
        {"max_train_minutes": 0.5},
        {"average_last_checkpoints": 0},
        {"learning_rate": 0.0},  # must not be negative: 0 is taken
    ],
)
def test_each_setting_is_taken_at_the_edge_of_its_range(setting, tmp_path):
    ((name, value),) = setting.items()
    assert getattr(training_args(tmp_path, **setting), name) == value


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"max_tokens_per_device": 0}, "max_tokens_per_device must be positive, got 0."),
        ({"max_train_minutes": 0}, "max_train_minutes must be positive, got 0."),
        ({"average_last_checkpoints": -1}, "average_last_checkpoints must not be negative, got -1."),
        ({"tokens_per_update": 0}, "tokens_per_update must be positive, got 0."),
        ({"label_smoothing_factor": 1.5}, "label_smoothing_factor must be between 0 and 1, got 1.5."),
        ({"label_smoothing_factor": -0.1}, "label_smoothing_factor must be between 0 and 1, got -0.1."),
        ({"learning_rate": -1e-4}, "learning_rate must not be negative, got -0.0001."),
    ],
)
def test_a_setting_past_the_edge_of_its_range_is_refused_naming_it(setting, message, tmp_path):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        training_args(tmp_path, **setting)


@pytest.mark.parametrize(
    ("value", "asked"),
    [
        (None, None),
        ("", None),
        (" None ", None),
        ("false", None),
        ("last", "last"),
        ("TRUE", "last"),
        (" Last ", "last"),
        ("run/checkpoint-8", "run/checkpoint-8"),
    ],
)
def test_resume_from_checkpoint_is_read_as_last_a_path_or_a_fresh_run(value, asked):
    assert checkpoint_to_resume(value) == asked


@pytest.mark.parametrize(
    ("limit", "averaged", "best", "refusal"),
    [
        (1, 2, None, "save_total_limit 1 keeps fewer checkpoints than average_last_checkpoints 2 averages"),
        (
            3,
            3,
            "eval_loss",
            "save_total_limit 3 with metric_for_best_model keeps the best checkpoint and only the 2 newest, fewer "
            "than average_last_checkpoints 3 averages",
        ),
        (4, 3, "eval_loss", None),  # the best and the 3 newest
        (1, 1, "eval_loss", None),  # nothing averaged
    ],
)
def test_a_rotation_that_keeps_fewer_checkpoints_than_the_average_needs_is_refused(
    limit, averaged, best, refusal, tmp_path
):
    """With metric_for_best_model, rotation keeps the best checkpoint in one of the limit's places: an old best
    would be averaged with the newest ones."""
    settings = {"save_total_limit": limit, "average_last_checkpoints": averaged, "metric_for_best_model": best}
    if refusal is None:
        assert training_args(tmp_path, **settings).save_total_limit == limit
    else:
        with pytest.raises(ValueError, match=f"^{re.escape(refusal)}: raise save_total_limit"):
            training_args(tmp_path, **settings)


def test_the_defaults_are_the_documented_ones(tmp_path):
    """What a run gets where neither its preset nor its flags set these: 4096 padded tokens per side and device
    (README, the paper configs), the paper's schedule, no token budget, nothing averaged; en → de, cut at 256 tokens,
    the training pairs cleaned."""
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert (args.max_tokens_per_device, args.paper_schedule, args.tokens_per_update) == (4096, True, None)
    assert (args.average_last_checkpoints, args.save_every_minutes, args.max_train_minutes) == (0, None, None)
    data = DataArguments()
    assert (data.source_lang, data.target_lang, data.max_length, data.clean) == ("en", "de", 256, True)
    # None: the preset's vocabulary and BLEU sample, as many tokenisation processes as cores
    assert (data.vocab_size, data.bleu_sample_size, data.preprocessing_num_workers) == (None, None, None)
    assert ModelArguments().preset == "base"


@pytest.mark.parametrize("fresh", [None, "none", "false", ""])
def test_overwrite_output_dir_is_refused_beside_a_resume_only(fresh, tmp_path):
    """Start over and continue contradict each other; a --resume_from_checkpoint that asks for a fresh run (what
    prepare_output_dir reads as none) does not."""
    assert training_args(tmp_path, overwrite_output_dir=True, resume_from_checkpoint=fresh).overwrite_output_dir
    with pytest.raises(ValueError, match=r"^Give --overwrite_output_dir \(start over\) or --resume_from_checkpoint"):
        training_args(tmp_path, overwrite_output_dir=True, resume_from_checkpoint="last")


def test_a_dataset_revision_is_taken_with_its_dataset_only():
    assert DataArguments(dataset="wmt/wmt14", dataset_revision="v1").dataset_revision == "v1"
    with pytest.raises(ValueError, match=r"^--dataset_revision names a version of --dataset's Hub repo: give that"):
        DataArguments(data_dir="corpus", dataset_revision="v1")


@pytest.mark.parametrize(
    ("world", "local", "nodes"),
    [
        ("16", "8", 2),  # torchrun on 2 machines of 8 GPUs
        (None, "8", 1),
        ("16", None, None),  # a launcher that sets the world size only: nothing tells the nodes
        ("2", None, None),
        ("1", None, 1),
        (None, None, 1),  # no launcher
    ],
)
def test_the_node_count_is_read_from_the_launchers_variables(world, local, nodes, monkeypatch):
    for name, value in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", local)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert arguments._node_count() == nodes


def test_a_run_without_ddp_backend_says_nothing_of_it(tmp_path, caplog):
    """The one-process notice is for a ddp_backend given (a torchrun config requeued on one GPU), not for every run."""
    with caplog.at_level(logging.INFO, logger="modeling.arguments"):
        assert training_args(tmp_path).ddp_backend is None
    assert "ddp_backend" not in caplog.text


def test_the_commit_a_fine_tuning_read_is_no_option():
    """model_commit is what the launch found model_revision at: neither a flag nor a config file sets it."""
    assert ModelArguments().model_commit is None
    with pytest.raises(TypeError, match="model_commit"):
        ModelArguments(model_commit="0" * 40)


@pytest.mark.parametrize("launcher_variable", LAUNCHER_PROCESS_COUNTS)
def test_a_ddp_backend_under_a_launcher_of_several_processes_is_kept(
    launcher_variable, tmp_path, monkeypatch, no_launcher
):
    """torchrun or an MPI launcher of 2 processes: the backend joins them, so transformers' setup (stopped here
    where it would start the process group) must be given it, whichever variable the launcher sets."""
    monkeypatch.setenv(launcher_variable, "2")
    # not on CPUs: there the process group is started before transformers' setup, which needs a rendezvous
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    given = []

    def setup(self):
        given.append(self.ddp_backend)
        raise InterruptedError

    monkeypatch.setattr(Seq2SeqTrainingArguments, "__post_init__", setup)
    with pytest.raises(InterruptedError):
        TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", ddp_backend="gloo")
    assert given == ["gloo"]


@pytest.mark.parametrize("text", ["", "cpu"])
def test_an_accelerate_use_cpu_that_is_no_truth_value_is_refused_naming_it(text, tmp_path, monkeypatch, no_launcher):
    """transformers' strtobool said "invalid truth value ''", naming no variable."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", text)
    with pytest.raises(ValueError, match=rf"^ACCELERATE_USE_CPU={text!r} in the environment is not true or false"):
        TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none")


@pytest.mark.parametrize("text", ["", "two"])
def test_a_launcher_variable_that_is_no_process_count_is_refused_naming_it(text, tmp_path, monkeypatch, no_launcher):
    """It failed with int()'s bare "invalid literal for int() with base 10: ''", naming no variable."""
    monkeypatch.setenv("PMI_SIZE", text)
    with pytest.raises(ValueError, match=rf"^PMI_SIZE={text!r} in the environment is not a process count; unset it"):
        TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", ddp_backend="gloo")


@pytest.mark.parametrize(("name", "settings"), [("WORLD_SIZE", {}), ("LOCAL_WORLD_SIZE", {"save_on_each_node": True})])
def test_torchruns_variable_that_is_no_process_count_is_refused_naming_it(
    name, settings, tmp_path, monkeypatch, no_launcher
):
    """accelerate's int() of WORLD_SIZE, and save_on_each_node's count of the machines, failed with a bare "invalid
    literal for int()" naming no variable."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv(name, "two")
    with pytest.raises(ValueError, match=rf"^{name}='two' in the environment is not a process count; unset it"):
        TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **settings)


def test_max_steps_0_is_refused_as_transformers_would_train_by_epochs(tmp_path):
    with pytest.raises(ValueError, match=r"^max_steps 0 would train num_train_epochs epochs"):
        training_args(tmp_path, max_steps=0)
    with pytest.raises(ValueError, match=r"^max_steps -5000 would train num_train_epochs epochs"):  # was 3 epochs
        training_args(tmp_path, max_steps=-5000)
    assert training_args(tmp_path, max_steps=-1).max_steps == -1  # by epochs, asked for


def test_the_model_overrides_resize_encoder_and_decoder_alike():
    """--num_layers is N of both stacks, --num_heads h of both attentions, --ffn_dim d_ff of both; unset: none."""
    assert ModelArguments().config_overrides() == {}
    overrides = ModelArguments(d_model=64, num_layers=3, num_heads=8, ffn_dim=256, dropout=0.2).config_overrides()
    assert overrides == {
        "d_model": 64,
        "encoder_layers": 3,
        "decoder_layers": 3,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_ffn_dim": 256,
        "decoder_ffn_dim": 256,
        "dropout": 0.2,
    }


def test_every_option_this_module_adds_is_described_in_the_help():
    """`train.py --help`: an option without its line says nothing of what it does (nor that a preset sets it)."""
    inherited = {field.name for field in dataclasses.fields(Seq2SeqTrainingArguments)}
    groups = (ModelArguments, DataArguments, TranslationTrainingArguments)
    own = [field.name for group in groups for field in dataclasses.fields(group) if field.init]
    own = [name for name in own if name not in inherited]
    helps = {action.dest: action.help for action in HfArgumentParser(groups)._actions}
    assert set(own) <= set(helps)
    assert [name for name in own if not helps[name]] == []


@pytest.mark.parametrize("mixed_precision", [None, "no"])
def test_a_launch_without_mixed_precision_trains_and_says_float32(mixed_precision, tmp_path, monkeypatch, caplog):
    """No ACCELERATE_MIXED_PRECISION, or `no`: nothing to take on, and no autocast warning."""
    if mixed_precision is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", mixed_precision)
    with caplog.at_level(logging.WARNING, logger="modeling.arguments"):
        args = training_args(tmp_path)
    assert (args.bf16, args.fp16) == (False, False)
    assert "autocast" not in caplog.text
    assert not hasattr(args, "no")


def test_fp16_from_accelerate_launch_is_taken_on_an_accelerator(tmp_path, monkeypatch):
    """Only a CPU trains float32 under fp16 (accelerate's rule): on a GPU the run is fp16 and says so."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    cpu = TranslationTrainingArguments.device  # its setup still runs: a GPU is what it reports, not what it uses
    monkeypatch.setattr(
        TranslationTrainingArguments, "device", property(lambda self: (cpu.fget(self), torch.device("cuda"))[1])
    )
    assert training_args(tmp_path).fp16


def test_a_launch_precision_the_arguments_override_is_said_to_be_set_aside(tmp_path, monkeypatch, caplog):
    """accelerate launch's `mixed_precision: fp16` beside the training config's `bf16: true` trained bf16, and the
    launch's fp16 was set aside without a word."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with caplog.at_level(logging.WARNING, logger="modeling.arguments"):
        args = training_args(tmp_path, bf16=True)
    assert (args.bf16, args.fp16, args.mixed_precision) == (True, False, "bf16")
    assert (
        "Training with bf16, as the training arguments ask: ACCELERATE_MIXED_PRECISION=fp16 (set by accelerate launch "
        "from its config, or in the environment) is not taken" in caplog.text
    )
    caplog.clear()
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # the same precision: nothing set aside
    with caplog.at_level(logging.WARNING, logger="modeling.arguments"):
        training_args(tmp_path, bf16=True)
    assert caplog.text == ""


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type cosine"),
        ({"lr_scheduler_kwargs": {"num_cycles": 2}}, "lr_scheduler_kwargs"),
    ],
)
def test_a_scheduler_setting_the_papers_schedule_does_not_use_is_refused(settings, named, tmp_path):
    """A config's `lr_scheduler_type: cosine` trained with the schedule of Sec. 5.3 (on by default), and the run's
    records left the type out: nothing said it was not used."""
    with pytest.raises(ValueError, match=rf"^{named}: used with --no_paper_schedule only \(learning_rate then the"):
        training_args(tmp_path, **settings)
    assert training_args(tmp_path, paper_schedule=False, **settings).lr_scheduler_type == settings.get(
        "lr_scheduler_type", "linear"
    )


@pytest.mark.parametrize("name", ["per_device_train_batch_size", "per_device_eval_batch_size"])
def test_a_batch_size_in_sentences_is_refused_as_batches_are_token_budgets(name, tmp_path):
    """`per_device_train_batch_size: 64`, as in Hugging Face's examples, trained on token-budget batches of the
    same sizes as without it, and the run's records left it out."""
    with pytest.raises(ValueError, match=rf"^{name} 64: batches here are token budgets, not numbers of sentences"):
        training_args(tmp_path, **{name: 64})


@pytest.mark.parametrize("config", [{"split_batch": True}, '{"split_batch": true}'], ids=["mapping", "json"])
def test_an_accelerator_config_key_accelerate_lacks_is_refused_naming_it(config, tmp_path):
    """A config file's `accelerator_config: {split_batch: true}` failed with "AcceleratorConfig.__init__() got an
    unexpected keyword argument 'split_batch'" and its traceback."""
    with pytest.raises(
        ValueError, match=r"^accelerator_config: unknown keys \['split_batch'\]; it takes \[.*'split_batches'"
    ):
        training_args(tmp_path, accelerator_config=config)
    assert training_args(tmp_path, accelerator_config={"even_batches": True}).accelerator_config.even_batches


@pytest.mark.parametrize("output_dir", ["", "  "])
def test_a_blank_output_dir_is_refused_before_anything_is_written(output_dir):
    """`--output_dir $OUT` with OUT unset: the run wrote .training.lock, run_identity.json and the tokenizer into the
    working directory, then stopped on "[Errno 2] No such file or directory: ''"."""
    with pytest.raises(ValueError, match=r"^--output_dir is empty \(a shell variable not set\?\): give its value"):
        TranslationTrainingArguments(output_dir=output_dir, use_cpu=True, report_to="none")


@pytest.mark.parametrize("value", ["BF16", "bf16 ", "float32"])
def test_a_mixed_precision_accelerate_does_not_know_is_refused_naming_the_variable(value, tmp_path, monkeypatch):
    """ACCELERATE_MIXED_PRECISION=BF16 (set by hand: accelerate launch writes it in lower case) failed only where the
    Trainer was built, after the BPE was trained and saved, with "Unknown mixed_precision mode: BF16"."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", value)
    with pytest.raises(ValueError, match=rf"^ACCELERATE_MIXED_PRECISION={re.escape(repr(value))} in the environment"):
        training_args(tmp_path)
    assert training_args(tmp_path, bf16=True).bf16, "not read where the arguments give the precision"


def test_fp16_on_a_cpu_is_refused_as_accelerate_trains_float32_there(tmp_path, monkeypatch):
    """accelerate autocasts fp16 on accelerators only: `fp16: true` on a CPU trained float32, and training_args.json,
    the model card and a resume's precision check said fp16."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    with pytest.raises(ValueError, match=r"^fp16 needs a GPU: on a CPU accelerate trains float32, which the run's"):
        training_args(tmp_path, fp16=True)


def test_the_precision_of_accelerate_launch_is_left_to_the_deepspeed_config_under_deepspeed(tmp_path, monkeypatch):
    """DeepSpeed's config decides the precision, and transformers refuses arguments that contradict it: taking
    accelerate's bf16 on as well would contradict a config that trains fp16 or float32. transformers' setup, which
    would load DeepSpeed (not installed here), is replaced by what it records of the launch, on the main process."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")

    def setup(self):
        self.mixed_precision = os.environ["ACCELERATE_MIXED_PRECISION"]

    monkeypatch.setattr(Seq2SeqTrainingArguments, "__post_init__", setup)
    monkeypatch.setattr(TranslationTrainingArguments, "should_log", True)
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), report_to="none", deepspeed={"fp16": {"enabled": True}}
    )
    assert (args.bf16, args.fp16) == (False, False)


TIMEOUT_WORKER = """
import os, sys, time
sys.path.insert(0, {tests_dir!r})
import torch, torch.distributed as dist
from helpers import training_args
args = training_args({out!r}, ddp_backend="gloo", ddp_timeout=3)
if args.process_index == 1:
    time.sleep(12)  # hung (an NFS write, a stopped process): then gone
    os._exit(0)
start = time.monotonic()
try:
    dist.all_reduce(torch.zeros(1))
except RuntimeError as error:
    print(round(time.monotonic() - start), "Timed out" in str(error))
os._exit(0)
"""


def test_ddp_timeout_bounds_a_collective_on_cpus_as_on_accelerators(tmp_path):
    """transformers passes ddp_timeout to the process group on accelerators only: on CPUs (gloo), a process left
    waiting for a hung one waited torch's default 30 minutes, whatever ddp_timeout (or the presets' 4 hours) said."""
    worker = tmp_path / "worker.py"
    worker.write_text(TIMEOUT_WORKER.format(tests_dir=str(Path(__file__).parent), out=str(tmp_path)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    launched = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(worker)],
            env=subprocess_env(**launched, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    waited = ranks[0].communicate(timeout=120)[0]
    ranks[1].kill()
    ranks[1].wait(timeout=120)
    assert waited.split() == ["3", "True"], "gave up after ddp_timeout, not when the hung process was gone"
