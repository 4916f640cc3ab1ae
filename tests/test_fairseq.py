"""Tests of modeling/fairseq.py: fairseq-made checkpoints (tests/fixtures/fairseq) converted give fairseq's
log-probabilities and fairseq's translations, token for token, in every recorded setting, without fairseq; what
cannot be converted exactly is refused, naming the field."""

import argparse
import errno
import gzip
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
import zipfile

import numpy as np
import pytest
import torch
from helpers import (
    FAIRSEQ_FIXTURES,
    FAIRSEQ_MODELS,
    MULTI30K,
    convert_fairseq_fixture,
    fairseq_beam_search,
    fairseq_outputs,
    right_padded,
    subprocess_env,
)
from test_remote_code import BLOCK_THE_PACKAGE

from modeling import convert
from modeling.fairseq import (
    CONVERSION_FILE,
    FairseqConversionError,
    convert_fairseq,
    fairseq_config,
    fairseq_model_args,
    fairseq_state_dict,
    fairseq_tokenizer,
    from_fairseq,
    load_fairseq_checkpoint,
    read_bpe_merges,
    read_fairseq_dictionary,
    tokenizer_vocabulary,
)
from modeling.files import DiskFullError
from modeling.translation import load_model_and_tokenizer

PAD, EOS = 1, 2


def hypotheses(generated: torch.Tensor, count: int, per_sentence: int) -> list[list[list[int]]]:
    """generate()'s rows without the start token, each up to and including </s>, grouped by sentence."""
    rows = [row[1:][: row[1:].index(EOS) + 1] if EOS in row[1:] else row[1:] for row in generated.tolist()]
    return [rows[i * per_sentence : (i + 1) * per_sentence] for i in range(count)]


@pytest.mark.parametrize("name", FAIRSEQ_MODELS)
def test_logits_are_fairseqs_teacher_forced_log_probabilities(converted_fairseq, name):
    model, _ = converted_fairseq[name]
    recorded = torch.load(FAIRSEQ_FIXTURES / name / "teacher_forced.pt", weights_only=True)
    source = recorded["src_tokens_right_padded"]
    with torch.no_grad():
        logits = model(
            input_ids=source, attention_mask=source.ne(PAD).long(), decoder_input_ids=recorded["prev_output_tokens"]
        ).logits
    real = recorded["target"].ne(PAD)  # rows of target padding are meaningless
    difference = (logits.float().log_softmax(-1) - recorded["lprobs"])[real].abs().max().item()
    assert difference < 1e-5, difference


@pytest.mark.parametrize("name", FAIRSEQ_MODELS)
def test_beam_search_gives_fairseqs_hypotheses_in_every_recorded_setting(converted_fairseq, name):
    """All 12 settings (fairseq-generate and fairseq-interactive; beam 4 and 1; lenpen 0.6 and 1.0; batches of 1
    and 16; limits a · W + b that bind, W the batch's padded width): each recorded batch decoded as a batch, with
    the model's generation config and the setting's beam, lenpen and limits; n-best lists where recorded."""
    model, _ = converted_fairseq[name]
    outputs = fairseq_outputs(name)
    sources = {record["id"]: record["src_ids"] for record in outputs["heldout_binarized"]}
    compared = 0
    for setting_name, setting in outputs["settings"].items():
        sentences = {sentence["id"]: sentence for sentence in setting["sentences"]}
        for recorded_batch in setting["batches"]:
            ids = recorded_batch["ids"]
            inputs = right_padded([sources[i] for i in ids], PAD)
            assert inputs["input_ids"].shape[1] == recorded_batch["padded_src_len"]
            n_best = len(sentences[ids[0]]["nbest"])
            with torch.no_grad():
                generated = model.generate(
                    **inputs,
                    num_beams=setting["beam"],
                    length_penalty=setting["lenpen"],
                    max_length_a=setting["max_len_a"],
                    max_length_b=setting["max_len_b"],
                    num_return_sequences=n_best,
                )
            for sentence_id, ours in zip(ids, hypotheses(generated, len(ids), n_best), strict=True):
                expected = [hypothesis["ids"] for hypothesis in sentences[sentence_id]["nbest"]]
                assert ours == expected, (setting_name, sentence_id)
                compared += len(expected)
    assert compared == 11 * 50 + 4 * 50


def test_scores_are_fairseqs_and_transformers_loop_agrees(converted_fairseq):
    """The 4-best lists of generate/beam4_lenpen0.6_bs1 through transformers' own loop (return_dict_in_generate),
    with their scores: fairseq's score = sum of log-probabilities / length ** lenpen."""
    model, _ = converted_fairseq[FAIRSEQ_MODELS[0]]
    outputs = fairseq_outputs(FAIRSEQ_MODELS[0])
    setting = outputs["settings"]["generate/beam4_lenpen0.6_bs1"]
    for record, sentence in list(zip(outputs["heldout_binarized"], setting["sentences"], strict=True))[:20]:
        inputs = right_padded([record["src_ids"]], PAD)
        out = model.generate(**inputs, num_return_sequences=4, output_scores=True, return_dict_in_generate=True)
        assert hypotheses(out.sequences, 1, 4)[0] == [hypothesis["ids"] for hypothesis in sentence["nbest"]]
        expected = [hypothesis["score"] for hypothesis in sentence["nbest"]]
        assert out.sequences_scores.tolist() == pytest.approx(expected, abs=2e-5)


def test_the_tests_fairseq_beam_search_reproduces_fairseq(converted_fairseq):
    """helpers.fairseq_beam_search, the reference of tests/test_generation.py, gives fairseq's 4-best lists."""
    model, _ = converted_fairseq[FAIRSEQ_MODELS[1]]
    outputs = fairseq_outputs(FAIRSEQ_MODELS[1])
    setting = outputs["settings"]["generate/beam4_lenpen0.6_bs1"]
    for record, sentence in list(zip(outputs["heldout_binarized"], setting["sentences"], strict=True))[:10]:
        found = fairseq_beam_search(model, record["src_ids"], 4, 0.6, sentence["max_len"], pad=PAD)
        assert [ids for ids, _ in found] == [hypothesis["ids"] for hypothesis in sentence["nbest"]]
        assert [score for _, score in found] == pytest.approx([h["score"] for h in sentence["nbest"]], abs=2e-5)


def test_conversion_settings(converted_fairseq):
    model, tokenizer = converted_fairseq[FAIRSEQ_MODELS[1]]
    config = model.config
    assert (config.d_model, config.encoder_layers, config.decoder_attention_heads, config.encoder_ffn_dim) == (
        24,
        2,
        4,
        64,
    )
    assert (config.positional_encoding_layout, config.positional_encoding_frequencies) == (
        "concatenated",
        "tensor2tensor",
    )
    assert (config.positional_encoding_offset, config.attention_bias, config.tie_word_embeddings) == (2, True, True)
    assert (config.bos_token_id, config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        0,
        1,
        2,
        2,
    )
    generation = model.generation_config
    # fairseq-interactive's --beam 4 --lenpen 0.6 and its defaults --max-len-a 0 --max-len-b 200
    assert (generation.num_beams, generation.length_penalty) == (4, 0.6)
    assert (generation.max_length_a, generation.max_length_b) == (0, 200)
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert model.model.shared.weight[PAD].norm() > 0.1  # fairseq's padding row is trained, and kept
    assert convert.from_fairseq is from_fairseq and len(tokenizer) == config.vocab_size


