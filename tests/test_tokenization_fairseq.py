"""Tests of modeling/tokenization_fairseq.py: fairseq's Moses + subword-nmt pipeline and its detokenisation, against
what fairseq itself produced (tests/fixtures/fairseq), without fairseq installed."""

import json
import subprocess
import sys

import pytest
from helpers import FAIRSEQ_FIXTURES, FAIRSEQ_MODELS, fairseq_outputs, fairseq_pipeline_cases, subprocess_env
from transformers import AutoTokenizer, FSMTTokenizer
from transformers.dynamic_module_utils import get_imports

from modeling.fairseq import fairseq_tokenizer, read_fairseq_dictionary
from modeling.tokenization_fairseq import FairseqTokenizer

HELD_OUT = fairseq_outputs(FAIRSEQ_MODELS[0])
CASES = fairseq_pipeline_cases()


@pytest.fixture(scope="module")
def symbols():
    return read_fairseq_dictionary(FAIRSEQ_FIXTURES / "dict.en.txt")


@pytest.fixture(scope="module")
def tokenizer(symbols):
    return fairseq_tokenizer(symbols, source_lang="en", target_lang="de", bpe_codes=FAIRSEQ_FIXTURES / "bpecodes")


def as_fairseq_bpe(tokens: list[str]) -> str:
    """The tokenizer's pieces as fairseq writes them: `x</w>` is `x`, a continued `x` is `x@@`."""
    return " ".join(token[: -len("</w>")] if token.endswith("</w>") else token + "@@" for token in tokens)


def test_held_out_sentences_go_raw_to_moses_to_bpe_to_ids_as_in_fairseq_interactive(tokenizer):
    for record in HELD_OUT["heldout_text"]:  # raw line -> tok -> bpe -> ids, as fairseq-interactive encoded them
        assert " ".join(tokenizer.moses_tokenize(record["raw"].strip(), "en")) == record["tok"]
        assert as_fairseq_bpe(tokenizer.tokenize(record["raw"])) == record["bpe"]
        assert tokenizer(record["raw"])["input_ids"] == record["src_ids"]


def test_targets_are_tokenised_with_the_target_languages_moses_rules(tokenizer):
    references = (FAIRSEQ_FIXTURES / "heldout.de").read_text(encoding="utf-8").splitlines()
    for record in HELD_OUT["heldout_binarized"]:  # fairseq-preprocess's German side
        encoded = tokenizer(text_target=references[record["id"]])["input_ids"]
        assert encoded == record["tgt_ids"], record["id"]
    for case in CASES["encode_target"]:  # "z.B." and "3." stay one token under the German rules only
        assert tokenizer(text_target=case["raw"])["input_ids"] == case["ids"], case["raw"]
    assert tokenizer(CASES["encode_target"][1]["raw"])["input_ids"] != CASES["encode_target"][1]["ids"]


def test_edge_cases_are_encoded_as_fairseq_encodes_them(tokenizer):
    """Quotes, dashes, ellipses, tabs, soft hyphens, zero-width spaces, `<unk>` and `</s>` in the text, `@@` in the
    text, spaces around, an empty line: fairseq normalises nothing before Moses."""
    for case in CASES["encode"]:
        assert tokenizer(case["raw"])["input_ids"] == case["ids"], case["raw"]
        if case["raw"].strip():
            assert as_fairseq_bpe(tokenizer.tokenize(case["raw"])) == case["bpe"], case["raw"]


def test_transformers_fsmt_tokenizer_alone_would_differ(symbols, tokenizer, tmp_path):
    """Why the subclass: FSMT normalises punctuation and drops control characters before Moses."""
    tokenizer.save_pretrained(tmp_path)
    files = {name: str(tmp_path / f"{name.replace('_', '-')}.json") for name in ("vocab_src", "vocab_tgt")}
    fsmt = FSMTTokenizer(
        langs=["en", "de"],
        src_vocab_file=files["vocab_src"],
        tgt_vocab_file=files["vocab_tgt"],
        merges_file=str(tmp_path / "merges.txt"),
    )
    differing = [case["raw"] for case in CASES["encode"] if fsmt(case["raw"])["input_ids"] != case["ids"]]
    assert "A dog \u201cjumps\u201d over a fence \u2026 and runs." in differing
    assert "Two  men   walk\tdown the street." in differing


def test_hypotheses_are_detokenised_as_fairseq_prints_them(tokenizer):
    """Every hypothesis fairseq produced (both models, all settings, n-best lists included), ids -> D- line."""
    count = 0
    for name in FAIRSEQ_MODELS:
        for setting in fairseq_outputs(name)["settings"].values():
            for sentence in setting["sentences"]:
                for hypothesis in sentence["nbest"]:
                    ids = hypothesis["ids"] + [tokenizer.pad_token_id] * 3  # as generate() pads a batch
                    assert tokenizer.decode(ids, skip_special_tokens=True) == hypothesis["detok"]
                    count += 1
    assert count == 2 * (11 * 50 + 200)


def test_unk_stays_a_word_and_continuation_marks_are_removed_as_in_fairseq(tokenizer):
    for probe in CASES["decode"]:  # `<unk>` alone, glued to a BPE prefix, a final `M@@`, Moses escapes
        assert tokenizer.decode(probe["ids"], skip_special_tokens=True) == probe["detok"], probe["bpe"]
    ids = CASES["decode"][0]["ids"]
    assert tokenizer.decode([tokenizer.bos_token_id, *ids], skip_special_tokens=False).startswith("<s>")
    assert tokenizer.batch_decode([ids], skip_special_tokens=True) == [CASES["decode"][0]["detok"]]


