"""Tests of modeling/modeling_transformer.py: the architecture of the paper, its loss, and the Hugging Face contracts
(saving, loading, tying, attention implementations, gradient checkpointing, compile)."""

import base64
import json
import math
import re

import numpy as np
import pytest
import torch
from accelerate import infer_auto_device_map
from helpers import EOS, FAIRSEQ_FIXTURES, PAD, batch, labelled_batch, sources, tiny_model
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.integrations.neftune import activate_neftune

from modeling import TransformerForConditionalGeneration, TransformerModel, modeling_transformer
from modeling.modeling_transformer import sinusoidal_positional_encoding
from modeling.quantization import quantize_int8

VOCAB = 50


# The fused loss's tests also run on a GPU where there is one: its chunks and autocast take other kernels there.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_positional_table_follows_the_paper_formula(layout):
    d_model, positions = 16, 40
    table = sinusoidal_positional_encoding(torch.arange(positions), d_model, layout)
    for pos in range(positions):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            sin_dim, cos_dim = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, d_model // 2 + i)
            assert table[pos, sin_dim].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, cos_dim].item() == pytest.approx(math.cos(angle), abs=1e-6)


def fairseq_sinusoids(num_positions: int, d_model: int) -> torch.Tensor:
    """fairseq's `SinusoidalPositionalEmbedding.get_embedding` (fairseq/modules/sinusoidal_positional_embedding.py):
    its float32 operations in its order, without the zeroed padding row."""
    half_dim = d_model // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float) * -emb)
    emb = torch.arange(num_positions, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    return torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_positions, -1)


def test_tensor2tensor_frequencies_are_fairseqs_sinusoids_to_the_bit():
    """fairseq's operations, run on this machine, give the same numbers to the bit; the same formula computed in
    float64 would not."""
    for d_model in (24, 1024):
        ours = sinusoidal_positional_encoding(torch.arange(1026), d_model, "concatenated", "tensor2tensor")
        assert torch.equal(ours, fairseq_sinusoids(1026, d_model)), d_model
    half = 512
    frequencies = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1)))
    in_float64 = torch.cat([(1000 * frequencies).sin(), (1000 * frequencies).cos()]).float()
    assert (in_float64 - fairseq_sinusoids(1026, 1024)[1000]).abs().max() > 1e-5
    assert frequencies[-1].item() == pytest.approx(1e-4, rel=1e-12)  # the last wavelength is exactly 10000


def test_tensor2tensor_frequencies_give_the_rows_fairseq_recorded():
    """Rows fairseq itself computed (tests/fixtures/fairseq/make_pipeline_cases.py; on the CPU that recorded them
    ours were within 1e-6). On another CPU torch's vectorised float32 exp may differ in a frequency's last bit (4.7e-5
    at position 1000 on an AVX2 CPU), which position p turns into at most p · 2^-23 in the angle."""
    recorded = json.loads((FAIRSEQ_FIXTURES / "pipeline_cases.json").read_text())["positions"]
    for d_model, rows in recorded.items():
        for row, encoded in rows.items():
            fairseq_row = torch.from_numpy(np.frombuffer(base64.b64decode(encoded), dtype=np.float32).copy())
            ours = sinusoidal_positional_encoding(
                torch.tensor([int(row)]), int(d_model), "concatenated", "tensor2tensor"
            )
            assert torch.max(torch.abs(ours[0] - fairseq_row)) <= 1e-6 + int(row) * 2**-23, (d_model, row)


def test_positional_offset_shifts_every_position_the_module_gives():
    shifted = tiny_model(positional_encoding_offset=2, positional_encoding_frequencies="tensor2tensor")
    plain = tiny_model(positional_encoding_frequencies="tensor2tensor")
    for stack in ("encoder", "decoder"):
        ours = getattr(shifted.model, stack).embed_positions
        reference = getattr(plain.model, stack).embed_positions
        assert torch.equal(ours(0, 10), reference(2, 10))
        assert torch.equal(ours(70, 5), reference(72, 5))  # beyond the table (64 rows): computed, still shifted
    ids = torch.randint(3, VOCAB, (1, 7))
    with torch.no_grad():
        logits = [model(input_ids=ids, decoder_input_ids=ids).logits for model in (shifted, plain)]
    assert not torch.allclose(*logits)


def test_tensor2tensor_frequencies_of_the_smallest_model_are_one_sinusoid():
    """d_model 2 (the smallest the config accepts) has one frequency, 1: fairseq's formula divides by d_model/2 - 1."""
    positions = torch.arange(5)
    table = sinusoidal_positional_encoding(positions, 2, "concatenated", "tensor2tensor")
    assert torch.equal(table, torch.stack((positions.float().sin(), positions.float().cos()), dim=-1))


def test_positions_beyond_the_table_use_the_same_formula():
    model = tiny_model(max_position_embeddings=8)
    encoding = model.model.encoder.embed_positions
    assert torch.equal(encoding(5, 3), encoding.table[5:8])
    expected = sinusoidal_positional_encoding(torch.arange(6, 20), 32, "interleaved")
    assert torch.allclose(encoding(6, 14), expected)
    ids = torch.randint(3, VOCAB, (1, 20))  # longer than the table: still runs
    assert model(input_ids=ids, decoder_input_ids=ids).logits.shape == (1, 20, VOCAB)