# --- the directory ----------------------------------------------------------------------------------------------


def test_the_converted_directory_translates_text_as_fairseq_interactive_in_an_interpreter_without_the_project(
    converted_fairseq_dir, tmp_path
):
    """Raw held-out lines -> fairseq-interactive's D- lines (batches of 16, as recorded), loading model and
    tokenizer with trust_remote_code where `modeling` cannot be imported."""
    names = {path.name for path in converted_fairseq_dir.iterdir()}
    assert {"tokenization_fairseq.py", "modeling_transformer.py", "merges.txt", CONVERSION_FILE} <= names
    setting = fairseq_outputs(FAIRSEQ_MODELS[0])["settings"]["interactive/beam4_lenpen0.6_bs16"]
    raw = (FAIRSEQ_FIXTURES / "heldout.en").read_text(encoding="utf-8").splitlines()
    batches = [[raw[i] for i in recorded["ids"]] for recorded in setting["batches"]]
    script = BLOCK_THE_PACKAGE + textwrap.dedent(
        f"""
        import json, torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(converted_fairseq_dir)!r}, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(converted_fairseq_dir)!r}, trust_remote_code=True)
        assert type(tokenizer).__module__.startswith("transformers_modules"), type(tokenizer).__module__
        translations = []
        for lines in {batches!r}:
            batch = tokenizer(lines, return_tensors="pt", padding=True)
            translations += tokenizer.batch_decode(model.eval().generate(**batch), skip_special_tokens=True)
        print(json.dumps(translations))
        """
    )
    env = subprocess_env(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    by_id = {sentence["id"]: sentence["nbest"][0]["detok"] for sentence in setting["sentences"]}
    expected = [by_id[i] for recorded in setting["batches"] for i in recorded["ids"]]
    assert json.loads(result.stdout.splitlines()[-1]) == expected


def test_the_converted_directory_loads_with_the_project_and_gives_the_same_logits(
    converted_fairseq, converted_fairseq_dir
):
    model, tokenizer = load_model_and_tokenizer(str(converted_fairseq_dir), device="cpu")
    original, _ = converted_fairseq[FAIRSEQ_MODELS[0]]
    recorded = torch.load(FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[0] / "teacher_forced.pt", weights_only=True)
    inputs = {
        "input_ids": recorded["src_tokens_right_padded"],
        "attention_mask": recorded["src_tokens_right_padded"].ne(PAD).long(),
        "decoder_input_ids": recorded["prev_output_tokens"],
    }
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, original(**inputs).logits)
    assert model.generation_config.beam_finalization == "first"
    record = json.loads((converted_fairseq_dir / CONVERSION_FILE).read_text())
    assert record["arch"] == "transformer_wmt_en_de" and record["decoding"]["num_beams"] == 4
    # where it came from, for whoever reads the record
    checkpoint = FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[0] / "model.pt"
    assert (record["source"], record["checkpoint"], record["source_lang"], record["target_lang"]) == (
        "fairseq",
        "model.pt",
        "en",
        "de",
    )
    assert record["checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert record["bpe_codes"] == "bpecodes"
    assert "--beam 4 --lenpen 0.6" in record["fairseq_command"]
    assert type(tokenizer).__name__ == "FairseqTokenizer"


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs ../shared/data/multi30k")
@pytest.mark.parametrize("name", FAIRSEQ_MODELS)
def test_multi30k_bleu_is_the_one_fairseq_reports(converted_fairseq, name):
    """All 1000 test_2016_flickr sentences, translated as scripts/evaluate.py does (modeling.evaluation), with the
    fixture's decoding (beam 4, lenpen 0.6, fairseq's default limits, so batches do not matter): fairseq's
    translations, line for line, and its sacreBLEU."""
    from modeling.data import load_parallel_dataset
    from modeling.evaluation import evaluate_split

    model, tokenizer = converted_fairseq[name]
    split = load_parallel_dataset(source_lang="en", target_lang="de", data_dir=str(MULTI30K), splits=["test"])
    [test] = split.values()
    metrics, translations = evaluate_split(model, tokenizer, test, source_lang="en", target_lang="de")
    recorded = json.loads((FAIRSEQ_FIXTURES / name / "bleu.json").read_text())
    with gzip.open(FAIRSEQ_FIXTURES / name / "bleu_hyps.de.gz", "rt", encoding="utf-8") as handle:
        assert translations == handle.read().splitlines()
    assert metrics["num_sentences"] == 1000 and metrics["num_beams"] == 4
    assert abs(metrics["sacrebleu"] - recorded["score"]) < 0.1
    # The same settings; the version is sacreBLEU's where the fixture was made.
    assert without_version(metrics["sacrebleu_signature"]) == without_version(recorded["signature"])


def without_version(signature: str) -> str:
    return "|".join(part for part in signature.split("|") if not part.startswith("version:"))


# --- what is refused --------------------------------------------------------------------------------------------


def fixture_checkpoint() -> dict:
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[0] / "model.pt", weights_only=True)


def converting(checkpoint: dict, tmp_path, data_bin=FAIRSEQ_FIXTURES, **overrides):
    path = tmp_path / "model.pt"
    torch.save(checkpoint, path)
    arguments = {"source_lang": "en", "target_lang": "de", "bpe_codes": FAIRSEQ_FIXTURES / "bpecodes", **overrides}
    return from_fairseq(path, data_bin, **arguments)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("encoder_normalize_before", True, "encoder_normalize_before=True (pre-LayerNorm encoder"),
        ("decoder_normalize_before", True, "decoder_normalize_before=True (pre-LayerNorm decoder"),
        ("decoder_learned_pos", True, "decoder_learned_pos=True (learned decoder positions"),
        ("no_token_positional_embeddings", True, "no_token_positional_embeddings=True"),
        ("layernorm_embedding", True, "layernorm_embedding=True (LayerNorm on the embeddings)"),
        ("activation_fn", "gelu", "activation_fn='gelu' (only ReLU"),
        ("adaptive_softmax_cutoff", "100,300", "adaptive_softmax_cutoff='100,300' (adaptive softmax)"),
        ("share_all_embeddings", False, "share_all_embeddings=False (encoder, decoder and output projection must"),
        ("cross_self_attention", True, "cross_self_attention=True"),
        ("decoder_output_dim", 32, "decoder_output_dim=32"),
        ("arch", "bart_base", "arch='bart_base' (not one of fairseq's transformer architectures)"),
        ("encoder_attention_heads", 5, "encoder_attention_heads=5"),
        ("base_layers", 1, "base_layers=1 (BASE layers)"),
    ],
)
def test_architectures_it_cannot_compute_are_refused_naming_the_field(tmp_path, field, value, message):
    checkpoint = fixture_checkpoint()
    setattr(checkpoint["cfg"]["model"], field, value)
    if field == "arch":
        checkpoint["cfg"]["model"]._name = value
    with pytest.raises(FairseqConversionError, match="^cannot convert this fairseq model exactly: " + _re(message)):
        converting(checkpoint, tmp_path)


