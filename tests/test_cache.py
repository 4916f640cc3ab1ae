"""Tests of modeling/cache_transformer.py: the static beam-search cache keeps what was written where beams move.

That decoding with it gives transformers' own outputs is tested in `test_generation.py`."""

import torch

from modeling.cache_transformer import StaticBeamCache, _SelfAttention


def test_static_cache_keeps_the_selected_histories_while_its_room_grows(monkeypatch):
    monkeypatch.setattr(_SelfAttention, "FIRST_STEPS", 2)  # room for 2 steps, then 4, then the 6 asked for
    heads, head_dim = 2, 3
    encoder_hidden_states = torch.zeros(2, 5, heads * head_dim)
    cache = StaticBeamCache(4, 6, encoder_hidden_states, cross_attention_mask=None)  # 4 rows, 6 steps at most
    history = torch.empty(2, heads, 0, head_dim)  # what each row has written, step by step
    for step in range(6):
        if step == 3:
            rows = torch.tensor([1, 1, 0, 1])  # beams moving and the first step's rows becoming several
            cache.self_attention_cache.select(rows)
            history = history[rows]
        keys = torch.randn(len(history), heads, 1, head_dim)
        stored, values = cache.self_attention_cache.update(keys, keys + 1, layer_idx=0)
        cache.advance()
        history = torch.cat([history, keys], dim=2)
        assert torch.equal(stored, history) and torch.equal(values, history + 1), f"step {step}"
    assert cache.self_attention_cache.buffers[0][0].shape[2] == 6, "grown to the limit, not beyond"