def test_positional_table_is_not_saved_and_is_rebuilt_by_from_pretrained(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert not any("embed_positions" in name for name in load_file(tmp_path / "model.safetensors"))
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path)  # built on the meta device
    expected = sinusoidal_positional_encoding(torch.arange(64), 32, "interleaved")
    assert torch.equal(loaded.model.encoder.embed_positions.table, expected)
    assert torch.equal(loaded.model.decoder.embed_positions.table, expected)


@torch.no_grad()
def test_a_model_built_on_the_meta_device_and_loaded_by_load_state_dict_has_the_positional_table():
    """PyTorch's way (FSDP2, torchtitan): `to_empty()` gives the unsaved table uninitialised memory, and
    `load_state_dict` holds none to load."""
    model = tiny_model()
    with torch.device("meta"):
        empty = TransformerForConditionalGeneration(model.config)
    empty = empty.to_empty(device="cpu").eval()
    empty.model.encoder.embed_positions.table.fill_(float("nan"))  # what uninitialised memory may hold
    empty.load_state_dict(model.state_dict())
    assert torch.equal(empty.model.encoder.embed_positions.table, model.model.encoder.embed_positions.table)
    assert torch.equal(empty(**batch()).logits, model(**batch()).logits)
    learned = {"model.encoder.embed_positions.table": torch.randn(64, 32)}  # e.g. another model's learned positions
    with pytest.raises(
        RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"model.encoder.embed_positions.table"
    ):
        empty.load_state_dict({**model.state_dict(), **learned})  # strict: named, not silently replaced by sinusoids


def test_each_stack_reads_scaled_embeddings_plus_the_encodings_of_positions_from_0():
    """Sec. 3.4 and 3.5: the first layer's input is sqrt(d_model) · embedding + PE(pos) for pos = 0, 1, ..."""
    model = tiny_model()
    inputs = batch()
    first_layer_inputs = {}
    for stack in ("encoder", "decoder"):

        def record(module, args, stack=stack) -> None:  # returning anything would replace the layer's arguments
            first_layer_inputs[stack] = args[0]

        getattr(model.model, stack).layers[0].register_forward_pre_hook(record)
    model(**inputs)
    for stack, ids in (("encoder", inputs["input_ids"]), ("decoder", inputs["decoder_input_ids"])):
        positions = sinusoidal_positional_encoding(torch.arange(ids.shape[1]), 32, "interleaved")
        expected = model.model.shared(ids) * math.sqrt(32) + positions
        assert torch.allclose(first_layer_inputs[stack], expected, atol=1e-6), stack