def test_without_bpe_codes_text_is_taken_as_tokenised_and_bpe_split(symbols):
    """fairseq without --tokenizer/--bpe: whitespace-split dictionary tokens in, continuation marks removed out
    (`--post-process subword_nmt`), no detokenisation."""
    pretokenized = fairseq_tokenizer(symbols, source_lang="en", target_lang="de")
    assert pretokenized.pretokenized
    for case in CASES["pretokenized"]:
        assert pretokenized(case["text"])["input_ids"] == case["ids"], case["text"]
        decoded = pretokenized.decode(case["ids"], skip_special_tokens=True)
        assert decoded == case["string_post_process_subword_nmt"], case["text"]


def test_dashes_are_split_only_where_the_dictionary_shows_the_training_text_had_them_split(symbols, tmp_path):
    """fairseq's tokenizer always splits as Moses' `-a`; Google's WMT'16 text (`transformer.wmt16.en-de`) was
    tokenised without it, so its dictionary has no `@-@` and a split word would become pieces it never saw."""
    codes = FAIRSEQ_FIXTURES / "bpecodes"
    split = fairseq_tokenizer(symbols, source_lang="en", target_lang="de", bpe_codes=codes)
    kept = fairseq_tokenizer([s for s in symbols if s != "@-@"], source_lang="en", target_lang="de", bpe_codes=codes)
    assert split.aggressive_dash_splits and not kept.aggressive_dash_splits
    assert split.moses_tokenize("a long-term plan", "en") == ["a", "long", "@-@", "term", "plan"]
    assert kept.moses_tokenize("a long-term plan", "en") == ["a", "long-term", "plan"]
    assert kept.moses_tokenize("rot-weiß", "de") == ["rot-weiß"], "targets (a fine-tune's text_target) too"
    kept.save_pretrained(tmp_path)
    assert not AutoTokenizer.from_pretrained(tmp_path).aggressive_dash_splits
    assert kept.decode(kept("a long-term plan")["input_ids"], skip_special_tokens=True) == "a long-term plan"


def test_saved_tokenizer_loads_by_name_with_the_project_and_carries_its_code(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "tokenization_fairseq.py").is_file()
    loaded = AutoTokenizer.from_pretrained(tmp_path)  # no trust_remote_code: the registered class
    assert type(loaded) is FairseqTokenizer and loaded.split_special_tokens and not loaded.pretokenized
    for record in HELD_OUT["heldout_text"][:10]:
        assert loaded(record["raw"])["input_ids"] == record["src_ids"]
    assert loaded.get_vocab() == tokenizer.get_vocab() and len(loaded) == 568


def test_the_end_of_sentence_token_is_fairseqs_and_ends_every_sentence_saved_or_not(tokenizer, tmp_path):
    """transformers' FSMTTokenizer sets no eos_token (it ends sentences with its sep_token); without one, fine-tuning
    a converted model would be refused ("has no eos_token")."""
    tokenizer.save_pretrained(tmp_path)
    for loaded in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        assert (loaded.eos_token, loaded.eos_token_id) == ("</s>", 2)  # fairseq's <s>, <pad>, </s>, <unk>
        encoded = loaded("a small test", text_target="ein kleiner Test")
        assert encoded["input_ids"][-1] == encoded["labels"][-1] == loaded.eos_token_id


def test_sacremoses_is_named_as_a_requirement_of_the_remote_code_but_not_needed_to_import_the_project():
    import modeling.tokenization_fairseq as module

    assert "sacremoses" in get_imports(module.__file__)  # what transformers asks a remote-code user to install
    assert set(get_imports(module.__file__)) == {"sacremoses", "transformers"}
    script = "import sys, modeling; assert 'sacremoses' not in sys.modules, 'imported by import modeling'"
    result = subprocess.run([sys.executable, "-c", script], env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_ordinary_added_tokens_are_refused_as_the_pipeline_never_produces_them(symbols):
    tokenizer = fairseq_tokenizer(symbols, source_lang="en", target_lang="de", bpe_codes=FAIRSEQ_FIXTURES / "bpecodes")
    size = len(tokenizer)
    with pytest.raises(ValueError, match="cannot add 'Zebrastreifen': fairseq's Moses \\+ BPE pipeline would never"):
        tokenizer.add_tokens(["Zebrastreifen"])
    assert len(tokenizer) == size
    assert tokenizer.add_tokens(["<2fr>"], special_tokens=True) == 1
    assert tokenizer.convert_tokens_to_ids("<2fr>") == size, "a special token, placed by id"


def test_a_saved_tokenizer_without_its_options_loads_as_fairseq_interactives_pipeline(tokenizer, tmp_path):
    """A tokenizer_config.json without `pretokenized` and `aggressive_dash_splits` (a conversion made before the
    dash option existed, or files put together by hand) means fairseq's defaults: Moses splitting dashes, then BPE."""
    tokenizer.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    del config["pretokenized"], config["aggressive_dash_splits"]
    config_file.write_text(json.dumps(config), encoding="utf-8")
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.moses_tokenize("a long-term plan", "en") == ["a", "long", "@-@", "term", "plan"]
    for record in HELD_OUT["heldout_text"][:10]:
        assert loaded(record["raw"])["input_ids"] == record["src_ids"]
