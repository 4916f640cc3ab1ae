"""Tests of modeling/presets.py: each preset against what it claims to be (Table 3 and Sec. 5 of the paper for base
and big, fairseq's IWSLT model for small, the CPU demo's comment for tiny), the paper's recipe in every preset's
training defaults, and defaults that `TranslationTrainingArguments` takes as they are. How the script lays flags and
config files over these defaults, checkpoint rotation included, is tested in tests/scripts/test_train_script.py."""

import dataclasses

import pytest
import torch

from modeling.arguments import TranslationTrainingArguments
from modeling.presets import PRESETS, get_preset
from modeling.schedule import noam_learning_rate


def sizes(config) -> tuple:
    """(d_model, layers, heads, d_ff, dropout), the same in both stacks (Table 3's N, h, d_ff, P_drop)."""
    encoder = (config.encoder_layers, config.encoder_attention_heads, config.encoder_ffn_dim)
    decoder = (config.decoder_layers, config.decoder_attention_heads, config.decoder_ffn_dim)
    assert encoder == decoder
    return (config.d_model, *encoder, config.dropout)


def test_the_presets_are_tiny_small_base_and_big():
    assert sorted(PRESETS) == ["base", "big", "small", "tiny"]
    assert all(get_preset(name) is PRESETS[name] for name in PRESETS)


def test_an_unknown_preset_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ValueError) as refused:
        get_preset("huge")
    assert str(refused.value) == "Unknown preset 'huge'; expected one of ['base', 'big', 'small', 'tiny']."


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains_with_the_papers_recipe(name):
    """Sec. 5.3: Adam(0.9, 0.98, 1e-9) without weight decay, the warmup / inverse-square-root schedule; Sec. 5.4:
    label smoothing 0.1; no gradient clipping (the paper mentions none)."""
    defaults = get_preset(name).training_defaults()
    assert (defaults["adam_beta1"], defaults["adam_beta2"], defaults["adam_epsilon"]) == (0.9, 0.98, 1e-9)
    assert (defaults["weight_decay"], defaults["max_grad_norm"]) == (0.0, 0.0)
    assert defaults["paper_schedule"] is True and defaults["label_smoothing_factor"] == 0.1
    # Checkpoints and evaluations (BLEU of generated translations) by updates, the loss to TensorBoard.
    assert (defaults["save_strategy"], defaults["eval_strategy"], defaults["predict_with_generate"]) == (
        "steps",
        "steps",
        True,
    )
    assert defaults["report_to"] == ["tensorboard"]
    # Multi-GPU: every parameter takes part in every update; the other processes wait 4 hours for the main one's BPE
    # and tokenising (WMT English-French outlasts NCCL's default 30 minutes).
    assert defaults["ddp_find_unused_parameters"] is False and defaults["ddp_timeout"] == 4 * 3600


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_presets_defaults_make_training_arguments_unchanged(name, tmp_path):
    """Each default names a field of TranslationTrainingArguments and survives its checks as given."""
    defaults = get_preset(name).training_defaults()
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, **defaults)
    assert {key: getattr(args, key) for key in defaults} == defaults


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_evaluates_its_last_update_and_writes_the_checkpoints_it_averages(name):
    """A budget of updates (max_steps 0 would fall back to 3 epochs); evaluations fall on logged updates and the last
    on the run's last update, so that the finished model is scored (the Trainer evaluates only every eval_steps);
    BLEU on a validation sample; checkpoints often enough that the run writes as many as it averages."""
    preset = get_preset(name)
    assert preset.max_steps > 0 and preset.max_steps % preset.eval_steps == 0
    assert preset.eval_steps % preset.logging_steps == 0 and preset.bleu_sample_size > 0
    assert 0 < preset.save_steps * preset.average_last_checkpoints <= preset.max_steps


