"""A tiny, seeded English→German checkpoint shared by the evaluation, script and Hub tests.

Everything is made here, from a toy word-for-word language pair: no downloaded data, no network. The model is
untrained (its outputs are arbitrary but deterministic), which is all these tests need.
"""

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.tokenization import train_shared_bpe

EN_DE = {
    "the": "der",
    "small": "kleine",
    "big": "große",
    "dog": "Hund",
    "cat": "Katze",
    "sees": "sieht",
    "likes": "mag",
    "a": "einen",
    "red": "roten",
    "ball": "Ball",
    "house": "Haus",
    "today": "heute",
}


def synthetic_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` (English, German) sentence pairs of 3 to 8 words, with a final full stop."""
    rng = random.Random(seed)
    words = list(EN_DE)
    pairs = []
    for _ in range(count):
        sentence = rng.choices(words, k=rng.randint(3, 8))
        pairs.append((" ".join(sentence) + ".", " ".join(EN_DE[w] for w in sentence) + "."))
    return pairs


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    texts = [text for pair in synthetic_pairs(200) for text in pair]
    return train_shared_bpe(texts, vocab_size=96, min_frequency=1)


def tiny_config(vocab_size: int, **overrides) -> TransformerConfig:
    """The tests' model size: d_model 32, 2 + 2 layers, 4 heads, d_ff 64, with `overrides` on top."""
    size = dict(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    return TransformerConfig(**{**size, "vocab_size": vocab_size, **overrides})


def tiny_model(vocab_size: int, seed: int = 0) -> TransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = tiny_config(vocab_size)
    model = TransformerForConditionalGeneration(config).eval()
    # An untrained model rarely stops early: a short length limit keeps decoding in tests fast.
    model.generation_config.max_length_offset = 8
    return model


def save_tiny_checkpoint(directory: str | Path) -> tuple[TransformerForConditionalGeneration, PreTrainedTokenizerFast]:
    """Save model and tokenizer side by side, as training does, and return them."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Decode tiny models on one thread: they gain nothing from more, and OpenMP threads competing with other
    processes for the cores spin and slow decoding down several times over."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
