"""Token-budget batching (Sec. 5.1), for training, evaluation and translation alike.

"Sentence pairs were batched together by approximate sequence length. Each training batch contained a set of
sentence pairs containing approximately 25000 source tokens and 25000 target tokens." Batches are cut greedily from
length-sorted examples while `count × longest ≤ max_tokens` holds on each side (the padded size):

- `TokenBudgetBatchSampler`: shuffled training batches (or length-ordered evaluation ones), shardable over ranks;
- `FixedBatchSampler` and `split_batches_to_multiple`: evaluation batches that every process gets exactly once;
- `token_budget_batches`: the same greedy cut over sentences in a given order, for `modeling.translation`;
- `gradient_accumulation_steps_for` and `mean_target_tokens_per_batch`: how many micro-batches make an update of
  the asked number of tokens, on any number of processes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Sampler

if TYPE_CHECKING:  # translating imports this module, and needs neither datasets nor pyarrow
    import datasets

logger = logging.getLogger(__name__)


def sequence_lengths(dataset: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths in tokens (`input_ids`, `labels`), read from Arrow without decoding rows."""
    import pyarrow.compute as pc  # with the datasets extra, as the dataset itself

    table = dataset.with_format("arrow")
    return (
        pc.list_value_length(table["input_ids"]).to_numpy(),
        pc.list_value_length(table["labels"]).to_numpy(),
    )