def _re(text: str) -> str:
    return re.escape(text)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("pre-LN final norm", "encoder.layer_norm.weight=(24,) (a final LayerNorm after the stack (pre-LN))"),
        ("untied output", "decoder.output_projection.weight='a matrix of its own'"),
        # fairseq's name for it before 0.10
        ("old untied output", "decoder.embed_out=(568, 24) (an untied output projection)"),
        ("unknown key", "encoder.layers.0.self_attn.bias_k=(1, 1, 24) (an unexpected state-dict key)"),
        ("unknown stack key", "decoder.layernorm_embedding.bias=(24,) (an unexpected state-dict key)"),
        ("a decoder part in the encoder", "encoder.layers.0.encoder_attn.q_proj.weight=(24, 24) (an unexpected"),
        # a layer's own norm is no final LayerNorm of the stack: only `encoder.layer_norm.weight` is
        ("unknown layer norm", "encoder.layers.0.extra_layer_norm.weight=(24,) (an unexpected state-dict key)"),
        # old checkpoints number a layer's norms: an encoder layer has two (a decoder layer three)
        ("third encoder norm", "encoder.layers.0.layer_norms.2.weight=(24,) (an unexpected state-dict key)"),
        # a damaged old checkpoint: a bare ValueError of zip() before
        ("fused projections not in thirds", "self_attn.in_proj_weight=(4, 24) (fused q, k, v projections whose rows"),
        # a bare IndexError of shape[0] otherwise
        ("fused projections a scalar", "self_attn.in_proj_bias=() (fused q, k, v projections whose rows"),
    ],
)
def test_unexpected_weights_are_refused_naming_the_key(tmp_path, change, message):
    checkpoint = fixture_checkpoint()
    state = checkpoint["model"]
    if change == "pre-LN final norm":
        state["encoder.layer_norm.weight"] = torch.ones(24)
    elif change == "untied output":
        state["decoder.output_projection.weight"] = state["decoder.output_projection.weight"].clone() + 1
    elif change == "old untied output":
        state["decoder.embed_out"] = torch.zeros(568, 24)
    elif change == "unknown stack key":
        state["decoder.layernorm_embedding.bias"] = torch.zeros(24)
    elif change == "a decoder part in the encoder":
        state["encoder.layers.0.encoder_attn.q_proj.weight"] = torch.zeros(24, 24)
    elif change == "unknown layer norm":
        state["encoder.layers.0.extra_layer_norm.weight"] = torch.ones(24)
    elif change == "third encoder norm":
        state["encoder.layers.0.layer_norms.2.weight"] = torch.ones(24)
    elif change == "fused projections not in thirds":
        state["encoder.layers.0.self_attn.in_proj_weight"] = torch.zeros(4, 24)
    elif change == "fused projections a scalar":
        state["encoder.layers.0.self_attn.in_proj_bias"] = torch.tensor(0.0)
    else:
        state["encoder.layers.0.self_attn.bias_k"] = torch.zeros(1, 1, 24)
    with pytest.raises(FairseqConversionError, match=_re(message)):
        converting(checkpoint, tmp_path)