def test_post_layer_norm_and_no_final_layer_norm():
    """Each stack ends on its last layer's LayerNorm(x + Sublayer(x)): the output has zero mean and unit variance
    per position, and is exactly that LayerNorm's output (no extra normalisation after the stack)."""
    model = tiny_model()
    captured = {}
    last_encoder_norm = model.model.encoder.layers[-1].final_layer_norm
    last_encoder_norm.register_forward_hook(lambda module, args, output: captured.setdefault("encoder", output))
    last_decoder_norm = model.model.decoder.layers[-1].final_layer_norm
    last_decoder_norm.register_forward_hook(lambda module, args, output: captured.setdefault("decoder", output))
    out = model.model(**batch())
    assert torch.equal(out.encoder_last_hidden_state, captured["encoder"])
    assert torch.equal(out.last_hidden_state, captured["decoder"])
    for hidden in (out.encoder_last_hidden_state, out.last_hidden_state):
        assert torch.allclose(hidden.mean(-1), torch.zeros(()), atol=1e-5)
        assert torch.allclose(hidden.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    layer_norms = [name for name, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(layer_norms) == 2 * 2 + 3 * 2  # two per encoder layer, three per decoder layer, no others


def test_feed_forward_is_relu_and_projections_follow_the_paper():
    model = tiny_model()
    layer = model.model.encoder.layers[0]
    x = torch.randn(3, 32)
    expected = layer.ffn.fc2(torch.relu(layer.ffn.fc1(x)))  # nn.Linear: MKL's products, oneDNN's in the layer
    assert torch.allclose(layer.ffn(x), expected, atol=1e-6)
    assert layer.self_attn.q_proj.bias is None and layer.self_attn.out_proj.bias is None  # Sec. 3.2.2: W^Q, W^O
    assert layer.ffn.fc1.bias is not None  # Eq. 2: x W_1 + b_1


def test_embeddings_are_scaled_by_sqrt_d_model_and_share_one_matrix():
    model = tiny_model()
    shared = model.model.shared.weight
    for weight in (model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight):
        assert weight.data_ptr() == shared.data_ptr()
    assert model.lm_head.weight.data_ptr() == shared.data_ptr()
    assert len({p.data_ptr() for p in model.parameters()}) == len(list(model.parameters()))
    assert model.model.encoder.embed_scale == math.sqrt(32)


def test_initialisation_as_fairseq():
    model = tiny_model(d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)
    shared = model.model.shared.weight
    assert torch.count_nonzero(shared[PAD]) == 0
    assert shared[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
    q_proj = model.model.encoder.layers[0].self_attn.q_proj.weight
    xavier_bound = math.sqrt(6 / (64 + 64))
    assert q_proj.abs().max().item() <= xavier_bound
    assert q_proj.std().item() == pytest.approx(xavier_bound / math.sqrt(3), rel=0.1)
    assert torch.count_nonzero(model.model.encoder.layers[0].ffn.fc1.bias) == 0  # fairseq's zero biases
    no_padding = tiny_model(pad_token_id=None).model.shared.weight
    assert no_padding.std().item() == pytest.approx(32**-0.5, rel=0.1), "no padding row: nothing zeroed"


def test_a_checkpoint_s_padding_row_is_loaded_as_saved(tmp_path):
    """Only a new embedding's padding row starts at zero; a converted model's may hold trained values."""
    model = tiny_model()
    with torch.no_grad():
        model.model.shared.weight[PAD] = 0.5
    model.save_pretrained(tmp_path)
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.model.shared.weight[PAD], torch.full((32,), 0.5))


def test_padding_does_not_change_the_output():
    model = tiny_model()
    inputs = batch()
    padded = model(**inputs).logits[1]
    alone = model(
        input_ids=inputs["input_ids"][1:, :4],
        attention_mask=inputs["attention_mask"][1:, :4],
        decoder_input_ids=inputs["decoder_input_ids"][1:],
    ).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def test_decoder_is_causal():
    model = tiny_model()
    inputs = batch()
    logits = model(**inputs).logits
    changed = inputs["decoder_input_ids"].clone()
    changed[:, 3] = 30
    logits_changed = model(**{**inputs, "decoder_input_ids": changed}).logits
    assert torch.allclose(logits[:, :3], logits_changed[:, :3], atol=1e-6)
    assert not torch.allclose(logits[:, 3], logits_changed[:, 3])


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_all_padding_row_yields_no_nan(attn_implementation):
    model = tiny_model()
    model.set_attn_implementation(attn_implementation)
    inputs = batch()
    inputs["attention_mask"][1] = 0
    out = model(**inputs)
    assert torch.isfinite(out.logits).all()
    half = tiny_model().half()
    half.set_attn_implementation(attn_implementation)
    assert torch.isfinite(half(**inputs).logits).all()  # the dtype's minimum, not -1e9, masks in fp16


def test_eager_and_sdpa_agree():
    eager, sdpa = tiny_model(), tiny_model()
    eager.set_attn_implementation("eager")
    sdpa.set_attn_implementation("sdpa")
    assert torch.allclose(eager(**batch()).logits, sdpa(**batch()).logits, atol=1e-5)


@torch.no_grad()  # flex attention has no backward on CPU
def test_flex_attention_agrees_with_eager():
    eager, flex = tiny_model(), tiny_model()
    eager.set_attn_implementation("eager")
    flex.set_attn_implementation("flex_attention")
    assert torch.allclose(eager(**batch()).logits, flex(**batch()).logits, atol=1e-5)


def test_output_attentions_returns_all_three_kinds():
    model = tiny_model()
    model.set_attn_implementation("eager")
    out = model(**batch(), output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (2, 4, 6, 6)
    assert out.decoder_attentions[0].shape == (2, 4, 4, 4)
    assert out.cross_attentions[0].shape == (2, 4, 4, 6)
    assert torch.allclose(out.cross_attentions[0].sum(-1), torch.ones(2, 4, 4))
    assert torch.all(out.cross_attentions[0][1, :, :, 4:] == 0)  # padded source positions get no attention


def test_the_cache_a_forward_pass_returns_continues_its_decoding_and_training_keeps_none():
    model = tiny_model()
    inputs = batch()
    full = model(**inputs).logits
    prefix = model(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"][:, :3]})
    step = model(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"][:, 3:], "cache": prefix.cache})
    assert torch.allclose(step.logits[:, 0], full[:, 3], atol=1e-5), "the fourth token, read at position 3"
    assert model(**inputs, use_cache=False).cache is None
    assert model.train()(**labelled_batch()).cache is None, "a training step holds no keys and values"


def test_return_dict_false_gives_a_tuple():
    out = tiny_model()(**batch(), return_dict=False)
    assert isinstance(out, tuple) and out[0].shape == (2, 4, VOCAB)


def test_cpu_dropout_drops_at_rate_p_and_scales_the_kept_by_one_over_one_minus_p():
    from modeling.modeling_transformer import apply_dropout

    torch.manual_seed(0)
    ones = torch.ones(1_000_001, requires_grad=True)  # an odd count: the last 64-bit word is used by half
    dropped = apply_dropout(ones, 0.1, training=True)
    kept = dropped != 0
    # Binomial(10^6, 0.1) has a standard deviation of 3e-4: six of them.
    assert abs(1 - kept.float().mean().item() - 0.1) < 1.8e-3
    assert torch.equal(dropped[kept], torch.full_like(dropped[kept], 1 / 0.9))
    dropped.sum().backward()
    assert torch.equal(ones.grad, kept * (1 / 0.9))


def test_cpu_dropout_follows_the_seed_and_keeps_shape_and_dtype():
    from modeling.modeling_transformer import apply_dropout

    x = torch.randn(3, 5, 7, dtype=torch.bfloat16)
    torch.manual_seed(1)
    first = apply_dropout(x, 0.3, training=True)
    torch.manual_seed(1)
    assert torch.equal(apply_dropout(x, 0.3, training=True), first)
    assert not torch.equal(apply_dropout(x, 0.3, training=True), first)
    assert first.shape == x.shape and first.dtype == torch.bfloat16
    assert apply_dropout(x, 0.3, training=False) is x and apply_dropout(x, 0.0, training=True) is x
    assert torch.equal(apply_dropout(x, 1.0, training=True), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        apply_dropout(x, 1.5, training=True)


def test_loss_ignores_minus_100_and_uses_shifted_labels():
    model = tiny_model()
    inputs = batch()
    labels = torch.tensor([[20, 21, 22, EOS], [23, 24, EOS, -100]])
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels)
    logits = out.logits
    mask = labels.ne(-100)
    expected = torch.nn.functional.cross_entropy(logits[mask], labels[mask])
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    assert decoder_input_ids.tolist() == [[EOS, 20, 21, 22], [EOS, 23, 24, EOS]]
    given = {**inputs, "labels": labels}  # decoder inputs given with the labels are the ones read
    assert torch.equal(model(**given).logits, model(**inputs).logits)


def test_label_smoothed_loss_equals_transformers_label_smoother():
    from transformers.trainer_pt_utils import LabelSmoother

    model = tiny_model()
    inputs = batch()
    labels = torch.tensor([[20, 21, 22, EOS], [23, 24, EOS, -100]])
    full = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "labels": labels}
    out = model(**full, smoothing_epsilon=0.1, num_items_in_batch=torch.tensor(11))
    expected = LabelSmoother(epsilon=0.1)(out, labels, num_items_in_batch=torch.tensor(11))
    plain = model(**full, num_items_in_batch=torch.tensor(11)).loss
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert abs(out.loss.item() - plain.item()) > 1e-3, "smoothing should change the loss"


def test_accumulating_two_half_batches_with_num_items_gives_the_full_batch_gradient():
    model = tiny_model()
    model.train()
    model.config.dropout = 0.0
    for module in model.modules():
        if hasattr(module, "dropout") and isinstance(module.dropout, float):
            module.dropout = 0.0
    inputs = batch()
    labels = torch.tensor([[20, 21, 22, EOS], [23, EOS, -100, -100]])  # unequal token counts per half
    full = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"], "labels": labels}

    model(**full).loss.backward()
    full_gradients = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    num_items = labels.ne(-100).sum()
    for half in (slice(0, 1), slice(1, 2)):
        model(**{k: v[half] for k, v in full.items()}, num_items_in_batch=num_items).loss.backward()
    for full_gradient, p in zip(full_gradients, model.parameters(), strict=True):
        assert torch.allclose(full_gradient, p.grad, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smoothing_epsilon", [0.0, 0.1, 1.0])  # 1: F.cross_entropy's largest
@pytest.mark.parametrize("rows_per_chunk", [None, 3])  # one chunk, or several with a short last one
def test_fused_training_loss_has_the_unfused_value_and_gradients(
    monkeypatch, smoothing_epsilon, rows_per_chunk, device
):
    if rows_per_chunk is not None:
        monkeypatch.setattr(modeling_transformer, "LOSS_CHUNK_ELEMENTS", rows_per_chunk * VOCAB)
    full = labelled_batch(device)
    results = {}
    for skip_logits in (True, False):
        model = tiny_model(dropout=0.0).to(device).train()
        out = model(**full, smoothing_epsilon=smoothing_epsilon, num_items_in_batch=7, skip_logits=skip_logits)
        (2.5 * out.loss).backward()  # a gradient of the loss other than 1 reaches the fused backward
        results[skip_logits] = (out, {name: p.grad for name, p in model.named_parameters()})
    (fused, fused_gradients), (unfused, unfused_gradients) = results[True], results[False]
    assert fused.logits is None and unfused.logits.shape == (2, 4, VOCAB)
    assert fused.loss.item() == pytest.approx(unfused.loss.item(), rel=1e-6)
    assert fused_gradients.keys() == unfused_gradients.keys()
    atol = 1e-6 if device == "cpu" else 1e-5  # GPU kernels sum in other orders
    for name, gradient in unfused_gradients.items():
        assert torch.allclose(fused_gradients[name], gradient, atol=atol), name


@pytest.mark.parametrize("device", DEVICES)
def test_training_forward_fuses_the_loss_by_default_on_cpu_only(device):
    """On an H200 the plain loss made the bf16 training step 1.2-1.4x faster than the fused one: GPUs take it."""
    model = tiny_model().to(device).train()
    fused = model(**labelled_batch(device)).logits is None
    assert fused == (device == "cpu")
    assert model(**labelled_batch(device), skip_logits=True).logits is None


def test_a_tuple_output_in_training_holds_the_logits_second_as_marian_s():
    """The fused default dropped the logits, and a tuple drops what is None: outputs[1] was the encoder's states."""
    model = tiny_model().train()
    torch.manual_seed(0)
    loss, logits = model(**labelled_batch("cpu"), return_dict=False)[:2]
    torch.manual_seed(0)
    expected = model(**labelled_batch("cpu"), skip_logits=False)
    assert torch.equal(logits, expected.logits) and torch.allclose(loss, expected.loss)


@pytest.mark.parametrize("skip_logits", [True, False])
@pytest.mark.parametrize("smoothing_epsilon", [1.5, -0.1])
def test_both_losses_refuse_a_smoothing_epsilon_outside_0_to_1_alike(skip_logits, smoothing_epsilon):
    model = tiny_model().train()
    with pytest.raises(ValueError, match=f"smoothing_epsilon must be between 0 and 1, got {smoothing_epsilon}"):
        model(**labelled_batch(), smoothing_epsilon=smoothing_epsilon, skip_logits=skip_logits)


def test_training_forward_skips_the_logits_only_when_it_computes_a_loss_to_train_on():
    model = tiny_model().train()
    inputs = labelled_batch()
    assert model(**inputs).logits is None  # the Trainer's training step on CPU: the loss alone
    assert model(**inputs, skip_logits=False).logits.shape == (2, 4, VOCAB)
    assert model(**batch()).logits.shape == (2, 4, VOCAB)  # no labels: no loss to fuse with
    with torch.no_grad():
        assert model(**inputs).logits.shape == (2, 4, VOCAB)  # evaluation loss: logits for the metrics
    assert model.eval()(**inputs).logits.shape == (2, 4, VOCAB)
    with pytest.raises(ValueError, match="skip_logits=True returns only the loss: pass labels"):
        model(**batch(), skip_logits=True)


def test_training_forward_never_bypasses_an_lm_head_hook_or_a_replaced_lm_head():
    inputs = labelled_batch()
    model = tiny_model().train()
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    assert model(**inputs).logits.shape == (2, 4, VOCAB) and seen == [(2, 4, VOCAB)]
    with pytest.raises(ValueError, match="would bypass this lm_head"):
        model(**inputs, skip_logits=True)
    handle.remove()

    class ScaledHead(torch.nn.Linear):  # stands for an adapter or a quantised layer
        def forward(self, hidden_states):
            return 2 * super().forward(hidden_states)

    head = ScaledHead(model.config.d_model, VOCAB, bias=False)
    head.weight = model.lm_head.weight
    model.set_output_embeddings(head)
    assert model(**inputs).logits.shape == (2, 4, VOCAB)

    class Wrapped(torch.nn.Module):  # a wrapper with no `weight` of its own (a LoRA-style or logging wrapper)
        def __init__(self, inner: torch.nn.Linear):
            super().__init__()
            self.inner = inner

        def forward(self, hidden_states):
            return self.inner(hidden_states)

    model.set_output_embeddings(Wrapped(model.lm_head))
    assert model(**inputs).logits.shape == (2, 4, VOCAB)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_loss_under_bf16_autocast_matches_the_plain_loss_with_float32_gradients(device):
    inputs = labelled_batch(device)
    results = {}
    for skip_logits in (True, False):
        model = tiny_model(dropout=0.0).to(device).train()
        with torch.autocast(device, dtype=torch.bfloat16):  # as the GPU recipe trains: fp32 weights, bf16 products
            loss = model(**inputs, smoothing_epsilon=0.1, skip_logits=skip_logits).loss
        loss.backward()
        results[skip_logits] = (loss, model.lm_head.weight.grad)
    (fused_loss, fused_gradient), (plain_loss, plain_gradient) = results[True], results[False]
    assert fused_gradient.dtype == torch.float32
    assert fused_loss.item() == pytest.approx(plain_loss.item(), rel=1e-2)
    assert torch.allclose(fused_gradient, plain_gradient, rtol=0.05, atol=2e-3)


def test_training_step_compiles_as_one_graph_with_the_plain_loss():
    inputs = labelled_batch()
    eager = tiny_model(dropout=0.0).train()
    compiled_model = tiny_model(dropout=0.0).train()
    compiled = torch.compile(compiled_model, fullgraph=True)  # fails on a graph break
    expected, out = eager(**inputs), compiled(**inputs)
    expected.loss.backward()
    out.loss.backward()
    assert expected.logits is None and out.logits is not None  # the fused loss is left to eager mode
    assert out.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    assert torch.allclose(compiled_model.lm_head.weight.grad, eager.lm_head.weight.grad, atol=1e-5)


def test_fused_loss_of_a_vocabulary_wider_than_a_chunk_takes_one_row_at_a_time(monkeypatch):
    monkeypatch.setattr(modeling_transformer, "LOSS_CHUNK_ELEMENTS", VOCAB // 2)
    torch.manual_seed(0)  # more rows than dimensions, as in every real batch
    hidden, weight, labels = torch.randn(20, 16), torch.randn(VOCAB, 16), torch.randint(0, VOCAB, (20,))
    loss = modeling_transformer.LinearCrossEntropy.apply(hidden, weight, labels, 0.0)
    expected = torch.nn.functional.cross_entropy(hidden @ weight.T, labels, reduction="sum")
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_loss_in_bf16_over_several_chunks_keeps_the_weight_dtype_and_its_gradient(monkeypatch, device):
    torch.manual_seed(0)
    hidden, weight = torch.randn(10, 16).to(device), torch.randn(VOCAB, 16).to(device)
    labels = torch.randint(0, VOCAB, (10,)).to(device)
    expected_weight = weight.clone().requires_grad_()
    torch.nn.functional.cross_entropy(hidden @ expected_weight.T, labels, reduction="sum").backward()
    monkeypatch.setattr(modeling_transformer, "LOSS_CHUNK_ELEMENTS", 2 * VOCAB)  # five chunks
    bf16_weight = weight.bfloat16().requires_grad_()
    loss = modeling_transformer.LinearCrossEntropy.apply(hidden.bfloat16(), bf16_weight, labels, 0.0)
    loss.backward()
    assert bf16_weight.grad.dtype == torch.bfloat16
    assert torch.allclose(bf16_weight.grad.float(), expected_weight.grad, rtol=0.05, atol=0.05)


def test_gradient_checkpointing_gives_the_same_gradients():
    inputs = batch()
    labels = torch.tensor([[20, 21, 22, EOS], [23, 24, EOS, -100]])
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.0)
        model.train()
        if checkpointing:
            model.activation_checkpointing_enable()
            layers = (*model.model.encoder.layers, *model.model.decoder.layers)
            assert all(layer.gradient_checkpointing for layer in layers), "every layer recomputes its activations"
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels).loss.backward()
        gradients.append(model.model.shared.weight.grad.clone())
    assert torch.allclose(*gradients, atol=1e-6)


def test_a_generation_config_transformers_would_refuse_is_refused_before_anything_is_written(tmp_path):
    """Greedy decoding set on the model (`num_beams = 1`) leaves the paper's beam-only settings (early stopping, a
    length penalty), which transformers refuses to save, after config.json and the code files are written: a
    directory without weights, or a Trainer's checkpoint, half-written. Refused first, in one line saying how."""
    model = tiny_model()
    model.generation_config.num_beams = 1
    with pytest.raises(ValueError, match=r"cannot save to .*early_stopping.*num_beams=1 to generate") as error:
        model.save_pretrained(tmp_path / "saved")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "saved").exists()
    model.generation_config.update(early_stopping=None, length_penalty=None)
    model.save_pretrained(tmp_path / "saved")
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved").generation_config.num_beams == 1


def test_save_load_round_trip_keeps_logits_and_one_shared_storage(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "configuration_transformer.py").exists() and (tmp_path / "modeling_transformer.py").exists()
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.auto_map["AutoModelForSeq2SeqLM"] == "modeling_transformer.TransformerForConditionalGeneration"
    assert config.auto_map["AutoModel"] == "modeling_transformer.TransformerModel"

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, TransformerForConditionalGeneration)
    assert torch.equal(loaded(**batch()).logits, model(**batch()).logits)
    pointers = {loaded.model.shared.weight.data_ptr(), loaded.lm_head.weight.data_ptr()}
    pointers |= {
        loaded.model.encoder.embed_tokens.weight.data_ptr(),
        loaded.model.decoder.embed_tokens.weight.data_ptr(),
    }
    assert len(pointers) == 1
    for decoding in (model.generation_config, loaded.generation_config):  # Sec. 6.1, new or loaded
        assert decoding.num_beams == 4 and decoding.length_penalty_type == "gnmt"
    assert isinstance(AutoModel.from_pretrained(tmp_path), TransformerModel)


@pytest.mark.parametrize("first_device_bytes", [70_000, 120_000, 170_000])
def test_a_device_map_over_several_devices_keeps_each_layer_on_one(first_device_bytes):
    """As `from_pretrained(device_map="auto")` infers it (accelerate, told the model's unsplittable modules): a layer
    split between two GPUs would add its residual across devices."""
    model = tiny_model()
    device_map = infer_auto_device_map(
        model,
        max_memory={0: first_device_bytes, "cpu": 10**9},
        no_split_module_classes=model._no_split_modules,
    )
    assert len(set(device_map.values())) == 2
    assert [name for name in device_map if re.search(r"\.layers\.\d+\.", name)] == []


def test_from_pretrained_with_dtype(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.model.shared.weight.dtype == torch.bfloat16
    assert loaded(**batch()).logits.dtype == torch.bfloat16


def test_resize_token_embeddings_keeps_the_three_way_tie():
    model = tiny_model()
    model.resize_token_embeddings(VOCAB + 6)
    shared = model.model.shared.weight
    assert shared.shape == (VOCAB + 6, 32) and model.config.vocab_size == VOCAB + 6
    for weight in (
        model.lm_head.weight,
        model.model.encoder.embed_tokens.weight,
        model.model.decoder.embed_tokens.weight,
    ):
        assert weight.data_ptr() == shared.data_ptr()
    assert model(input_ids=torch.tensor([[VOCAB + 5, EOS]]), decoder_input_ids=torch.tensor([[EOS]])).logits.shape[
        -1
    ] == (VOCAB + 6)
    assert model.get_input_embeddings() is model.model.shared and model.get_output_embeddings() is model.lm_head


@pytest.mark.parametrize("tie_word_embeddings", [True, False], ids=["tied", "untied"])
def test_a_hook_on_the_input_embeddings_sees_the_encoders_lookup_as_neftune_needs(tie_word_embeddings):
    """The Trainer's `neftune_noise_alpha` (as a user's own hook) hooks `get_input_embeddings()`: tied, that was
    `shared`, whose weight the stacks look up through modules of their own, so the hook never ran and NEFTune trained
    without noise, silently (MarianMT's noise reaches its encoder)."""
    model = tiny_model(tie_word_embeddings=tie_word_embeddings, dropout=0.0).train()
    clean = model(**labelled_batch()).loss
    handle = activate_neftune(model, neftune_noise_alpha=5.0)
    try:
        torch.manual_seed(0)
        noisy = model(**labelled_batch()).loss
    finally:
        handle.remove()
    assert noisy != clean, "the noise reached the encoder's input"
    assert torch.equal(model(**labelled_batch()).loss, clean)


def test_untied_embeddings_are_three_matrices_that_inputs_embeds_and_resizing_follow():
    """transformers ties nothing without tie_word_embeddings, the two stacks' tie to `shared` included: a `shared`
    matrix would be used by nothing, yet be the input embeddings that inputs_embeds and resizing took."""
    model = tiny_model(tie_word_embeddings=False)
    encoder, decoder = model.model.encoder, model.model.decoder
    assert model.model.shared is None
    weights = (encoder.embed_tokens.weight, decoder.embed_tokens.weight, model.lm_head.weight)
    assert len({weight.data_ptr() for weight in weights}) == 3
    assert model.get_input_embeddings() is encoder.embed_tokens
    inputs = batch()
    expected = model(**inputs).logits
    embedded = model(
        inputs_embeds=model.get_input_embeddings()(inputs["input_ids"]),
        attention_mask=inputs["attention_mask"],
        decoder_inputs_embeds=decoder.embed_tokens(inputs["decoder_input_ids"]),
    ).logits
    assert torch.equal(embedded, expected)

    model.resize_token_embeddings(VOCAB + 6, mean_resizing=False)
    for weight in (encoder.embed_tokens.weight, decoder.embed_tokens.weight, model.lm_head.weight):
        assert weight.shape == (VOCAB + 6, 32)
    assert torch.equal(model(**inputs).logits[..., :VOCAB], expected), "the trained rows of all three are kept"
    replacement = torch.nn.Embedding(VOCAB + 6, 32)
    model.set_input_embeddings(replacement)
    assert encoder.embed_tokens is replacement and decoder.embed_tokens is not replacement  # as MarianMT's


def test_an_untied_checkpoint_holding_the_unused_shared_matrix_loads_without_it(tmp_path):
    """Untied checkpoints saved before `shared` was left out of untied models hold it."""
    model = tiny_model(tie_word_embeddings=False)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "model.shared.weight": torch.randn(VOCAB, 32)}, tmp_path / "model.safetensors")
    loaded, report = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.model.shared is None and not report["unexpected_keys"] and not report["missing_keys"]
    assert torch.equal(loaded.eval()(**batch()).logits, model(**batch()).logits)


def test_an_untied_checkpoint_lacking_an_embedding_matrix_loads_with_it_reported_missing_not_refused_as_tied(
    tmp_path,
):
    """Only a checkpoint holding the shared matrix in their place is refused as a tied one; one that lacks a matrix
    and holds no shared one loads as transformers loads any checkpoint with a weight missing."""
    tiny_model(tie_word_embeddings=False).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.decoder.embed_tokens.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    loaded, report = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.model.shared is None and set(report["missing_keys"]) == {"model.decoder.embed_tokens.weight"}


@pytest.mark.parametrize("auto_class", [AutoModelForSeq2SeqLM, AutoModel])
def test_a_tied_checkpoint_loaded_untied_is_refused_rather_than_its_embeddings_started_again(tmp_path, auto_class):
    """Its one matrix, `shared`, is what untied checkpoints held unused: it was dropped without a word, and the three
    untied matrices began from random values, listed among the load report's missing keys."""
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError) as refused:
        auto_class.from_pretrained(tmp_path, tie_word_embeddings=False)
    assert str(refused.value).startswith(
        f"tie_word_embeddings=False, but {tmp_path} holds one embedding matrix shared"
    )