def padding_efficiency(
    batches: Iterable[Sequence[int]], source_lengths: Sequence[int], target_lengths: Sequence[int]
) -> dict[str, float]:
    """Real tokens / padded tokens (batch size × longest sequence) over `batches`, per side and overall."""
    # int64: Arrow's lengths (`sequence_lengths`) are int32, whose sums overflow past 2**31 padded tokens
    source, target = np.asarray(source_lengths, dtype=np.int64), np.asarray(target_lengths, dtype=np.int64)
    real_src = real_tgt = padded_src = padded_tgt = 0
    for batch in batches:
        batch = np.asarray(batch)
        real_src, real_tgt = real_src + source[batch].sum(), real_tgt + target[batch].sum()
        padded_src += source[batch].max() * len(batch)
        padded_tgt += target[batch].max() * len(batch)
    return {
        "source": float(real_src / padded_src),
        "target": float(real_tgt / padded_tgt),
        "total": float((real_src + real_tgt) / (padded_src + padded_tgt)),
    }


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of similar-length examples holding about `max_tokens` padded tokens on each side.

    Sec. 5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
    contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
    tokens." Examples are sorted by length with ties broken at random (as in fairseq), then cut greedily
    into batches while `count × longest ≤ max_tokens` holds for source and target separately (padded
    size). An example longer than `max_tokens` forms a batch alone: the only case where the budget is
    exceeded. The sort key is (max(source, target), target, source) rather than fairseq's (source,
    target): the budget binds on the longer side, and on Multi30k en-de at 4096 tokens this raises the
    padding efficiency from 0.93 to 0.96 (source 0.88 → 0.94) with 7% fewer batches. The batch order is
    shuffled from (seed, epoch); call `set_epoch` before each epoch.

    Several processes: with `num_replicas` > 1, rank r takes batches r, r + R, ... of the shuffled list.
    When the number of batches is not a multiple of R, the first few batches are repeated (at most R - 1,
    logged) so every rank yields the same number and no rank waits at the end of an epoch; every
    example is still seen at least once. Do not shard again: under `accelerate` / `Trainer`, either keep
    `num_replicas=1` and let `accelerator.prepare` shard the batches, or bypass its sharding.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if len(source_lengths) != len(target_lengths):
            raise ValueError(f"{len(source_lengths)} source lengths but {len(target_lengths)} target lengths")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0

        # The sequence of length pairs after sorting does not depend on how ties are broken, so batch
        # boundaries (and the number of batches) are the same every epoch: compute them once.
        order = np.lexsort(self._sort_keys())
        self._ends = _greedy_batch_ends(self.source_lengths[order], self.target_lengths[order], max_tokens)
        self._num_repeated = -len(self._ends) % num_replicas if self._ends else 0
        if self._num_repeated:
            logger.info(
                "%d batches for %d replicas: repeating %d batches per epoch so that every rank gets %d",
                len(self._ends),
                num_replicas,
                self._num_repeated,
                len(self),
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return (len(self._ends) + self._num_repeated) // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.all_batches()[self.rank :: self.num_replicas]:
            yield batch.tolist()

    def all_batches(self) -> list[np.ndarray]:
        """This epoch's batches for all ranks, in order, repeated batches included."""
        if not self._ends:
            return []
        rng = np.random.default_rng([self.seed, self.epoch])
        ties = rng.permutation(len(self.source_lengths)) if self.shuffle else np.arange(len(self.source_lengths))
        order = np.lexsort((ties, *self._sort_keys()))
        batches = np.split(order, self._ends[:-1])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches + [batches[i % len(batches)] for i in range(self._num_repeated)]

    def _sort_keys(self) -> tuple[np.ndarray, ...]:
        # np.lexsort sorts by the last key first: longer side, then target, then source.
        longer = np.maximum(self.source_lengths, self.target_lengths)
        return self.source_lengths, self.target_lengths, longer

    def padding_efficiency(self) -> dict[str, float]:
        """Real / padded tokens over this epoch's batches (all ranks): see `padding_efficiency`."""
        return padding_efficiency(self.all_batches(), self.source_lengths, self.target_lengths)


def _greedy_batch_ends(source: np.ndarray, target: np.ndarray, max_tokens: int) -> list[int]:
    """End offsets of the batches cut greedily from length-sorted examples under the padded budget."""
    ends, longest_src, longest_tgt, count = [], 0, 0, 0
    for i, (src, tgt) in enumerate(zip(source.tolist(), target.tolist(), strict=True)):
        new_src, new_tgt = max(longest_src, src), max(longest_tgt, tgt)
        if count and max(new_src, new_tgt) * (count + 1) > max_tokens:
            ends.append(i)
            longest_src, longest_tgt, count = src, tgt, 1
        else:
            longest_src, longest_tgt, count = new_src, new_tgt, count + 1
    if count:
        ends.append(len(source))
    return ends


def token_budget_batches(lengths: Sequence[int], order: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices taken in `order`, cut into batches of at most `max_tokens` padded tokens (`count × longest`).

    A sentence longer than the budget still gets a batch of its own rather than being dropped.
    """
    order = np.asarray(order, dtype=np.int64)
    ordered_lengths = np.asarray(lengths, dtype=np.int64)[order]
    ends = _greedy_batch_ends(ordered_lengths, np.zeros_like(ordered_lengths), max_tokens)
    return [batch.tolist() for batch in np.split(order, ends[:-1])] if ends else []


_BUDGET_CORRECTIONS = 8


def gradient_accumulation_steps_for(tokens_per_update: int, tokens_per_batch: float, world_size: int) -> int:
    """Micro-batches per update so that `world_size × steps × tokens_per_batch` comes closest to the target, or
    reaches it where the closest count falls more than 10% short (the batches can then be made smaller, see
    `update_batching`)."""
    if tokens_per_update <= 0 or tokens_per_batch <= 0 or world_size < 1:
        raise ValueError(
            f"tokens_per_update ({tokens_per_update}), tokens_per_batch ({tokens_per_batch}) and world_size "
            f"({world_size}) must be positive."
        )
    exact = tokens_per_update / (tokens_per_batch * world_size)
    steps = max(1, round(exact))
    return math.ceil(exact) if steps < 0.9 * exact else steps


def update_batching(
    tokens_per_update: int, dataset: datasets.Dataset, max_tokens: int, world_size: int
) -> tuple[int, int]:
    """Micro-batches per update, and padded tokens per batch (at most `max_tokens`), that make an update of
    `world_size` processes hold about `tokens_per_update` real target tokens of `dataset`.

    The paper's "approximately 25000 source tokens and 25000 target tokens" per update (Sec. 5.1) then hold on any
    number of GPUs. One GPU accumulates several batches of 4096; where one batch of `max_tokens` on every process
    already holds more than 10% too many (8 GPUs × 4096 hold ~31,000 real target tokens, 16 GPUs ~62,000), the
    batches are made smaller instead, never larger than `max_tokens` (the memory a device was given). Logs the
    result, and warns where it is still more than 10% off.
    """
    budget = max_tokens
    per_batch = mean_target_tokens_per_batch(dataset, budget)
    if per_batch == 0:  # else "tokens_per_batch (0.0) ... must be positive", naming no dataset
        raise ValueError(
            f"the training dataset holds no target tokens ({len(dataset)} examples): no update of "
            f"tokens_per_update={tokens_per_update} can be made of it."
        )
    steps = gradient_accumulation_steps_for(tokens_per_update, per_batch, world_size)
    # Real tokens grow about in proportion to the budget where batches are full; a few corrections cover the rest.
    for _ in range(_BUDGET_CORRECTIONS):
        if steps * per_batch * world_size <= 1.1 * tokens_per_update or budget == 1:
            break
        budget = max(round(budget * tokens_per_update / (steps * per_batch * world_size)), 1)
        per_batch = mean_target_tokens_per_batch(dataset, budget)
    if budget < max_tokens:
        logger.info(
            "Batches of at most %d tokens instead of %d, so that an update holds ~%d target tokens",
            budget,
            max_tokens,
            tokens_per_update,
        )
    achieved = steps * per_batch * world_size
    logger.info(
        "%d process(es) × %d micro-batch(es) of ~%.0f target tokens = ~%.0f target tokens per update (asked %d)",
        world_size,
        steps,
        per_batch,
        achieved,
        tokens_per_update,
    )
    if abs(achieved - tokens_per_update) > 0.1 * tokens_per_update:
        logger.warning(
            "An update holds ~%.0f target tokens, %+.0f%% off the %d asked (%d processes, ~%.0f target tokens per "
            "batch of at most %d): change max_tokens_per_device or tokens_per_update.",
            achieved,
            100 * (achieved / tokens_per_update - 1),
            tokens_per_update,
            world_size,
            per_batch,
            budget,
        )
    return steps, budget


def mean_target_tokens_per_batch(dataset: datasets.Dataset, max_tokens: int) -> float:
    """Real (unpadded) target tokens per token-budget batch of `dataset`, on average over an epoch.

    Batches are cut on the padded size, so they hold fewer real tokens than `max_tokens`; deriving the number of
    micro-batches from this average rather than from `max_tokens` makes an update hold the asked number of real
    target tokens (those the loss is averaged over).
    """
    source_lengths, target_lengths = sequence_lengths(dataset)
    num_batches = len(TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens, shuffle=False))
    return float(target_lengths.sum()) / max(num_batches, 1)


class FixedBatchSampler(Sampler[list[int]]):
    """A fixed list of batches of dataset indices, in order."""

    def __init__(self, batches: Sequence[Sequence[int]]):
        self.batches = [list(batch) for batch in batches]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def split_batches_to_multiple(batches: Sequence[Sequence[int]], multiple: int) -> list[list[int]]:
    """Halve the largest batches until their number is a multiple of `multiple` (the number of processes).

    accelerate evens out the batches of several processes by repeating the first ones, and `Seq2SeqTrainer` gathers
    predictions without dropping repeats: repeated sentences would count twice in BLEU and eval loss. Splitting
    (at most `multiple - 1` times) avoids it; it is impossible only with fewer examples than processes.
    """
    batches = [list(batch) for batch in batches]
    while len(batches) % multiple:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        batch = batches[largest]
        if len(batch) < 2:
            break
        batches[largest : largest + 1] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    return batches
