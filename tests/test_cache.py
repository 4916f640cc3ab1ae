"""Tests of modeling/cache_transformer.py: the static beam-search cache keeps what was written where beams move.

That decoding with it gives transformers' own outputs is tested in `test_generation.py`."""

import pytest
import torch

from modeling.cache_transformer import StaticBeamCache, _SelfAttention


def test_static_cache_keeps_the_selected_histories_while_its_room_grows(monkeypatch):
    monkeypatch.setattr(_SelfAttention, "FIRST_STEPS", 2)  # room for 2 steps, then 4, then the 6 asked for
    layers, heads, head_dim = 2, 2, 3
    encoder_hidden_states = torch.zeros(2, 5, heads * head_dim)
    cache = StaticBeamCache(4, 6, layers, encoder_hidden_states, cross_attention_mask=None)  # 4 rows, 6 steps at most
    history = torch.empty(2, layers, heads, 0, head_dim)  # what each row has written, layer by layer, step by step
    for step in range(6):
        if step == 3:
            rows = torch.tensor([1, 1, 0, 1])  # beams moving and the first step's rows becoming several
            cache.self_attention_cache.select(rows)
            history = history[rows]
        keys = torch.randn(len(history), layers, heads, 1, head_dim)
        history = torch.cat([history, keys], dim=3)
        for layer in range(layers):
            stored, values = cache.self_attention_cache.update(keys[:, layer], -keys[:, layer], layer_idx=layer)
            assert stored.shape == values.shape == history[:, layer].shape
            assert torch.equal(stored, history[:, layer]), f"step {step}, layer {layer}: keys"
            assert torch.equal(values, -history[:, layer]), f"step {step}, layer {layer}: values"
        cache.advance()
    assert cache.self_attention_cache.buffer.shape[1] == 6, "grown to the limit, not beyond"


def test_cross_attention_keys_are_stored_by_layer_and_out_of_order_is_refused():
    cache = StaticBeamCache(2, 4, 2, torch.zeros(2, 5, 6), cross_attention_mask=None)
    keys = [torch.randn(2, 2, 5, 3) for _ in range(2)]
    cache.cross_attention_cache.update(keys[0], -keys[0], layer_idx=0)
    with pytest.raises(RuntimeError, match="of layer 0 came in layer 1's place"):
        cache.cross_attention_cache.update(keys[0], -keys[0], layer_idx=0)  # stored twice: layer 1 would read it
    cache.cross_attention_cache.update(keys[1], -keys[1], layer_idx=1)
    assert torch.equal(cache.cross_attention_cache.layers[1].keys, keys[1])