@pytest.mark.parametrize("auto_class", [AutoModelForSeq2SeqLM, AutoModel])
def test_an_untied_checkpoint_loaded_tied_is_refused_rather_than_left_untied_under_a_tied_config(tmp_path, auto_class):
    """transformers warned and left the three matrices untied; the config said tied, which exports and conversions
    trust (MarianMT's takes the shared matrix alone)."""
    tiny_model(tie_word_embeddings=False).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as refused:
        auto_class.from_pretrained(tmp_path, tie_word_embeddings=True)
    assert str(refused.value).startswith(
        f"tie_word_embeddings=True, but {tmp_path} holds different embedding matrices"
    )


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"decoder_input_ids": torch.tensor([[EOS, 20]])}, "The decoder input has batch size 1, the encoder output 2"),
        ({"decoder_input_ids": None, "labels": torch.tensor([[20, EOS]])}, "has batch size 1, the encoder output 2"),
        ({"input_ids": torch.tensor([[5, EOS]]), "attention_mask": None}, "has batch size 2, the encoder output 1"),
        ({"encoder_outputs": (torch.randn(2, 6, 48),)}, r"The encoder output has width 48, expected d_model \(32\)"),
        ({"encoder_outputs": (torch.randn(6, 32),)}, r"has shape \(6, 32\), expected \(batch, length, d_model\)"),
    ],
)
def test_decoder_inputs_that_do_not_match_the_encoder_output_are_named(inputs, message):
    """Unchecked, these failed in a product deep inside attention (on oneDNN without naming a shape), except one
    source for two decoder rows, which served both without a word."""
    with pytest.raises(ValueError, match=message):
        tiny_model()(**{**batch(), **inputs})


