"""Tests of modeling/batching.py: token-budget batches for training, evaluation and translation, and the number of
micro-batches per update."""

import logging

import datasets
import numpy as np
import pytest

from modeling.batching import (
    FixedBatchSampler,
    TokenBudgetBatchSampler,
    gradient_accumulation_steps_for,
    mean_target_tokens_per_batch,
    padding_efficiency,
    split_batches_to_multiple,
    token_budget_batches,
    update_batching,
)


def random_lengths(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    source = rng.integers(2, 60, size=n)
    target = np.clip(source + rng.integers(-8, 9, size=n), 2, None)
    return source, target


def test_every_example_once_per_epoch_and_len_is_exact():
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=500)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(len(source)))


def test_budget_is_never_exceeded_except_by_a_single_long_example():
    source, target = random_lengths()
    source[7], target[8] = 900, 700  # longer than the budget
    max_tokens = 600
    batches = list(TokenBudgetBatchSampler(source, target, max_tokens=max_tokens))
    for batch in batches:
        if len(batch) > 1:
            assert source[batch].max() * len(batch) <= max_tokens
            assert target[batch].max() * len(batch) <= max_tokens
    assert [7] in batches and [8] in batches
    assert all(len(b) == 1 for b in batches if source[b].max() > max_tokens or target[b].max() > max_tokens)


def test_batches_group_similar_lengths():
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=1000)
    random_batches = np.array_split(np.random.default_rng(0).permutation(len(source)), len(sampler))
    grouped = sampler.padding_efficiency()
    assert grouped["total"] > 0.9
    assert grouped["total"] > padding_efficiency(random_batches, source, target)["total"] + 0.3


def test_padding_efficiency_by_hand():
    efficiency = padding_efficiency([[0, 1], [2]], source_lengths=[2, 4, 3], target_lengths=[1, 1, 5])
    assert efficiency == {"source": 9 / 11, "target": 7 / 7, "total": 16 / 18}


def test_padding_efficiency_of_arrows_int32_lengths_past_2_to_the_31_padded_tokens():
    # `sequence_lengths` reads int32 from Arrow: a sum in int32 wrapped round past 2**31 tokens (a large corpus).
    lengths = np.full(5, 2**29, dtype=np.int32)
    one_each = [[i] for i in range(5)]
    assert padding_efficiency(one_each, lengths, lengths) == {"source": 1.0, "target": 1.0, "total": 1.0}
    assert TokenBudgetBatchSampler(lengths, lengths, max_tokens=2**29).padding_efficiency()["total"] == 1.0


def test_order_is_deterministic_per_seed_and_epoch():
    source, target = random_lengths()
    first, again = (TokenBudgetBatchSampler(source, target, 500, seed=3) for _ in range(2))
    assert list(first) == list(again)
    epoch0 = list(first)
    first.set_epoch(1)
    assert list(first) != epoch0
    assert list(TokenBudgetBatchSampler(source, target, 500, seed=4)) != epoch0


def test_without_shuffle_batches_come_in_length_order():
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, 500, shuffle=False)
    batches = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == batches
    longest = [max(source[b].max(), target[b].max()) for b in batches]
    assert longest == sorted(longest)


def test_shuffled_batches_come_in_no_length_order():
    # Shuffling only the ties between equal lengths would leave the batches in length order: every epoch would
    # train on the short sentences first and the long ones last. The batches themselves are shuffled.
    source, target = random_lengths()
    batches = list(TokenBudgetBatchSampler(source, target, 500))
    longest = [max(source[b].max(), target[b].max()) for b in batches]
    assert len(batches) > 50 and abs(np.corrcoef(np.arange(len(longest)), longest)[0, 1]) < 0.3