def test_separate_dictionaries_and_old_bpe_codes_are_refused(tmp_path):
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    shutil.copy(FAIRSEQ_FIXTURES / "dict.en.txt", data_bin / "dict.en.txt")
    lines = (FAIRSEQ_FIXTURES / "dict.de.txt").read_text(encoding="utf-8").splitlines()
    (data_bin / "dict.de.txt").write_text("\n".join(lines[1:] + lines[:1]) + "\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match=r"dict.de.txt='differs from dict.en.txt' \(separate"):
        converting(fixture_checkpoint(), tmp_path, data_bin=data_bin)
    codes = tmp_path / "codes"
    codes.write_text("".join((FAIRSEQ_FIXTURES / "bpecodes").read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(FairseqConversionError, match="no '#version: 0.2' header"):
        converting(fixture_checkpoint(), tmp_path, bpe_codes=codes)
    with pytest.raises(FairseqConversionError, match="trained with target_lang='de', not 'fr'"):
        converting(fixture_checkpoint(), tmp_path, target_lang="fr", data_bin=_french_data_bin(tmp_path))
    with pytest.raises(FairseqConversionError, match="trained with source_lang='en', not 'fr'"):
        converting(fixture_checkpoint(), tmp_path, source_lang="fr", data_bin=_french_data_bin(tmp_path, "de"))


def test_the_recorded_fairseq_command_keeps_dashes_where_the_converted_tokenizer_does(tmp_path):
    """Without `@-@` in the dictionary the tokenizer keeps dashes in words; the card's fairseq command, which says
    what the model reproduces, must then not be one that splits them (fairseq's Moses splits by default)."""
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    for lang in ("en", "de"):
        text = (FAIRSEQ_FIXTURES / f"dict.{lang}.txt").read_text(encoding="utf-8")
        (data_bin / f"dict.{lang}.txt").write_text(text.replace("@-@ ", "@x@ "), encoding="utf-8")
    for source, name in ((FAIRSEQ_FIXTURES, "split"), (data_bin, "kept")):
        convert_fairseq(
            FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[0] / "model.pt",
            source,
            tmp_path / name,
            source_lang="en",
            target_lang="de",
            bpe_codes=FAIRSEQ_FIXTURES / "bpecodes",
        )
    split, kept = (json.loads((tmp_path / name / CONVERSION_FILE).read_text()) for name in ("split", "kept"))
    assert "--tokenizer moses --bpe subword_nmt --bpe-codes BPE_CODES" in split["fairseq_command"]
    assert "--tokenizer moses --moses-no-dash-splits --bpe subword_nmt" in kept["fairseq_command"]
    assert "--moses-no-dash-splits" in kept["text"] and "--moses-no-dash-splits" not in split["text"]
    assert "dashes kept in words" in kept["text"] and "dashes kept" not in split["text"]


def _french_data_bin(tmp_path, other="en"):
    directory = tmp_path / f"fr-{other}"
    directory.mkdir()
    for lang in (other, "fr"):
        shutil.copy(FAIRSEQ_FIXTURES / "dict.en.txt", directory / f"dict.{lang}.txt")
    return directory


def test_dictionary_and_codes_are_read_as_fairseq_and_subword_nmt_read_them(tmp_path):
    symbols = read_fairseq_dictionary(FAIRSEQ_FIXTURES / "dict.en.txt")
    assert symbols[:5] == ["<s>", "<pad>", "</s>", "<unk>", "."] and len(symbols) == 568
    assert symbols[-1].startswith("madeupword")  # fairseq pads its dictionaries to a multiple of 8
    path = tmp_path / "dict.txt"
    path.write_text("a 5\nb 3\n", encoding="utf-8")
    assert read_fairseq_dictionary(path) == ["<s>", "<pad>", "</s>", "<unk>", "a", "b"]
    path.write_text("a 5\na 2\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match="line 2: duplicate token 'a'"):
        read_fairseq_dictionary(path)
    path.write_text("a 5\n<unk> 2 #fairseq:overwrite\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match="line 2: a second id for a token '<unk>'"):
        read_fairseq_dictionary(path)
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\na b\nc d\na b\ne f</w>\n", encoding="utf-8")
    assert read_bpe_merges(codes) == ["a b", "c d", "e f</w>"]  # a repeated merge keeps its first rank


def test_a_full_temporary_directory_is_named_where_the_tokenizers_files_are_written(tmp_path, monkeypatch):
    """The converted tokenizer is built from files written to TMPDIR: a full one was "[Errno 28] No space left on
    device", naming no file (scripts/convert_fairseq.py printed it as it was)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    write_text = pathlib.Path.write_text

    def full(path, *args, **kwargs):
        if path.name == "vocab-src.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    symbols = read_fairseq_dictionary(FAIRSEQ_FIXTURES / "dict.en.txt")
    written = re.escape(str(tmp_path / "tmp"))
    with pytest.raises(DiskFullError, match=rf"^No space left on device while writing {written}/tmp"):
        fairseq_tokenizer(symbols, source_lang="en", target_lang="de")


def test_fastbpe_codes_are_refused_as_fastbpes(tmp_path):
    """The wmt19 archives' bpecodes are fastBPE's (no header, `left right count`): not subword-nmt's older format,
    which the header refusal would call them."""
    codes = tmp_path / "bpecodes"
    codes.write_text("e n 1423\nt h 1200\nth e</w> 987\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match=f"{re.escape(str(codes))} holds fastBPE codes"):
        read_bpe_merges(codes)


def test_a_model_recording_another_bpe_than_subword_nmt_is_refused_with_codes_and_converts_pretokenized(tmp_path):
    """A sentencepiece model given subword-nmt codes (the data-bin's, or --bpe-codes) was converted without a word,
    its tokenizer mapping text to pieces its dictionary does not hold."""
    legacy = fixture_checkpoint()
    legacy["cfg"]["model"].bpe = "sentencepiece"
    dataclass = fixture_checkpoint()
    dataclass["cfg"]["bpe"] = {"_name": "sentencepiece", "sentencepiece_model": "sentencepiece.bpe.model"}
    for checkpoint in (legacy, dataclass):
        with pytest.raises(FairseqConversionError, match=_re("exactly: bpe='sentencepiece' (the model's text was")):
            converting(checkpoint, tmp_path)
        converting(checkpoint, tmp_path, bpe_codes=None, pretokenized=True)


def test_a_bpe_codes_lines_surrounding_spaces_are_no_part_of_its_merge(tmp_path):
    """subword-nmt reads each line of its codes stripped of spaces and line ends (`strip('\\r\\n ')`): a file with
    trailing spaces or Windows line ends is the same codes, not one refused."""
    codes = tmp_path / "codes"
    codes.write_bytes(b"#version: 0.2\r\na b \r\n c d\r\ne f</w>  \r\n")
    assert read_bpe_merges(codes) == ["a b", "c d", "e f</w>"]


def test_dictionary_tokens_that_would_share_a_tokenizer_token_are_refused():
    """`x@@` becomes `x`: a dictionary holding `<unk>@@` would give the tokenizer two ids for `<unk>`."""
    symbols = ["<s>", "<pad>", "</s>", "<unk>", "a", "<unk>@@"]
    message = "'<unk>@@' (id 5) and id 3 both become the tokenizer token '<unk>'"
    with pytest.raises(FairseqConversionError, match=_re(message)):
        tokenizer_vocabulary(symbols)
    assert tokenizer_vocabulary(symbols[:5]) == {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "a</w>": 4}


@pytest.mark.parametrize("name", ["truncated.pt", "empty.pt", "dict.en.txt", "bpecodes", "zip.pt"])
def test_files_that_are_not_checkpoints_are_refused_in_one_line(tmp_path, name):
    path = tmp_path / name
    if name == "truncated.pt":
        path.write_bytes((FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[0] / "model.pt").read_bytes()[:100_000])
    elif name == "empty.pt":
        path.write_bytes(b"")
    elif name == "zip.pt":  # a zip archive, as torch.save writes, of something else
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "not a checkpoint")
    else:
        shutil.copy(FAIRSEQ_FIXTURES / name, path)
    with pytest.raises(ValueError) as error:
        load_fairseq_checkpoint(path)
    prefix = f"{path} is not a readable PyTorch checkpoint (truncated or not a checkpoint): "
    assert str(error.value).startswith(prefix) and len(str(error.value)) > len(prefix)
    assert "\n" not in str(error.value)


class _NotAllowed:
    """A class `torch.load(weights_only=True)` refuses to unpickle."""


def test_a_checkpoint_holding_other_objects_is_refused_as_unsafe(tmp_path):
    torch.save({"model": {}, "extra": _NotAllowed()}, tmp_path / "model.pt")
    with pytest.raises(FairseqConversionError) as error:
        load_fairseq_checkpoint(tmp_path / "model.pt")
    message = str(error.value)
    assert message.startswith(f"cannot read {tmp_path / 'model.pt'} safely (torch.load with weights_only=True): ")
    assert "Unsupported global: GLOBAL test_fairseq._NotAllowed" in message and "\n" not in message


def test_a_checkpoint_holding_other_objects_is_refused_even_where_torch_is_told_to_load_them(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (set for other tools' old checkpoints) makes torch.load run a pickle's
    code where a call does not ask for weights only: this one does."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    torch.save({"model": {}, "extra": _NotAllowed()}, tmp_path / "model.pt")
    with pytest.raises(FairseqConversionError, match="safely .torch.load with weights_only=True.: Unsupported global"):
        load_fairseq_checkpoint(tmp_path / "model.pt")


@pytest.mark.parametrize("name", ["dict.en.txt", "bpecodes"])
def test_files_not_in_utf8_are_refused_naming_the_file_and_line(tmp_path, name):
    path = tmp_path / name
    lines = (FAIRSEQ_FIXTURES / name).read_bytes().split(b"\n")
    lines[2] = "caf\u00e9 5".encode("latin-1") if name == "dict.en.txt" else "caf \u00e9".encode("latin-1")
    path.write_bytes(b"\n".join(lines))
    read = read_fairseq_dictionary if name == "dict.en.txt" else read_bpe_merges
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:3: not valid UTF-8"):
        read(path)


def test_old_checkpoints_convert_to_the_same_model(converted_fairseq, tmp_path):
    """A checkpoint as fairseq wrote them before 0.10: top-level `args`, fused in_proj weights, `layer_norms.N`,
    the sinusoid placeholder, no output projection (tied), weights in float16."""
    checkpoint = fixture_checkpoint()
    new = checkpoint["model"]
    old = {
        "encoder.embed_positions._float_tensor": torch.zeros(1),
        "decoder.embed_positions._float_tensor": torch.zeros(1),
    }
    norms = {
        "encoder": ("self_attn_layer_norm", "final_layer_norm"),
        "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
    }
    for key, tensor in new.items():
        if key == "decoder.output_projection.weight":
            continue
        if any(f".{p}_proj." in key for p in "kv") and "attn" in key:
            continue
        if ".q_proj." in key:
            prefix, kind = key.split(".q_proj.")
            fused = torch.cat([new[f"{prefix}.{p}_proj.{kind}"] for p in "qkv"])
            old[f"{prefix}.in_proj_{kind}"] = fused
            continue
        side = key.split(".")[0]
        for index, norm in enumerate(norms[side]):
            if f".{norm}." in key and ".layers." in key:
                key = key.replace(f".{norm}.", f".layer_norms.{index}.")
                break
        old[key] = tensor
    old = {key: tensor.half() if tensor.is_floating_point() else tensor for key, tensor in old.items()}
    converted, _ = converting({"args": checkpoint["cfg"]["model"], "model": old}, tmp_path)
    original, _ = converted_fairseq[FAIRSEQ_MODELS[0]]
    for name, tensor in original.state_dict().items():
        assert torch.equal(converted.state_dict()[name], tensor.half().float()), name


def test_a_checkpoint_with_numpy_metrics_in_its_extra_state_converts(tmp_path):
    # fairseq >= 0.10 with --eval-bleu keeps numpy counts in extra_state: refused as an "Unsupported global" before.
    checkpoint = fixture_checkpoint()
    meters = {"val": np.array([10, 5]), "sum": np.float64(2.5), "count": np.int64(3)}
    checkpoint["extra_state"] = {"metrics": {"valid": [("_bleu_counts_0", "AverageMeter", meters, 0)]}}
    model, _ = converting(checkpoint, tmp_path)
    reference, _ = convert_fairseq_fixture(FAIRSEQ_MODELS[0])
    expected = reference.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in model.state_dict().items())


def test_numpy_metrics_pickled_by_numpy_1_load_too(tmp_path):
    # fairseq's checkpoints were written before numpy 2: their pickles name numpy.core, not numpy._core.
    metrics = {"counts": np.array([1, 2]), "score": np.float64(2.5)}
    checkpoint = {"model": {"w": torch.zeros(2)}, "extra_state": metrics}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer, _use_new_zipfile_serialization=False)  # one pickle: its module names editable
    numpy_1 = buffer.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    assert numpy_1 != buffer.getvalue()
    (tmp_path / "model.pt").write_bytes(numpy_1)
    loaded = load_fairseq_checkpoint(tmp_path / "model.pt")["extra_state"]
    assert loaded["counts"].tolist() == [1, 2] and loaded["score"] == 2.5


def test_reading_numpy_metrics_touches_no_deprecated_numpy_module(tmp_path):
    # numpy 2 deprecates numpy.core (to be removed): where numpy._core exists, its functions are the ones allowed
    torch.save({"model": {"w": torch.zeros(2)}, "extra_state": {"score": np.float64(2.5)}}, tmp_path / "model.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert load_fairseq_checkpoint(tmp_path / "model.pt")["extra_state"]["score"] == 2.5


def test_a_checkpoint_saved_from_the_gpu_converts_on_a_machine_without_one(tmp_path, monkeypatch):
    """fairseq saves the tensors training held on the GPU: storages recorded on cuda:0 are read onto the CPU."""
    buffer = io.BytesIO()
    torch.save(fixture_checkpoint(), buffer, _use_new_zipfile_serialization=False)  # one pickle: locations editable
    on_gpu = buffer.getvalue().replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
    assert on_gpu != buffer.getvalue()
    (tmp_path / "model.pt").write_bytes(on_gpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a machine with one
    arguments = {"source_lang": "en", "target_lang": "de", "bpe_codes": FAIRSEQ_FIXTURES / "bpecodes"}
    converted, _ = from_fairseq(tmp_path / "model.pt", FAIRSEQ_FIXTURES, **arguments)
    expected = convert_fairseq_fixture(FAIRSEQ_MODELS[0])[0].state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in converted.state_dict().items())


def test_no_scale_embedding_is_converted_as_unscaled_embeddings(tmp_path):
    checkpoint = fixture_checkpoint()
    checkpoint["cfg"]["model"].no_scale_embedding = True
    model, _ = converting(checkpoint, tmp_path)
    assert model.config.scale_embedding is False and model.model.encoder.embed_scale == 1.0


def test_convert_fairseq_writes_a_whole_directory_and_replaces_only_a_previous_conversion(tmp_path):
    arguments = {"source_lang": "en", "target_lang": "de", "bpe_codes": FAIRSEQ_FIXTURES / "bpecodes"}
    checkpoint = FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[1] / "model.pt"
    out = tmp_path / "out"
    assert convert_fairseq(checkpoint, FAIRSEQ_FIXTURES, str(out), **arguments) == out  # a Path, given a str
    convert_fairseq(checkpoint, FAIRSEQ_FIXTURES, out, **arguments)  # a previous conversion: replaced
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a converted fairseq model"):
        convert_fairseq(checkpoint, FAIRSEQ_FIXTURES, tmp_path / "mine", **arguments)
    broken = fixture_checkpoint()
    broken["cfg"]["model"].encoder_normalize_before = True
    torch.save(broken, tmp_path / "broken.pt")
    with pytest.raises(FairseqConversionError):
        convert_fairseq(tmp_path / "broken.pt", FAIRSEQ_FIXTURES, tmp_path / "new", **arguments)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["broken.pt", "mine", "out"]


def test_an_output_directory_it_may_not_replace_is_refused_before_the_checkpoint_is_read(tmp_path):
    """A checkpoint is gigabytes: the user's directory is named first (a missing checkpoint would be named if it
    were read)."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not a converted fairseq model"):
        convert_fairseq(
            tmp_path / "missing.pt",
            FAIRSEQ_FIXTURES,
            tmp_path / "mine",
            source_lang="en",
            target_lang="de",
            bpe_codes=FAIRSEQ_FIXTURES / "bpecodes",
        )


def test_a_missing_checkpoint_or_a_directory_given_for_it_is_refused_naming_it(tmp_path):
    path = tmp_path / "model.pt"
    with pytest.raises(FileNotFoundError, match=f"^{_re(f'fairseq checkpoint {path} does not exist.')}$"):
        load_fairseq_checkpoint(path)
    # fairseq's --save-dir given for a checkpoint in it: "does not exist" before, though it does
    with pytest.raises(IsADirectoryError, match=f"^fairseq checkpoint {_re(str(tmp_path))} is a directory: give a"):
        load_fairseq_checkpoint(tmp_path)
    with pytest.raises(IsADirectoryError, match=f"^BPE codes {_re(str(tmp_path))} is a directory: give the codes"):
        read_bpe_merges(tmp_path)


def test_an_ensemble_given_as_fairseq_takes_it_is_refused_saying_so():
    """The published wmt19 commands pass `--path model1.pt:model2.pt:...`: no file of that name exists, but "does
    not exist" would send the user looking for a missing file."""
    models = [FAIRSEQ_FIXTURES / name / "model.pt" for name in FAIRSEQ_MODELS]
    ensemble = ":".join(map(str, models))
    with pytest.raises(FairseqConversionError, match=f"^fairseq checkpoint {re.escape(ensemble)} is an ensemble of 2"):
        load_fairseq_checkpoint(ensemble)


def test_missing_and_malformed_dictionaries_and_codes_are_refused_naming_the_file_and_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^fairseq dictionary {re.escape(str(tmp_path / 'dict.txt'))} does"):
        read_fairseq_dictionary(tmp_path / "dict.txt")
    with pytest.raises(FileNotFoundError, match=f"^BPE codes {re.escape(str(tmp_path / 'codes'))} do not exist"):
        read_bpe_merges(tmp_path / "codes")
    for line in ("5", "word many", "word --5", "word ²"):  # no token; no count; counts fairseq's int() refuses
        (tmp_path / "dict.txt").write_text(f"a 5\n{line}\nc 2\n", encoding="utf-8")
        with pytest.raises(FairseqConversionError, match=f"dict.txt, line 2: expected 'token count', got '{line}'"):
            read_fairseq_dictionary(tmp_path / "dict.txt")
    for blank in ("", "  "):  # fairseq's Dictionary refuses it too: the file is not as fairseq wrote it
        (tmp_path / "dict.txt").write_text(f"a 5\n{blank}\nc 2\n", encoding="utf-8")
        with pytest.raises(FairseqConversionError, match="dict.txt, line 2: expected 'token count', got ''"):
            read_fairseq_dictionary(tmp_path / "dict.txt")
    (tmp_path / "codes").write_text("#version: 0.2\na b\nc d e\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match="codes, line 3: expected 'left right', got 'c d e'"):
        read_bpe_merges(tmp_path / "codes")


@pytest.mark.parametrize("data_bin", ["missing", "model.pt"])
def test_a_data_bin_that_is_no_directory_is_refused_as_such_and_not_as_one_without_codes(tmp_path, data_bin):
    """A mistyped --data-bin "held no bpecodes", the message advising --pretokenized: a model then converted for
    text BPE-split already, where the archive's codes were there all along."""
    (tmp_path / "model.pt").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match=f"^fairseq data-bin {re.escape(str(tmp_path / data_bin))} is not a"):
        from_fairseq(tmp_path / "model.pt", tmp_path / data_bin, source_lang="en", target_lang="de")


def test_a_checkpoint_without_an_architecture_or_of_another_task_is_refused(tmp_path):
    checkpoint = fixture_checkpoint()
    with pytest.raises(FairseqConversionError, match=r"neither cfg\['model'\] nor args: no architecture to read"):
        converting({"model": checkpoint["model"]}, tmp_path)
    checkpoint["cfg"]["task"]["_name"] = "translation_multi_simple_epoch"
    message = "task='translation_multi_simple_epoch' (only the translation task's models are converted)"
    with pytest.raises(FairseqConversionError, match=re.escape(message)):
        converting(checkpoint, tmp_path)
    # a checkpoint older than fairseq 0.10 names its task in its top-level args
    args = checkpoint["cfg"]["model"]
    args.task = "translation_multi_simple_epoch"
    with pytest.raises(FairseqConversionError, match=re.escape(message)):
        converting({"args": args, "model": checkpoint["model"]}, tmp_path)


def test_arguments_naming_no_architecture_are_refused_naming_the_field():
    args, weights = fairseq_args_and_weights(30, 3)
    args["_arch"] = None  # neither `arch` nor `_name` recorded
    with pytest.raises(FairseqConversionError, match=_re("arch=None (not one of fairseq's transformer")):
        fairseq_config(args, weights, 568)


def test_the_architecture_is_read_from_old_args_arch_or_a_dataclass_configs_name():
    """fairseq < 0.10 records `args.arch`; a dataclass config names itself `_name`."""
    old = fairseq_model_args({"args": argparse.Namespace(arch="transformer_wmt_en_de", task="translation")})
    assert (old["_arch"], old["_task"]) == ("transformer_wmt_en_de", "translation")
    new = fairseq_model_args({"cfg": {"model": {"_name": "transformer"}, "task": {"_name": "translation"}}})
    assert (new["_arch"], new["_task"]) == ("transformer", "translation")


def test_a_checkpoint_holding_args_and_a_cfg_that_disagree_is_read_as_fairseq_reads_it_from_its_args(tmp_path):
    """fairseq's loader rebuilds cfg from `args` wherever they are set (fairseq >= 0.10 saves args=None): the cfg
    beside them, here saying unscaled embeddings, is not what fairseq computes with."""
    checkpoint = fixture_checkpoint()
    checkpoint["args"] = argparse.Namespace(**vars(checkpoint["cfg"]["model"]))
    checkpoint["cfg"]["model"].no_scale_embedding = True
    model, _ = converting(checkpoint, tmp_path)
    assert model.config.scale_embedding


def test_one_language_as_source_and_target_is_refused(tmp_path):
    with pytest.raises(FairseqConversionError, match="source and target language are both 'en'"):
        converting(fixture_checkpoint(), tmp_path, target_lang="en")


def fairseq_args_and_weights(width: int, heads: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """The fixture's arguments at another width and head count, and the weights fairseq_config reads."""
    args = fairseq_model_args(fixture_checkpoint())
    args |= {f"{side}_embed_dim": width for side in ("encoder", "decoder")}
    args |= {"decoder_input_dim": width, "decoder_output_dim": width, "encoder_layers": 1, "decoder_layers": 1}
    args |= {"encoder_attention_heads": heads, "decoder_attention_heads": heads}
    weights = {"encoder.embed_tokens.weight": torch.zeros(568, width)}
    weights |= {f"{side}.layers.0.fc1.weight": torch.zeros(48, width) for side in ("encoder", "decoder")}
    return args, weights


def test_an_odd_width_is_refused_naming_the_field():
    """fairseq pads an odd width's sinusoids with a zero column, which this model's table does not have."""
    with pytest.raises(FairseqConversionError, match=re.escape("encoder_embed_dim=27 (an odd width")):
        fairseq_config(*fairseq_args_and_weights(27, 3), 568)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize(
    ("field", "recorded", "why"),
    [("embed_dim", 32, "the embeddings have 30 dimensions"), ("layers", 2, "the state dict holds 1 layers")],
)
def test_a_recorded_size_other_than_the_state_dicts_is_refused_naming_the_field(side, field, recorded, why):
    """fairseq builds the recorded sizes and would not load this state dict into them."""
    args, weights = fairseq_args_and_weights(30, 3)
    args[f"{side}_{field}"] = recorded
    with pytest.raises(FairseqConversionError, match=_re(f"{side}_{field}={recorded} ({why})")):
        fairseq_config(args, weights, 568)


@pytest.mark.parametrize("heads", [1, 3, 30])
def test_any_head_count_dividing_the_width_converts(heads):
    config = fairseq_config(*fairseq_args_and_weights(30, heads), 568)
    assert (config.d_model, config.encoder_attention_heads, config.decoder_attention_heads) == (30, heads, heads)


@pytest.mark.parametrize("heads", [0, -3, None, True])
def test_a_head_count_that_is_not_a_positive_integer_is_refused_naming_the_field(heads):
    with pytest.raises(FairseqConversionError, match=_re(f"encoder_attention_heads={heads!r} (must be recorded")):
        fairseq_config(*fairseq_args_and_weights(30, heads), 568)


# Every fairseq option this model cannot compute, by its name in fairseq's arguments (not read from
# REQUIRED_VALUES: a misspelt entry there would check a field no checkpoint has, and convert the model wrongly).
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("encoder_normalize_before", True),
        ("decoder_normalize_before", True),
        ("encoder_learned_pos", True),
        ("decoder_learned_pos", True),
        ("no_token_positional_embeddings", True),
        ("layernorm_embedding", True),
        ("activation_fn", "gelu"),
        ("adaptive_softmax_cutoff", "100,300"),
        ("adaptive_input", True),
        ("tie_adaptive_weights", True),
        ("cross_self_attention", True),
        ("no_cross_attention", True),
        ("quant_noise_pq", 0.1),
        ("quant_noise_scalar", 0.5),
        ("encoder_layers_to_keep", "0"),
        ("decoder_layers_to_keep", "0"),
        ("base_layers", 1),
        ("scale_attn", True),
        ("scale_fc", True),
        ("scale_heads", True),
        ("scale_resids", True),
        ("char_inputs", True),
        ("encoder_xformers_att_config", '{"name": "scaled_dot_product"}'),
        ("decoder_xformers_att_config", '{"name": "scaled_dot_product"}'),
        ("merge_src_tgt_embed", True),
        ("share_all_embeddings", False),
    ],
)
def test_every_option_this_model_cannot_compute_is_refused_naming_it(field, value):
    args, weights = fairseq_args_and_weights(30, 3)
    fairseq_config(args, weights, 568)  # converts as it is
    args[field] = value
    with pytest.raises(FairseqConversionError, match=_re(f"exactly: {field}={value!r} (")):
        fairseq_config(args, weights, 568)


def test_a_checkpoint_older_than_no_scale_embedding_scales_its_embeddings():
    """fairseq's default: embeddings scaled by sqrt(d_model), as the paper's are."""
    args, weights = fairseq_args_and_weights(30, 3)
    args.pop("no_scale_embedding", None)
    assert fairseq_config(args, weights, 568).scale_embedding is True


def test_an_encoder_and_a_decoder_of_different_depths_convert():
    args, weights = fairseq_args_and_weights(30, 3)
    args |= {"encoder_layers": 3, "decoder_layers": 1}
    weights |= {f"encoder.layers.{index}.fc1.weight": torch.zeros(48, 30) for index in (1, 2)}
    config = fairseq_config(args, weights, 568)
    assert (config.encoder_layers, config.decoder_layers) == (3, 1)


def test_layers_missing_from_the_state_dict_are_refused_naming_the_field():
    """Layers 0 and 2 are not a stack of two: layer 2's weights would have no layer to go to."""
    args, weights = fairseq_args_and_weights(30, 3)
    args["encoder_layers"] = 2
    weights["encoder.layers.2.fc1.weight"] = torch.zeros(48, 30)
    with pytest.raises(FairseqConversionError, match=_re("encoder_layers=[0, 2] (the state dict's layers are not")):
        fairseq_config(args, weights, 568)


def test_embeddings_of_another_size_than_the_dictionary_are_refused_naming_the_field():
    message = "encoder.embed_tokens.weight=(568, 30) (the dictionary has 570 symbols)"
    with pytest.raises(FairseqConversionError, match=_re(message)):
        fairseq_config(*fairseq_args_and_weights(30, 3), 570)


def test_dropout_rates_are_the_checkpoints_for_fine_tuning_and_fairseqs_defaults_where_missing():
    args, weights = fairseq_args_and_weights(30, 3)
    args |= {"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.2}
    config = fairseq_config(args, weights, 568)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.3, 0.1, 0.2)
    # before fairseq 0.6 activation_dropout was called relu_dropout; without either field, fairseq's defaults
    args |= {"activation_dropout": None, "relu_dropout": 0.25}
    assert fairseq_config(args, weights, 568).activation_dropout == 0.25
    for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout"):
        del args[name]
    config = fairseq_config(args, weights, 568)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.0, 0.0)


def test_the_data_bins_bpe_codes_are_used_and_said_to_be(caplog):
    with caplog.at_level(logging.WARNING, logger="modeling.fairseq"):
        _, tokenizer = from_fairseq(
            FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[1] / "model.pt", FAIRSEQ_FIXTURES, source_lang="en", target_lang="de"
        )
    assert f"Using the BPE codes {FAIRSEQ_FIXTURES / 'bpecodes'}" in caplog.text
    assert not tokenizer.pretokenized


def test_a_dataclass_configs_nested_encoder_and_decoder_fields_are_read(converted_fairseq, tmp_path):
    """fairseq 0.12's dataclass `transformer` saves `encoder` and `decoder` as sub-configs (`encoder.embed_dim`):
    read as the flat fields, a pre-LN one among them is refused as the flat one is."""
    checkpoint = fixture_checkpoint()
    flat = vars(checkpoint["cfg"]["model"])
    nested = {key: value for key, value in flat.items() if not key.startswith(("encoder_", "decoder_"))}
    for side in ("encoder", "decoder"):
        nested[side] = {key.removeprefix(f"{side}_"): value for key, value in flat.items() if key.startswith(side)}
    # and writes its fields' off values, where the legacy Namespace had no field
    nested |= {"base_layers": 0, "scale_attn": False, "quant_noise": {"pq": 0, "pq_block_size": 8, "scalar": 0}}
    checkpoint["cfg"]["model"] = nested
    model, _ = converting(checkpoint, tmp_path)
    assert model.config.to_dict() == converted_fairseq[FAIRSEQ_MODELS[0]][0].config.to_dict()
    nested["encoder"]["normalize_before"] = True
    with pytest.raises(FairseqConversionError, match=re.escape("encoder_normalize_before=True (pre-LayerNorm")):
        converting(checkpoint, tmp_path)
    nested["encoder"]["normalize_before"] = False
    nested["quant_noise"]["pq"] = 0.1  # `quant_noise.pq` is the flat `quant_noise_pq`
    with pytest.raises(FairseqConversionError, match=re.escape("quant_noise_pq=0.1 (quantization noise)")):
        converting(checkpoint, tmp_path)


def test_languages_and_lengths_kept_only_in_the_task_config_are_read(tmp_path):
    checkpoint = fixture_checkpoint()
    for key in ("source_lang", "target_lang", "max_source_positions", "max_target_positions"):
        delattr(checkpoint["cfg"]["model"], key)
    checkpoint["cfg"]["task"] |= {"max_source_positions": 256, "max_target_positions": 512}
    model, tokenizer = converting(checkpoint, tmp_path)
    assert (model.config.max_position_embeddings, tokenizer.model_max_length) == (512, 256)
    with pytest.raises(FairseqConversionError, match="trained with target_lang='de', not 'fr'"):
        converting(checkpoint, tmp_path, target_lang="fr", data_bin=_french_data_bin(tmp_path))
    with pytest.raises(FairseqConversionError, match="trained with source_lang='en', not 'fr'"):
        converting(checkpoint, tmp_path, source_lang="fr", data_bin=_french_data_bin(tmp_path, other="de"))


def test_languages_fairseq_train_inferred_are_read_from_the_task_config_and_checked(tmp_path):
    """Trained without -s/-t, the model's arguments keep None and only the task's config holds the languages:
    a conversion with them swapped was accepted (German Moses rules on English text, a card saying de-en)."""
    checkpoint = fixture_checkpoint()
    checkpoint["cfg"]["model"].source_lang = checkpoint["cfg"]["model"].target_lang = None
    assert (fairseq_model_args(checkpoint)["source_lang"], fairseq_model_args(checkpoint)["target_lang"]) == (
        "en",
        "de",
    )
    with pytest.raises(FairseqConversionError, match="trained with source_lang='en', not 'de'"):
        converting(checkpoint, tmp_path, source_lang="de", target_lang="en")


def test_a_checkpoint_without_the_length_fields_takes_fairseqs_defaults(tmp_path):
    """Checkpoints older than the fields: fairseq's base_architecture gives both 1024."""
    checkpoint = fixture_checkpoint()
    for key in ("max_source_positions", "max_target_positions"):
        delattr(checkpoint["cfg"]["model"], key)
        del checkpoint["cfg"]["task"][key]
    model, tokenizer = converting(checkpoint, tmp_path)
    assert (model.config.max_position_embeddings, tokenizer.model_max_length) == (1024, 1024)


def test_a_file_holding_no_model_state_dict_is_refused(tmp_path):
    for name, content in (("tensor.pt", torch.zeros(2)), ("dict.pt", {"weights": torch.zeros(2)})):
        torch.save(content, tmp_path / name)
        with pytest.raises(FairseqConversionError, match="is not a fairseq checkpoint: no 'model' state dict in it"):
            load_fairseq_checkpoint(tmp_path / name)


@pytest.mark.parametrize(
    "key",
    [
        "decoder.layers.0.fc1.weight",
        "encoder.embed_tokens.weight",
        "decoder.embed_tokens.weight",
        "encoder.layers.1.self_attn.k_proj.bias",  # a model built with a random one would translate, and wrongly
        "decoder.layers.1.encoder_attn_layer_norm.weight",
        "encoder.layers.0.final_layer_norm.bias",
    ],
)
def test_a_missing_weight_is_refused_naming_the_key(tmp_path, key):
    """In one line naming the checkpoint's key, not `load_state_dict`'s list of this model's missing keys."""
    checkpoint = fixture_checkpoint()
    del checkpoint["model"][key]
    with pytest.raises(FairseqConversionError, match=re.escape(f"{key}=None (missing from the state dict)")):
        converting(checkpoint, tmp_path)


def test_the_state_dict_conversion_called_alone_names_a_missing_embedding():
    state_dict = fixture_checkpoint()["model"]
    del state_dict["encoder.embed_tokens.weight"]
    missing = "encoder.embed_tokens.weight=None (missing from the state dict)"
    with pytest.raises(FairseqConversionError, match=re.escape(missing)):
        fairseq_state_dict(state_dict)


@pytest.mark.parametrize(
    ("key", "shape", "expected"),
    [
        ("encoder.layers.1.fc1.weight", (40, 24), (48, 24)),  # the config's ffn width is layer 0's
        ("decoder.layers.0.encoder_attn.v_proj.bias", (12,), (24,)),
        ("decoder.layers.1.final_layer_norm.weight", (24, 1), (24,)),
    ],
)
def test_a_weight_of_another_shape_is_refused_naming_the_key(tmp_path, key, shape, expected):
    """In one line naming the checkpoint's key, not `load_state_dict`'s list of size mismatches."""
    checkpoint = fixture_checkpoint()
    assert tuple(checkpoint["model"][key].shape) == expected
    checkpoint["model"][key] = torch.zeros(shape)
    message = f"{key}={shape} (the config read from the checkpoint gives {expected})"
    with pytest.raises(FairseqConversionError, match=re.escape(message)):
        converting(checkpoint, tmp_path)


def test_unreadable_codes_are_refused_before_the_checkpoint_is_read(tmp_path):
    """A checkpoint is gigabytes: the small files' errors come first."""
    (tmp_path / "codes").write_text("a b\n", encoding="utf-8")
    with pytest.raises(FairseqConversionError, match="no '#version: 0.2' header"):
        from_fairseq(
            tmp_path / "missing.pt", FAIRSEQ_FIXTURES, source_lang="en", target_lang="de", bpe_codes=tmp_path / "codes"
        )


def test_a_system_error_reading_the_checkpoint_is_not_called_a_broken_checkpoint(tmp_path, monkeypatch):
    """Permission denied is the system's to say (its message names the file): the file may be a good checkpoint."""
    path = tmp_path / "model.pt"
    torch.save(fixture_checkpoint(), path)

    def denied(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(torch, "load", denied)
    with pytest.raises(PermissionError, match=re.escape(f"[Errno 13] Permission denied: '{path}'")):
        load_fairseq_checkpoint(path)


def test_a_read_error_without_a_message_is_named_by_its_type(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x02")

    def failing(*args, **kwargs):
        raise EOFError

    monkeypatch.setattr(torch, "load", failing)
    message = f"{path} is not a readable PyTorch checkpoint (truncated or not a checkpoint): EOFError"
    with pytest.raises(FairseqConversionError, match=f"^{_re(message)}$"):
        load_fairseq_checkpoint(path)


def test_a_pretokenized_conversion_records_its_text_pipeline(tmp_path):
    convert_fairseq(
        FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[1] / "model.pt",
        FAIRSEQ_FIXTURES,
        tmp_path / "out",
        source_lang="en",
        target_lang="de",
        pretokenized=True,
    )
    record = json.loads((tmp_path / "out" / CONVERSION_FILE).read_text())
    assert record["text"].startswith("already Moses-tokenised and BPE-split") and record["bpe_codes"] is None
    assert "--bpe" not in record["fairseq_command"] and "--tokenizer" not in record["fairseq_command"]


def test_codes_and_pretokenized_together_are_refused():
    """They contradict each other: codes are for raw text, pretokenized takes text already BPE-split."""
    with pytest.raises(ValueError, match="^Give BPE codes or pretokenized, not both"):
        from_fairseq(
            FAIRSEQ_FIXTURES / FAIRSEQ_MODELS[1] / "model.pt",
            FAIRSEQ_FIXTURES,
            source_lang="en",
            target_lang="de",
            bpe_codes=FAIRSEQ_FIXTURES / "bpecodes",
            pretokenized=True,
        )


def test_a_star_import_gives_the_conversions_names_and_not_its_imports():
    names = {}
    exec("from modeling.fairseq import *", names)
    assert {"convert_fairseq", "from_fairseq", "FairseqConversionError", "CONVERSION_FILE"} <= names.keys()
    assert not {"torch", "np", "logger", "PAD", "TransformerConfig"} & names.keys()


# --- a training checkpoint's optimizer state --------------------------------------------------------------------


def with_adam_state(checkpoint: dict, numbers: int) -> dict:
    """`checkpoint` as fairseq's training saves it: Adam's two moments in `last_optimizer_state`."""
    moments = {"step": 1000, "exp_avg": torch.full((numbers,), 0.5), "exp_avg_sq": torch.full((numbers,), 0.25)}
    group = {"lr": 5e-4, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.0, "params": [0]}
    return checkpoint | {"last_optimizer_state": {"state": {0: moments}, "param_groups": [group], "loss_scale": 128.0}}


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the process's resident memory from /proc")
def test_a_training_checkpoint_s_optimizer_state_is_not_read_into_memory(tmp_path):
    """A checkpoint from training holds Adam's two moments, twice the model in float32: the whole file was read
    (0.8 GB of a synthetic checkpoint's 0.8 GB Adam state resident, `scripts/convert_fairseq.py` 1.18 GB at its peak
    where 0.42 GB without it)."""
    torch.save(with_adam_state(fixture_checkpoint(), 16_000_000), tmp_path / "model.pt")  # 128 MB of moments
    before = resident_bytes()
    checkpoint = load_fairseq_checkpoint(tmp_path / "model.pt")
    assert resident_bytes() - before < 32 * 2**20
    assert checkpoint["last_optimizer_state"]["state"][0]["exp_avg_sq"][-1].item() == 0.25  # there, when read


@pytest.mark.parametrize("legacy_format", [False, True])
def test_a_training_checkpoint_converts_to_the_same_model_in_either_format(tmp_path, legacy_format):
    """The zip format is memory-mapped; the legacy one (fairseq's published models), which cannot be, is read."""
    path = tmp_path / "model.pt"
    torch.save(with_adam_state(fixture_checkpoint(), 1000), path, _use_new_zipfile_serialization=not legacy_format)
    arguments = {"source_lang": "en", "target_lang": "de", "bpe_codes": FAIRSEQ_FIXTURES / "bpecodes"}
    converted, _ = from_fairseq(path, FAIRSEQ_FIXTURES, **arguments)
    expected = convert_fairseq_fixture(FAIRSEQ_MODELS[0])[0].state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in converted.state_dict().items())