def test_encoder_states_passed_bare_as_encoder_outputs_are_refused_saying_how_to_pass_them():
    """Indexed as a tuple, a (2, 6, 32) tensor gave its first sentence's states: 'batch size 2, the encoder output
    6', or, where the length equalled the batch, no error and wrong logits."""
    model = tiny_model()
    states = model.get_encoder()(**batch()).last_hidden_state
    with pytest.raises(TypeError, match=r"encoder_outputs is a tensor: .*encoder_outputs=\(encoder_hidden_states,\)"):
        model(**batch(), encoder_outputs=states)
    assert torch.equal(model(**batch(), encoder_outputs=(states,)).logits, model(**batch()).logits)


def test_encoder_outputs_given_as_a_tuple_come_back_as_the_encoder_states_and_attentions_it_holds():
    model = tiny_model()
    model.set_attn_implementation("eager")
    inputs = batch()
    encoded = model.get_encoder()(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        output_hidden_states=True,
        output_attentions=True,
    )
    decoder_inputs = {"attention_mask": inputs["attention_mask"], "decoder_input_ids": inputs["decoder_input_ids"]}
    out = model(**decoder_inputs, encoder_outputs=encoded.to_tuple())
    assert out.encoder_hidden_states is encoded.hidden_states and out.encoder_attentions is encoded.attentions
    out = model(**decoder_inputs, encoder_outputs=encoded.to_tuple()[:2])
    assert out.encoder_hidden_states is encoded.hidden_states and out.encoder_attentions is None


