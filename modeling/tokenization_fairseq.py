"""fairseq's text pipeline as a transformers tokenizer: Moses tokenisation and subword-nmt BPE in, and back out.

What `fairseq-interactive --tokenizer moses --bpe subword_nmt --bpe-codes CODES` does to a line, and to a
hypothesis, is `FSMTTokenizer` (transformers' port of fairseq's WMT19 models) without three of its additions:

- no punctuation normalisation: fairseq calls `MosesTokenizer(lang).tokenize(line, aggressive_dash_splits=True,
  escape=True)` only, where FSMT first rewrites quotes, dashes and ellipses (`replace_unicode_punct`,
  `MosesPunctNormalizer`) and deletes control and format characters (a tab would glue two words);
- special-token strings in the text are text (`split_special_tokens=True`): Moses escapes `<unk>` to
  `&lt; unk &gt;`, as fairseq does;
- decoding keeps `<unk>` as a word, as fairseq's `Dictionary.string` prints it (FSMT drops it, or glues it to the
  next word); `skip_special_tokens=True` drops only `<s>`, `<pad>` and `</s>`.

Source text is tokenised with Moses rules for the source language, `text_target` with the target language's (as
fairseq-preprocess did for each side); hypotheses are detokenised with the target language's rules.

With `pretokenized=True` (a model converted with `--pretokenized`, without BPE codes) the text is taken as
fairseq's input without `--tokenizer` and `--bpe`: already Moses-tokenised and BPE-split, tokens separated by
spaces, continuation marks `@@` included. Decoding then removes the continuation marks (fairseq's `--post-process
subword_nmt`) but does not detokenise: the output is tokenised text.

Dashes inside words are split as Moses' `-a` splits them (`long @-@ term`), as fairseq's tokenizer always does,
where the model's dictionary holds `@-@`: its training text was tokenised so. Where it does not, as for text
tokenised without `-a` (Google's WMT'16 English-German preparation, which `transformer.wmt16.en-de` was trained on),
words keep their dashes (`aggressive_dash_splits=False`): split, they would become a token the model never saw.

This file travels with converted models as remote code: it imports transformers, and sacremoses when a tokenizer
is built (not at import: `import modeling` does not need sacremoses).
"""

from transformers.models.fsmt.tokenization_fsmt import FSMTTokenizer

# The converted vocabulary marks a word's last piece as `piece</w>` and a continued piece as `piece` (fairseq's
# dictionary writes them `piece` and `piece@@`).
END_OF_WORD = "</w>"
CONTINUATION = "@@"


def converted_spelling(token: str) -> str:
    """A fairseq dictionary token as the converted vocabulary spells it: `x@@` is `x`, `x` is `x</w>`."""
    return token[: -len(CONTINUATION)] if token.endswith(CONTINUATION) else token + END_OF_WORD


class FairseqTokenizer(FSMTTokenizer):
    """`FSMTTokenizer` doing exactly what fairseq's `--tokenizer moses --bpe subword_nmt` do (see the module)."""

    def __init__(
        self,
        langs=None,
        src_vocab_file=None,
        tgt_vocab_file=None,
        merges_file=None,
        pretokenized: bool = False,
        aggressive_dash_splits: bool = True,
        eos_token="</s>",
        split_special_tokens: bool = True,
        clean_up_tokenization_spaces: bool = False,
        **kwargs,
    ):
        # FSMTTokenizer imports sacremoses itself; importing it here too makes transformers name it among the
        # packages to install when this file is loaded as remote code without it (imports inside functions count).
        import sacremoses  # noqa: F401

        self.pretokenized = pretokenized
        self.aggressive_dash_splits = aggressive_dash_splits
        self._moses_lang = None  # set by the target-mode switches; None: the source language
        super().__init__(
            langs=langs,
            src_vocab_file=src_vocab_file,
            tgt_vocab_file=tgt_vocab_file,
            merges_file=merges_file,
            pretokenized=pretokenized,
            aggressive_dash_splits=aggressive_dash_splits,
            eos_token=eos_token,
            split_special_tokens=split_special_tokens,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            **kwargs,
        )

    def add_tokens(self, new_tokens, special_tokens: bool = False) -> int:
        """Refused for ordinary tokens: every text goes through Moses and BPE, as in fairseq, never through
        transformers' added-token matching (`split_special_tokens=True`), so an added token would never be
        produced and its embedding row never trained. Special tokens, placed by id, are added as usual."""
        tokens = new_tokens if isinstance(new_tokens, (list, tuple)) else [new_tokens]
        ordinary = [token for token in tokens if not (special_tokens or getattr(token, "special", False))]
        if ordinary:
            raise ValueError(
                f"{type(self).__name__} cannot add {str(ordinary[0])!r}: fairseq's Moses + BPE pipeline would never "
                "produce it. Its BPE splits any word into known pieces; add special tokens by id if you need them."
            )
        return super().add_tokens(new_tokens, special_tokens=special_tokens)

    def moses_pipeline(self, text, lang):
        """fairseq normalises nothing before Moses tokenisation."""
        return text

    def moses_tokenize(self, text, lang):
        """Moses as fairseq calls it, dashes split only where the training text had them split (see the module)."""
        if lang not in self.cache_moses_tokenizer:
            self.cache_moses_tokenizer[lang] = self.sm.MosesTokenizer(lang=lang)
        return self.cache_moses_tokenizer[lang].tokenize(
            text, aggressive_dash_splits=self.aggressive_dash_splits, return_str=False, escape=True
        )

    def _switch_to_target_mode(self):
        self._moses_lang = self.tgt_lang

    def _switch_to_input_mode(self):
        self._moses_lang = None

    def _tokenize(self, text, **kwargs):
        if self.pretokenized:  # fairseq's Dictionary.encode_line: whitespace-separated dictionary tokens
            return [self._vocabulary_token(token) for token in text.split()]
        if self.do_lower_case:
            text = text.lower()
        words = self.moses_tokenize(text, self._moses_lang or self.src_lang)
        return [piece for word in words if word for piece in self.bpe(word).split(" ")]

    def _vocabulary_token(self, token: str) -> str:
        """A dictionary token as the converted vocabulary spells it; special tokens as they are."""
        return token if token in self.all_special_tokens else converted_spelling(token)

    def convert_tokens_to_string(self, tokens):
        """BPE pieces joined into words, then Moses-detokenised (target language); a special token is a word."""
        special = set(self.all_special_tokens)
        tokens = [token + END_OF_WORD if token in special else token for token in tokens]
        if self.pretokenized:
            return " ".join("".join(token.replace(END_OF_WORD, " ") for token in tokens).split())
        return super().convert_tokens_to_string(tokens)

    def _decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None, **kwargs):
        """`skip_special_tokens=True` drops `<s>`, `<pad>` and `</s>` and keeps `<unk>` (fairseq prints it)."""
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if skip_special_tokens:
            dropped = {self.bos_token_id, self.pad_token_id, self.eos_token_id, self.sep_token_id} - {None}
            token_ids = [token_id for token_id in token_ids if int(token_id) not in dropped]
        return super()._decode(
            token_ids,
            skip_special_tokens=False,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            **kwargs,
        )


__all__ = ["FairseqTokenizer", "converted_spelling"]