@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_ranks_are_disjoint_equal_and_cover_everything(num_replicas, caplog):
    source, target = random_lengths(1000)
    with caplog.at_level(logging.INFO, logger="modeling.batching"):
        samplers = [
            TokenBudgetBatchSampler(source, target, 700, seed=1, num_replicas=num_replicas, rank=r)
            for r in range(num_replicas)
        ]
    total = len(TokenBudgetBatchSampler(source, target, 700))
    repeated = -total % num_replicas
    assert (f"repeating {repeated} batches per epoch" in caplog.text) == (repeated > 0)
    per_rank = [list(s) for s in samplers]
    assert {len(batches) for batches in per_rank} == {len(samplers[0])} == {(total + repeated) // num_replicas}
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert set(seen) == set(range(1000))
    # Only the few repeated batches (at most num_replicas - 1) show examples twice.
    flat = [tuple(batch) for batches in per_rank for batch in batches]
    assert len(flat) - len(set(flat)) == repeated


def test_more_replicas_than_batches_still_gives_every_rank_a_batch():
    samplers = [TokenBudgetBatchSampler([3, 3], [3, 3], 100, num_replicas=3, rank=r) for r in range(3)]
    for sampler in samplers:
        assert len(sampler) == 1 and [sorted(batch) for batch in sampler] == [[0, 1]]


def test_empty_and_invalid_inputs():
    assert list(TokenBudgetBatchSampler([], [], 100)) == [] and len(TokenBudgetBatchSampler([], [], 100)) == 0
    with pytest.raises(ValueError, match="3 source lengths but 2 target lengths"):
        TokenBudgetBatchSampler([1, 2, 3], [1, 2], 100)
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBudgetBatchSampler([1], [1], 0)
    with pytest.raises(ValueError, match="rank"):
        TokenBudgetBatchSampler([1], [1], 10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got -1"):
        TokenBudgetBatchSampler([1], [1], 10, num_replicas=2, rank=-1)
    assert list(TokenBudgetBatchSampler([1, 1], [1, 1], 1)) in ([[0], [1]], [[1], [0]])  # the smallest budget
    with pytest.raises(ValueError, match="num_replicas must be at least 1, got 0"):
        TokenBudgetBatchSampler([1], [1], 10, num_replicas=0)


def test_gradient_accumulation_steps_follow_the_world_size():
    assert gradient_accumulation_steps_for(25000, 3300, world_size=1) == 8
    assert gradient_accumulation_steps_for(25000, 3300, world_size=8) == 1
    assert gradient_accumulation_steps_for(25000, 5000, world_size=8) == 1  # 40000 tokens: smaller batches, then
    assert gradient_accumulation_steps_for(25000, 2200, world_size=8) == 2  # 1 would be 17600: 30% short
    assert gradient_accumulation_steps_for(10, 9, world_size=1) == 1  # exactly 10% short: still the closest count
    assert gradient_accumulation_steps_for(1, 0.5, world_size=1) == 2  # the smallest positive arguments


@pytest.mark.parametrize(
    ("tokens_per_update", "tokens_per_batch", "world_size"), [(0, 3300, 1), (25000, 0, 1), (25000, 3300, 0)]
)
def test_gradient_accumulation_steps_refuse_an_argument_that_is_not_positive(
    tokens_per_update, tokens_per_batch, world_size
):
    with pytest.raises(ValueError, match="must be positive"):
        gradient_accumulation_steps_for(tokens_per_update, tokens_per_batch, world_size)


def token_dataset(source: np.ndarray, target: np.ndarray) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"input_ids": [[5] * int(n) for n in source], "labels": [[6] * int(n) for n in target]}
    )


@pytest.mark.parametrize(
    ("world_size", "steps", "smaller"), [(1, 7, False), (3, 2, False), (8, 1, True), (16, 1, True)]
)
def test_an_update_holds_the_tokens_asked_on_any_number_of_processes(world_size, steps, smaller, caplog):
    source, target = random_lengths(20000, seed=1)  # batches of 4096 padded tokens hold ~3,600 real target ones
    with caplog.at_level(logging.INFO, logger="modeling.batching"):
        derived = update_batching(25000, token_dataset(source, target), 4096, world_size)
    assert derived[0] == steps and (derived[1] < 4096) == smaller
    batches = len(TokenBudgetBatchSampler(source, target, derived[1]))
    achieved = steps * world_size * target.sum() / batches  # real target tokens per update, on average
    assert abs(achieved / 25000 - 1) < 0.1, achieved
    assert "off the" not in caplog.text
    assert ("instead of 4096" in caplog.text) == smaller
    assert f"{world_size} process(es) × {steps} micro-batch(es) of ~" in caplog.text


def test_an_update_that_cannot_come_near_the_tokens_asked_is_a_warning(caplog):
    source = target = np.full(64, 200)  # sentences of 200 tokens: 1 of them holds 200 target tokens, 2 hold 400
    steps, budget = update_batching(300, token_dataset(source, target), 4096, 1)
    assert (steps, budget) == (1, 384)  # batches of 20, 20, 20 and 4: 3,200 on average; 4096 × 300 / 3200
    assert "An update holds ~200 target tokens, -33% off the 300 asked" in caplog.text


