"""Translating in bulk, and loading this project's checkpoints for it.

`translate` sorts sentences by length into token-budget batches and returns one line per input line, in order;
`load_model_and_tokenizer` loads a saved or Hub checkpoint of this model and refuses anything else. Only torch,
transformers and tqdm are needed: deploying needs none of the training or evaluation extras.
"""

import glob
import os
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .batching import token_budget_batches
from .checkpoints import weights_problems
from .hub_client import naming_hub_failures, use_hub_timeouts

MODEL_TYPE = "vaswani_transformer"


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    progress: bool = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Translate `sentences` with `model.generate`, returning one line per input line, in the input order.

    Sentences are sorted by length and grouped into batches of at most `max_tokens` padded tokens *counting every
    beam*: at most `max_tokens / num_beams` padded source tokens per batch, since beam search decodes `num_beams`
    hypotheses of each sentence at once (beam 1000 takes one sentence at a time rather than running out of
    memory). Sorting wastes far less compute on padding than fixed-size batches. Empty (or blank) lines are never sent
    to the model and come back as empty lines, so line-aligned files stay aligned. Decoding settings default
    to the model's generation config (the paper's beam 4 and length penalty); `num_beams` and
    `generate_kwargs` override them.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
    outputs = [""] * len(sentences)
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if not todo:
        return outputs
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    beams = generate_kwargs.get("num_beams") or getattr(model.generation_config, "num_beams", None) or 1
    source_budget = max(1, max_tokens // max(int(beams), 1))

    input_ids = tokenizer([sentences[i].strip() for i in todo])["input_ids"]
    lengths = [len(ids) for ids in input_ids]
    order = sorted(range(len(todo)), key=lambda k: -lengths[k])

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(total=len(todo), disable=not progress, unit="sent") as bar:
            for batch in token_budget_batches(lengths, order, source_budget):
                features = tokenizer.pad({"input_ids": [input_ids[k] for k in batch]}, return_tensors="pt")
                generated = model.generate(**features.to(model.device), **generate_kwargs)
                texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
                for k, text in zip(batch, texts, strict=True):
                    outputs[todo[k]] = text.strip()
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return outputs


def _looks_like_local_path(name: str) -> bool:
    """Hub repo ids are `name` or `namespace/name`; anything else can only be meant as a directory."""
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def load_model_and_tokenizer(
    name_or_path: str, *, attn_implementation: str | None = None, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a saved or Hub checkpoint of this model, refusing anything else with a message that says why.

    Importing this module imports `modeling`, whose registration makes the installed classes load the
    checkpoint: no downloaded code is executed. `attn_implementation="eager"` is needed to return attention
    weights.
    """
    if os.path.isdir(name_or_path):
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise FileNotFoundError(
                f"{name_or_path!r} has no config.json: it is not a model saved with save_pretrained."
            )
    elif _looks_like_local_path(name_or_path):
        raise FileNotFoundError(f"Model directory {name_or_path!r} does not exist.")
    else:
        use_hub_timeouts()
    with naming_hub_failures(f"Could not load {name_or_path!r} from the Hub"):
        try:
            config = AutoConfig.from_pretrained(name_or_path)
        except OSError as error:
            raise OSError(
                f"Could not load a model config from {name_or_path!r}: it is neither a local directory nor a "
                f"reachable Hub repo id. ({error})"
            ) from error
        if config.model_type != MODEL_TYPE:
            raise ValueError(
                f"{name_or_path!r} holds a {config.model_type!r} checkpoint, not a {MODEL_TYPE!r} one; "
                "these tools only handle this project's models (convert others first, e.g. modeling.convert)."
            )
        if os.path.isdir(name_or_path) and (glob.glob(os.path.join(glob.escape(name_or_path), "*.safetensors"))):
            problems = weights_problems(name_or_path)
            if problems:
                raise ValueError(
                    f"{name_or_path!r} holds incomplete weights: {'; '.join(problems)}. The file was cut short "
                    "(an interrupted save or copy): save or copy the model again."
                )
        model_kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, **model_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer
