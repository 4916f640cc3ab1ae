"""Tests of modeling/translation.py: bulk translation keeps order and empty lines, batches by token budget."""

import time

import huggingface_hub.utils._http as hf_http
import pytest
from helpers import (
    EchoModel,
    closed_port_endpoint,
    save_tiny_checkpoint,
    stalled_endpoint,
    synthetic_pairs,
    tiny_tokenizer,
    tiny_translator,
)

from modeling.hub_client import HubError
from modeling.translation import load_model_and_tokenizer, translate


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_translate_keeps_order_and_empty_lines(tokenizer):
    pairs = synthetic_pairs(30, seed=1)
    sentences = [en for en, _ in pairs]
    sentences[3:3] = [""]
    sentences[10:10] = ["   "]
    sentences.append("")
    model = EchoModel()

    outputs = translate(model, tokenizer, sentences, max_tokens=40, num_beams=2, max_new_tokens=7)

    assert outputs == [s.strip() for s in sentences]
    assert model.training, "the model's train/eval mode is restored"
    seen = [ids for call in model.calls for ids in call["input_ids"].tolist()]
    assert len(seen) == len(sentences) - 3, "empty lines never reach the model"
    for call in model.calls:
        batch_size, width = call["input_ids"].shape
        assert batch_size == 1 or batch_size * width * 2 <= 40, "batches respect the token budget, beams counted"
        assert call["kwargs"] == {"num_beams": 2, "max_new_tokens": 7}
        assert call["attention_mask"].sum(1).max() == width, "no batch is padded beyond its longest sentence"
    assert len(model.calls) > 1


def test_translate_gives_an_oversized_sentence_a_batch_of_its_own(tokenizer):
    long_sentence = " ".join(["the small dog sees a red ball today."] * 4)
    model = EchoModel()
    assert translate(model, tokenizer, ["a cat.", long_sentence], max_tokens=8) == ["a cat.", long_sentence]
    assert [call["input_ids"].shape[0] for call in model.calls] == [1, 1]


def test_translate_of_only_empty_lines_does_not_call_the_model(tokenizer):
    model = EchoModel()
    assert translate(model, tokenizer, ["", " "]) == ["", ""]
    assert model.calls == []


def test_real_model_translations_do_not_depend_on_batching(tokenizer):
    """Padding must not leak into results: one big batch and one sentence per batch agree exactly."""
    model = tiny_translator(len(tokenizer))
    sentences = [en for en, _ in synthetic_pairs(6, seed=2)]
    settings = {"num_beams": 2, "max_new_tokens": 6}
    together = translate(model, tokenizer, sentences, max_tokens=10_000, **settings)
    alone = translate(model, tokenizer, sentences, max_tokens=1, **settings)
    assert together == alone


def test_the_token_budget_counts_every_beam(tokenizer):
    """beam 1000 with a budget of 4096 tokens: one sentence at a time, not 4096 tokens × 1000 beams."""
    sentences = [en for en, _ in synthetic_pairs(12, seed=3)]
    model = EchoModel()
    translate(model, tokenizer, sentences, max_tokens=4096, num_beams=1000)
    assert [call["input_ids"].shape[0] for call in model.calls] == [1] * 12
    model = EchoModel()  # its generation config's beam 4: 60 source tokens per batch of a 240 budget
    translate(model, tokenizer, sentences, max_tokens=240)
    assert all(call["input_ids"].numel() <= 60 for call in model.calls) and len(model.calls) > 1


def test_truncated_weights_are_named_before_loading(tmp_path):
    save_tiny_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"holds incomplete weights: model\.safetensors is truncated \(\d+ bytes"):
        load_model_and_tokenizer(str(tmp_path))


def test_a_model_named_on_a_stalled_hub_fails_in_one_line_within_the_timeout(quick_hub, monkeypatch):
    # huggingface_hub retries a download five times itself; its 23 s of pauses between them are skipped here.
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    with stalled_endpoint() as endpoint:
        quick_hub(endpoint)
        start = time.monotonic()
        with pytest.raises(HubError) as error:
            load_model_and_tokenizer("user/tiny")
        elapsed = time.monotonic() - start
    message = str(error.value)
    assert message.startswith(f"Could not load 'user/tiny' from the Hub: HEAD {endpoint}/user/tiny/resolve/main/")
    assert "no answer within 0.3 s" in message and "\n" not in message
    # Its first request (model_info, sent with `timeout=None`) waited forever before; now each waits 0.3 s.
    assert elapsed < 10, elapsed


def test_a_model_named_on_an_unreachable_hub_names_the_url(quick_hub, monkeypatch):
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    endpoint = closed_port_endpoint()
    quick_hub(endpoint)
    expected = rf"^Could not load 'user/tiny' from the Hub: \w+ {endpoint}/.*: cannot connect"
    with pytest.raises(HubError, match=expected):
        load_model_and_tokenizer("user/tiny")
