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
    rooms = []  # the steps the buffer has room for, after each step
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
        rooms.append(cache.self_attention_cache.buffer.shape[1])
        cache.advance()
    assert rooms == [2, 2, 4, 4, 6, 6], "doubled when full, up to the limit, not beyond"


def test_cross_attention_keys_are_stored_by_layer_and_out_of_order_is_refused():
    cache = StaticBeamCache(2, 4, 2, torch.zeros(2, 5, 6), cross_attention_mask=None)
    keys = [torch.randn(2, 2, 5, 3) for _ in range(2)]
    cache.cross_attention_cache.update(keys[0], -keys[0], layer_idx=0)
    with pytest.raises(RuntimeError, match="of layer 0 came in layer 1's place"):
        cache.cross_attention_cache.update(keys[0], -keys[0], layer_idx=0)  # stored twice: layer 1 would read it
    cache.cross_attention_cache.update(keys[1], -keys[1], layer_idx=1)
    assert torch.equal(cache.cross_attention_cache.layers[1].keys, keys[1])


def test_selecting_sentences_moves_their_cross_attention_and_mask_rows_and_beams_alone_move_neither():
    """Beam search hands over the hypotheses it keeps, and the batch's rows when sentences finish (or one row per
    sentence becomes K): each row must keep reading its own sentence's encoder keys, values and padding."""
    torch.manual_seed(0)
    layers, heads, head_dim, source_length = 2, 3, 4, 5  # heads, rows and head size all differ
    mask = torch.arange(2 * source_length, dtype=torch.float).view(2, 1, 1, source_length)  # one row per sentence
    cache = StaticBeamCache(4, 4, layers, torch.zeros(2, source_length, heads * head_dim), cross_attention_mask=mask)
    cross = [torch.randn(2, heads, source_length, head_dim) for _ in range(layers)]
    for layer in range(layers):
        keys, values = cache.cross_attention_cache.update(cross[layer], -cross[layer], layer_idx=layer)
        assert torch.equal(keys, cross[layer]) and torch.equal(values, -cross[layer]), "what the attention reads now"
        step = torch.randn(2, heads, 1, head_dim)
        cache.self_attention_cache.update(step, -step, layer_idx=layer)
    cache.advance()
    assert cache.length == 1
    assert cache.self_attention_cache.buffer.shape == (4, 4, layers, 2, heads, head_dim), "keys and values, no more"

    rows = torch.tensor([1, 1, 0, 0])  # each sentence's row becomes two beams, the second sentence first
    cache.select(rows, rows)
    for layer in range(layers):
        assert torch.equal(cache.cross_attention_cache.layers[layer].keys, cross[layer][rows])
        assert torch.equal(cache.cross_attention_cache.layers[layer].values, -cross[layer][rows])
    assert torch.equal(cache.cross_attention_mask, mask[rows])
    assert cache.self_attention_cache.rows == 4

    cache.select(torch.tensor([1, 0, 3, 2]))  # beams swap within their sentence: its encoder rows stay
    assert torch.equal(cache.cross_attention_cache.layers[0].keys, cross[0][rows])
    assert torch.equal(cache.cross_attention_mask, mask[rows])
