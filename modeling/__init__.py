"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing this package registers the model with the Auto classes, so that `AutoConfig`, `AutoModel` and
`AutoModelForSeq2SeqLM` resolve `model_type="vaswani_transformer"`, and marks the classes for
`register_for_auto_class`, so that `save_pretrained` writes `auto_map` and copies the five remote-code files
(configuration, model, generation, its cache and the oneDNN linear layers): a saved directory then loads with
`trust_remote_code=True` where this package is not installed.

The tokenizer of converted fairseq models (`tokenization_fairseq.FairseqTokenizer`) is registered the same way:
`AutoTokenizer` finds it by the name in `tokenizer_config.json` without the flag, and its `save_pretrained` copies
its file and writes `auto_map`. (Registered for this model type, it is also what `AutoTokenizer` would pick for a
directory whose tokenizer config names no class; this project's own tokenizers always name theirs.)
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from .configuration_transformer import TransformerConfig
from .generation_transformer import GNMTLengthPenalty
from .modeling_transformer import TransformerForConditionalGeneration, TransformerModel, TransformerPreTrainedModel
from .tokenization_fairseq import FairseqTokenizer

AutoConfig.register(TransformerConfig.model_type, TransformerConfig, exist_ok=True)
AutoModel.register(TransformerConfig, TransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(TransformerConfig, TransformerForConditionalGeneration, exist_ok=True)
AutoTokenizer.register(TransformerConfig, tokenizer_class=FairseqTokenizer, exist_ok=True)

TransformerConfig.register_for_auto_class()
TransformerModel.register_for_auto_class("AutoModel")
TransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
FairseqTokenizer.register_for_auto_class("AutoTokenizer")

__all__ = [
    "TransformerConfig",
    "TransformerPreTrainedModel",
    "TransformerModel",
    "TransformerForConditionalGeneration",
    "GNMTLengthPenalty",
    "FairseqTokenizer",
]