@pytest.mark.parametrize("field", ["pad_token_id", "decoder_start_token_id"])
def test_labels_without_a_padding_or_start_id_are_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=f"config.{field} has to be defined to make decoder inputs from labels"):
        tiny_model(**{field: None})(**labelled_batch())


def test_token_ids_outside_the_vocabulary_raise():
    model = tiny_model()
    inputs = batch()
    with pytest.raises(ValueError, match="input_ids holds token ids"):
        model(**{**inputs, "input_ids": inputs["input_ids"] + VOCAB})
    with pytest.raises(ValueError, match="decoder_input_ids holds token ids"):
        model(**{**inputs, "decoder_input_ids": inputs["decoder_input_ids"] - 10})
    one_token = {"decoder_input_ids": torch.tensor([[EOS]])}
    with pytest.raises(ValueError, match=rf"input_ids holds token ids in \[{VOCAB}, {VOCAB}\], outside"):
        model(input_ids=torch.tensor([[VOCAB]]), **one_token)  # the first id past the vocabulary, alone
    with pytest.raises(ValueError, match=r"input_ids holds token ids in \[-1, "):
        model(input_ids=torch.tensor([[5, -1]]), **one_token)


def test_an_input_without_source_tokens_is_refused_naming_its_shape():
    """Unchecked, both failed in a reshape inside attention ("cannot reshape tensor of 0 elements")."""
    inputs, decoder_start = batch(), {"decoder_input_ids": torch.tensor([[EOS]])}
    with pytest.raises(ValueError, match=r"^The encoder got input_ids of shape \(1, 0\): no source token to encode"):
        tiny_model()(input_ids=inputs["input_ids"][:1, :0], **decoder_start)
    with pytest.raises(ValueError, match=r"^The encoder got inputs_embeds of shape \(0, 6\): no source token"):
        tiny_model()(inputs_embeds=torch.zeros(0, 6, 32), decoder_input_ids=decoder_start["decoder_input_ids"][:0])


def test_mismatched_mask_shape_raises():
    model = tiny_model()
    inputs = batch()
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\), expected \(2, 6\)"):
        model(**{**inputs, "attention_mask": inputs["attention_mask"][:, :5]})
    states = model.get_encoder()(**batch()).last_hidden_state  # the encoder is not run: the decoder checks the mask
    with pytest.raises(ValueError, match=r"attention_mask \(of the encoder input\) has shape \(2, 5\), expected"):
        model(**{**inputs, "attention_mask": inputs["attention_mask"][:, :5], "encoder_outputs": (states,)})


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"inputs_embeds": torch.zeros(2, 6, 32)}, "Pass exactly one of input_ids and inputs_embeds"),
        ({"input_ids": None}, "Pass exactly one of input_ids and inputs_embeds"),
        ({"decoder_inputs_embeds": torch.zeros(2, 4, 32)}, "Pass exactly one of decoder_input_ids and decoder_inputs"),
        ({"decoder_input_ids": None}, "Pass exactly one of decoder_input_ids and decoder_inputs_embeds"),
    ],
)
def test_both_or_neither_of_the_ids_and_the_embeddings_are_refused(inputs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model()(**{**batch(), **inputs})


def test_the_decoder_alone_continues_from_a_cache_passed_under_its_deprecated_name_past_key_values():
    model = tiny_model()
    inputs = batch()
    decoder, ids = model.get_decoder(), inputs["decoder_input_ids"]
    encoded = {
        "encoder_hidden_states": model.get_encoder()(**sources()).last_hidden_state,
        "encoder_attention_mask": inputs["attention_mask"],
    }
    full = decoder(input_ids=ids, **encoded).last_hidden_state
    prefix = decoder(input_ids=ids[:, :3], use_cache=True, **encoded)
    with pytest.warns(FutureWarning, match="`past_key_values` is deprecated"):
        step = decoder(input_ids=ids[:, 3:], past_key_values=prefix.cache, use_cache=True, **encoded)
    assert torch.allclose(step.last_hidden_state[:, 0], full[:, 3], atol=1e-5), "the fourth token, read at position 3"


def test_the_decoder_alone_without_the_encoder_output_is_refused():
    with pytest.raises(ValueError, match="The decoder attends over the encoder output: pass encoder_hidden_states"):
        tiny_model().get_decoder()(input_ids=batch()["decoder_input_ids"])


def test_loss_accepts_non_contiguous_labels():
    model = tiny_model()
    inputs = batch()
    labels = torch.tensor([[20, 23], [21, 24], [22, EOS], [EOS, -100]]).t()  # a transposed view
    assert not labels.is_contiguous()
    out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels)
    expected = model(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels.contiguous()
    )
    assert torch.equal(out.loss, expected.loss)


def test_the_int8_layers_named_are_the_linear_layers_that_quantisation_replaced():
    model = tiny_model(50)
    linear_layers = [name for name, module in model.named_modules() if type(module) is torch.nn.Linear]
    assert modeling_transformer.int8_layer_names(quantize_int8(model)) == linear_layers