@pytest.mark.parametrize("gpu", [True, False])
def test_the_optimizer_is_torchs_fused_adamw_on_a_gpu(gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    assert get_preset("base").training_defaults()["optim"] == ("adamw_torch_fused" if gpu else "adamw_torch")


@pytest.mark.parametrize(
    ("name", "size", "steps", "hours", "averaged"),
    [
        ("base", (512, 6, 8, 2048, 0.1), 100_000, 12, 5),
        ("big", (1024, 6, 16, 4096, 0.3), 300_000, 3.5 * 24, 20),  # P_drop 0.3 for EN-DE; EN-FR's 0.1 is its config's
    ],
)
def test_base_and_big_are_table_3s_models_with_sec_5s_budget(name, size, steps, hours, averaged):
    preset = get_preset(name)
    assert sizes(preset.model_config(preset.vocab_size)) == size
    assert preset.vocab_size == 37000  # Sec. 5.1: EN-DE's shared BPE of about 37000 tokens
    defaults = preset.training_defaults()
    # Sec. 5.2: 100k (base) and 300k (big) steps; Sec. 5.1: batches of about 25000 source and 25000 target tokens.
    assert (defaults["max_steps"], defaults["tokens_per_update"]) == (steps, 25000)
    assert (defaults["warmup_steps"], defaults["learning_rate"]) == (4000, 1.0)  # Sec. 5.3's schedule itself
    assert "max_tokens_per_device" not in defaults, "TranslationTrainingArguments' 4096 per GPU and side"
    # Sec. 6.1: the last 5 (base) / 20 (big) checkpoints averaged, written at 10-minute intervals: at Sec. 5.2's
    # speed (12 hours, 3.5 days) that many updates, so that the average covers the same share of training.
    assert defaults["save_steps"] == round(steps / (hours * 6), -2)
    assert (defaults["average_last_checkpoints"], defaults["save_total_limit"]) == (averaged, averaged)


def test_small_is_fairseqs_iwslt_model_with_the_papers_schedule():
    """fairseq's `transformer_iwslt_de_en`: the base model with 4 heads and d_ff 1024, dropout 0.3, one batch of 4096
    tokens per update."""
    preset = get_preset("small")
    assert sizes(preset.model_config(preset.vocab_size)) == (512, 6, 4, 1024, 0.3)
    assert preset.vocab_size == 10000  # fairseq's prepare-iwslt14.sh: a joint BPE of 10000 tokens
    defaults = preset.training_defaults()
    assert (defaults["warmup_steps"], defaults["learning_rate"], defaults["tokens_per_update"]) == (4000, 1.0, None)
    assert "max_tokens_per_device" not in defaults, "TranslationTrainingArguments' 4096"
    assert (defaults["average_last_checkpoints"], defaults["save_total_limit"]) == (5, 5)


def test_tiny_is_the_cpu_demo_its_comment_describes():
    """d_model 128, 3 + 3 layers, d_ff = 4·d_model, 6000 BPE tokens, 1000 updates of 2048 padded tokens per side, the
    warmup shortened to 400 updates with a multiplier of 0.3 that puts the peak rate at 1.3e-3."""
    preset = get_preset("tiny")
    config = preset.model_config(preset.vocab_size)
    d_model, layers, _, d_ff, dropout = sizes(config)
    assert (d_model, layers, d_ff, dropout) == (128, 3, 4 * 128, 0.1)
    assert config.vocab_size == 6000
    defaults = preset.training_defaults()
    batches = (defaults["max_tokens_per_device"], defaults["tokens_per_update"])
    assert (defaults["max_steps"], *batches) == (1000, 2048, None), "one batch of 2048 padded tokens per update"
    warmup, multiplier = defaults["warmup_steps"], defaults["learning_rate"]
    rates = [multiplier * noam_learning_rate(step, d_model, warmup) for step in range(1, defaults["max_steps"] + 1)]
    assert (warmup, max(rates), rates.index(max(rates)) + 1) == (400, pytest.approx(1.3e-3, rel=0.02), 400)


def test_the_model_config_takes_the_vocabulary_and_overrides_over_the_presets_sizes():
    config = get_preset("small").model_config(123, dropout=0.2, decoder_layers=2)
    assert (config.vocab_size, config.dropout, config.decoder_layers) == (123, 0.2, 2)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.encoder_layers) == (4, 1024, 6), "kept"


@pytest.mark.parametrize(("limit", "averaged"), [(6, 5), (5, 4), (2, 1)])
def test_a_best_checkpoint_kept_in_the_limit_leaves_the_newest_others_to_be_averaged(limit, averaged, tmp_path):
    """With a metric_for_best_model, rotation keeps the best checkpoint in one of save_total_limit's places and the
    newest in the others: a limit that leaves fewer than the preset's 5 makes the preset average those, in arguments
    that are not refused."""
    given = {"save_total_limit": limit, "metric_for_best_model": "eval_sample_bleu"}
    defaults = get_preset("tiny").training_defaults(**given)
    assert defaults["average_last_checkpoints"] == averaged
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, **{**defaults, **given})
    assert (args.save_total_limit, args.average_last_checkpoints) == (limit, averaged)


def test_a_preset_cannot_be_changed_in_place():
    """The presets are shared by every run in the process: one run's change must not reach the next."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_preset("base").max_steps = 10