def test_an_update_exactly_10_percent_off_is_no_warning(caplog):
    source = target = np.array([110])  # one batch of 110 target tokens for 100 asked
    assert update_batching(100, token_dataset(source, target), 4096, 1) == (1, 4096)
    assert "An update holds" not in caplog.text and "off the" not in caplog.text


def test_an_update_15_percent_off_is_a_warning(caplog):
    # More than 10% off, but not far off: the warning's threshold is the 10% the docstring promises.
    source = target = np.array([115])  # one sentence of 115 target tokens, however small the batches, for 100 asked
    update_batching(100, token_dataset(source, target), 4096, 1)
    assert "An update holds ~115 target tokens, +15% off the 100 asked" in caplog.text


def test_an_update_exactly_10_percent_over_keeps_the_batches_given():
    source = target = np.array([22])  # one batch of 22 target tokens for 20 asked (1.1 × 20 is exactly 22.0)
    assert update_batching(20, token_dataset(source, target), 4096, 1) == (1, 4096)


def test_an_update_asking_for_less_than_one_sentence_gets_one_sentence_per_batch_and_a_warning(caplog):
    source = target = np.full(8, 200)
    assert update_batching(50, token_dataset(source, target), 4096, 1) == (1, 1)
    assert "An update holds ~200 target tokens, +300% off the 50 asked" in caplog.text


def test_an_update_of_a_dataset_without_target_tokens_is_refused_naming_it():
    # a training set filtered to nothing, or of empty targets: not sized as "tokens_per_batch (0.0)" of nothing
    rows = token_dataset(np.array([3]), np.array([4]))
    for dataset, size in ((rows.select([]), 0), (token_dataset(np.array([3]), np.array([0])), 1)):
        with pytest.raises(ValueError, match=rf"^the training dataset holds no target tokens \({size} examples\): "):
            update_batching(100, dataset, 4096, 1)


def test_mean_target_tokens_per_batch_by_hand():
    dataset = token_dataset(np.array([3, 4]), np.array([5, 6]))
    assert mean_target_tokens_per_batch(dataset, 100) == 11.0  # one batch
    assert mean_target_tokens_per_batch(dataset, 6) == 5.5  # 2 × 6 > 6: a batch each
    assert mean_target_tokens_per_batch(dataset.select([]), 100) == 0.0  # no batch: none, not a division by 0


def test_token_budget_batches_keep_the_order_given_and_fill_the_budget_exactly():
    lengths = [3, 9, 2, 4, 30]
    # 30 alone (over the budget), then 2, 3, 4 (3 × 4 = 12, the budget exactly), then 9.
    assert token_budget_batches(lengths, [4, 2, 0, 3, 1], max_tokens=12) == [[4], [2, 0, 3], [1]]
    assert token_budget_batches([], [], max_tokens=12) == []


def test_indices_given_as_tuples_count_as_lists():
    # Typed `Sequence[int]`: a tuple of indices is a list of them, not numpy's index of several dimensions.
    assert token_budget_batches((3, 9, 2, 4, 30), (4, 2, 0, 3, 1), max_tokens=12) == [[4], [2, 0, 3], [1]]
    by_tuples = padding_efficiency([(0, 1), (2,)], source_lengths=(2, 4, 3), target_lengths=(1, 1, 5))
    assert by_tuples == padding_efficiency([[0, 1], [2]], source_lengths=[2, 4, 3], target_lengths=[1, 1, 5])


def test_fixed_batches_come_in_the_order_given():
    batches = [[3, 4], [0], [1, 2]]
    sampler = FixedBatchSampler(batches)
    assert len(sampler) == 3 and list(sampler) == batches and list(sampler) == batches


def test_split_batches_to_multiple_splits_down_to_single_examples_but_never_makes_an_empty_batch():
    assert split_batches_to_multiple([[0, 1]], 2) == [[0], [1]]
    assert split_batches_to_multiple([[0]], 2) == [[0]]  # fewer examples than processes: impossible


def test_split_batches_to_multiple_keeps_every_example_once():
    batches = split_batches_to_multiple([[0, 1, 2, 3], [4, 5], [6]], 4)
    assert len(batches) == 4
    assert sorted(i for batch in batches for i in batch) == list(range(7))


def test_split_batches_to_multiple_leaves_the_batches_given_as_they_were():
    # A new list of new batches: the caller's own (a sampler's, which it may iterate again) are not split in place.
    given = [[0, 1, 2, 3], [4, 5], [6]]
    assert split_batches_to_multiple(given, 4) == [[0, 1], [2, 3], [4, 5], [6]]
    assert given == [[0, 1, 2, 3], [4, 5], [6]]
