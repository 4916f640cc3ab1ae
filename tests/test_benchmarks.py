"""Smoke tests of benchmarks/: everything runs end to end at tiny sizes and prints its tables.

No timing is asserted (the numbers of a tiny run on a shared machine mean nothing). The runs use one thread: with
two OpenMP threads on two busy cores, every tiny operator waits at a barrier for a descheduled thread, and a
one-second run takes twenty. The main run uses the synthetic corpus, so it needs no data; the Multi30k run skips
when ../shared is absent.
"""

import argparse
import inspect
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import subprocess_env
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
TABLE_HEADERS = {
    "train_step": "| contender | tokens/s (median) |",
    "train_data": "| pipeline | real tokens/s (median) |",
    "generate": "| workload | threads | contender | sentences/s (median) |",
    "generate_best": "| workload | contender | threads | sentences/s |",
    "memory": "| workload: contender | peak RSS (MiB) |",
}


def run_quick(tmp_path: Path, *arguments: str, generation_threads: str = "1") -> tuple[str, dict]:
    output = tmp_path / "results.json"
    command = [sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--cache-dir", str(tmp_path / "cache")]
    command += ["--threads", "1", "--generation-threads", generation_threads]
    command += ["--output-json", str(output), *arguments]
    completed = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed.stdout, json.loads(output.read_text())


def test_quick_run_prints_every_table_on_synthetic_data(tmp_path):
    stdout, results = run_quick(tmp_path, "--data-dir", str(tmp_path / "no-data"))
    assert stdout.startswith("## Benchmark results")
    for name, header in TABLE_HEADERS.items():
        assert header in stdout, name
        assert name in results["sections"]
    assert "synthetic" in results["sections"]["train_data"]["title"]
    # The twins' outputs are asserted identical inside the run; CTranslate2 float32 is this model, exported exactly.
    generation = results["sections"]["generate"]
    workloads = [name for name in generation if name.startswith(("fixed length", "sorted", "file order"))]
    assert len(workloads) == 3
    for workload in workloads:
        contenders = generation[workload]["1"]
        assert contenders["MarianMT"]["agreement"] == 1.0 and contenders["CTranslate2 float32"]["agreement"] == 1.0
        assert {"this model int8", "CTranslate2 int8"} <= set(contenders)


def test_at_two_threads_this_model_and_ctranslate2_also_decode_two_batches_at_once(tmp_path):
    arguments = ["--only", "generate", "--data-dir", str(tmp_path / "no-data")]
    stdout, results = run_quick(tmp_path, *arguments, generation_threads="2")
    side_by_side = {"this model", "this model int8", "CTranslate2 float32", "CTranslate2 int8"}
    for workload, by_threads in results["sections"]["generate"].items():
        if not workload.startswith(("sorted", "file order")):
            continue
        contenders = by_threads["2"]
        assert {f"{name} (2 batches at once)" for name in side_by_side} <= set(contenders), workload
        assert contenders["this model (2 batches at once)"]["agreement"] == 1.0, "the same translations"
    fixed = next(by_threads for name, by_threads in results["sections"]["generate"].items() if "fixed" in name)
    assert not any("at once" in name for name in fixed["2"]), "one batch: nothing to decode beside it"
    best_table = stdout[stdout.index(TABLE_HEADERS["generate_best"]) :]
    best_rows = [line.split(" | ") for line in best_table.splitlines() if line.startswith("| sorted")]
    assert len(best_rows) == 5, "one row per contender, whichever way it ran best"
    assert all("at once" not in row[1] and row[2].startswith("2") for row in best_rows)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="shared Multi30k data not present")
def test_quick_run_on_multi30k(tmp_path):
    stdout, results = run_quick(tmp_path, "--only", "train_data", "--data-dir", str(MULTI30K))
    assert TABLE_HEADERS["train_data"] in stdout
    efficiency = results["sections"]["train_data"]["padding_efficiency_epoch"]
    assert efficiency["this model + token-budget batches"] > efficiency["MarianMT + Seq2SeqTrainer default (random)"]


def run_gpu_check(tmp_path: Path, wheels: Path, *arguments: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_check.sh with this interpreter, the wheels in `wheels`, temporary folders in `tmp_path`."""
    completed = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_check.sh"), *arguments],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(PYTHON=sys.executable, WHEELS=str(wheels), TMPDIR=str(tmp_path)),
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return completed


def test_gpu_check_dry_run_on_cpu(tmp_path):
    output = tmp_path / "gpu.json"
    arguments = ["--dry-run", "--threads", "1", "--output-json", str(output)]
    completed = run_gpu_check(tmp_path, tmp_path / "no-wheels", *arguments)
    assert "installed into" not in completed.stderr  # nothing to install: the packages as they are
    assert "| contender | tokens/s (median) |" in completed.stdout
    assert completed.stdout.rstrip().splitlines()[-1].startswith(("|", "-"))  # the table comes last
    sections = json.loads(output.read_text())["sections"]
    assert set(sections) == {"train_base", "train_big", "generate", "generate_real"}
    # The three workloads of benchmarks/run.py; at float32 on CPU the Marian twin translates exactly as this model.
    real = sections["generate_real"]
    workloads = ("fixed length", "sorted by length", "file order")
    workload_names = [name for name in real if name.split(" (")[0] in workloads]
    assert len(workload_names) == 3
    for name in workload_names:
        assert real[name]["MarianMT (fp32)"]["agreement"] == 1.0, name
    assert "| workload | contender | sentences/s (median) |" in completed.stdout


def probe_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel holding the module `gpu_check_probe`."""
    wheel = directory / "gpu_check_probe-1.0-py3-none-any.whl"
    files = {
        "gpu_check_probe/__init__.py": "VALUE = 1\n",
        "gpu_check_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 1.0\n",
        "gpu_check_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "gpu_check_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, "gpu_check_probe-1.0.dist-info/RECORD": record}.items():
            archive.writestr(name, text)
    return wheel


def test_gpu_check_installs_the_wheels_it_is_given_before_running(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    probe_wheel(wheels)
    completed = run_gpu_check(tmp_path, wheels, "--help")
    assert "--dry-run" in completed.stdout  # gpu_check.py ran after the install
    message = next(line for line in completed.stderr.splitlines() if line.startswith("gpu_check.sh: installed into"))
    site = Path(message.removeprefix("gpu_check.sh: installed into ").split(":")[0])
    assert (site / "gpu_check_probe" / "__init__.py").is_file()
    assert "gpu_check_probe-1.0-py3-none-any.whl" in message


@pytest.fixture
def benchmarks_importable():
    """benchmarks/ (and its investigations/) on sys.path for the test, as its scripts have it."""
    folders = [str(BENCHMARKS), str(BENCHMARKS / "investigations")]
    sys.path[:0] = folders
    yield
    for folder in folders:
        sys.path.remove(folder)


@pytest.mark.parametrize("source_length, target_length", [(10, 7), (5, 9)])
def test_analytic_training_flops_match_torch_flop_counter(source_length, target_length, benchmarks_importable):
    from fixtures import QUICK_SIZE, random_model, transformer_config, with_attention
    from harness import model_shape, training_flops

    config = transformer_config(QUICK_SIZE)
    model = with_attention(random_model(config), "eager").train()  # sdpa's CPU kernel is invisible to the counter
    input_ids = torch.randint(3, config.vocab_size, (3, source_length))
    labels = torch.randint(3, config.vocab_size, (3, target_length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss.backward()
    expected = training_flops(
        **model_shape(config), batch_size=3, source_length=source_length, target_length=target_length
    )
    assert counter.get_total_flops() == expected


def test_training_profile_replays_every_matrix_product_of_a_step(benchmarks_importable):
    from fixtures import QUICK_SIZE, random_model, transformer_config, with_attention
    from harness import model_shape, training_flops
    from profile_training import profile_steps, replay_contender

    config = transformer_config(QUICK_SIZE)
    model = with_attention(random_model(config), "eager")  # attention through bmm, which the profiler records
    input_ids = torch.randint(3, config.vocab_size, (3, 5))
    labels = torch.randint(3, config.vocab_size, (3, 4))  # every position labelled: the fused loss skips none
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    profiled = profile_steps(model, [batch], top=5)
    replay, flops = replay_contender(profiled.matrix_products)
    replay()
    assert flops == training_flops(**model_shape(config), batch_size=3, source_length=5, target_length=4)
    assert "| operator | self ms |" in profiled.operators


def test_generation_parts_are_timed_per_step_and_the_loop_is_restored(benchmarks_importable, capsys):
    from decoding import DecodingSettings
    from fixtures import QUICK_SIZE, random_model, transformer_config
    from profile_generation import DECODING_PARTS, print_parts

    originals = [inspect.getattr_static(owner, name) for owner, name, _ in DECODING_PARTS]
    model = random_model(transformer_config(QUICK_SIZE)).eval()
    input_ids = torch.randint(3, model.config.vocab_size, (2, 6))
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    print_parts(model, [batch], DecodingSettings(max_new_tokens=5), passes=2)
    printed = capsys.readouterr().out
    # A random model runs to the cap: the first step on one beam per sentence (2 rows), then 2 x 4 beams.
    assert "5 decoding steps a pass, 6.8 rows a step" in printed
    assert "5.0 steps a sentence for 5.0 tokens out (1.00x)" in printed  # at the cap, no step beyond the output
    for _, _, label in DECODING_PARTS:
        assert f"| {label} |" in printed
    assert [inspect.getattr_static(owner, name) for owner, name, _ in DECODING_PARTS] == originals


def test_prepacked_decoding_compares_both_ways_on_a_workload_and_restores_the_model(benchmarks_importable):
    from decoding import DecodingSettings
    from fixtures import QUICK_SIZE, random_model, transformer_config
    from generation import workloads
    from helpers import tiny_tokenizer
    from prepacked_decoding import compare

    tokenizer = tiny_tokenizer()
    model = random_model(transformer_config(QUICK_SIZE, vocab_size=len(tokenizer))).eval()
    sources = ["the cat sat on the mat", "a dog runs", "two birds sing in the old tree today", "hello"]
    workload = workloads(tokenizer, sources, None, 2, DecodingSettings())[1]  # sorted by length
    rates, same = compare(model, workload, tokenizer, repeats=1)
    assert set(rates) == {"plain", "prepacked"} and all(rate > 0 for rate in rates.values())
    assert same  # prepacking changes no token
    assert "prepacked_for_decoding" not in vars(model)  # the class's method again


def test_alternating_translations_times_every_way_and_compares_their_outputs(benchmarks_importable):
    from generation import alternating_translations

    calls = []

    def way(name: str, outputs: list[list[int]]):
        return lambda: calls.append(name) or outputs

    rates, same = alternating_translations({"a": way("a", [[1, 2]]), "b": way("b", [[1, 2]])}, 3, repeats=2)
    assert set(rates) == {"a", "b"} and all(rate > 0 for rate in rates.values())
    assert same and calls.count("a") == calls.count("b") == 3  # one warm-up and two timed calls each
    _, same = alternating_translations({"a": way("a", [[1, 2]]), "b": way("b", [[1, 3]])}, 3, repeats=1)
    assert not same


@pytest.mark.usefixtures("onednn_linear")  # the static step multiplies by oneDNN
def test_static_shape_step_computes_what_the_decoding_step_does(benchmarks_importable):
    from compiled_decoder_step import StaticShapeStep, StepInputs, decode_as_generate, decode_static
    from fixtures import QUICK_SIZE, random_model, transformer_config

    model = random_model(transformer_config(QUICK_SIZE)).eval()
    with pytest.raises(RuntimeError, match="build it in prepacked_for_decoding"):
        StaticShapeStep(model, cache_steps=8)  # outside the block there are no laid-out weights to share
    with torch.inference_mode(), model.prepacked_for_decoding():
        inputs = StepInputs.random(model, rows=3, steps=5, cache_steps=8)  # room beyond the steps: masked
        expected = decode_as_generate(model, inputs)
        static = decode_static(StaticShapeStep(model, cache_steps=8), inputs)
    assert expected.shape == static.shape == (3, model.config.vocab_size)
    torch.testing.assert_close(static, expected, rtol=0, atol=1e-4)


def test_row_steps_are_counted_from_the_decoding_steps_beam_search_runs(benchmarks_importable):
    from continuous_batching_ceiling import count_row_steps
    from fixtures import QUICK_SIZE, random_model, transformer_config

    model = random_model(transformer_config(QUICK_SIZE)).eval()
    sources = torch.randint(4, model.config.vocab_size, (3, 6))
    forced = {"num_beams": 4, "min_new_tokens": 5, "max_new_tokens": 5}  # no sentence leaves early
    with torch.inference_mode():
        expected = model.generate(sources, **forced)
        row_steps = count_row_steps(model, lambda: model.generate(sources, **forced))
        assert row_steps == 3 * 1 + 3 * 4 * 4  # the first step on one beam per sentence, then every beam
        assert "_decoder_step" not in vars(model)  # the model's own step again
        assert torch.equal(model.generate(sources, **forced), expected)


def test_training_profile_quick_run_prints_its_tables():
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "investigations" / "profile_training.py"), "--quick", "--threads", "1"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    for row in ("| training step |", "| training step, dropout 0 |", "| its matrix products alone |"):
        assert row in completed.stdout
    assert "### Top operators over 4 profiled steps" in completed.stdout


def test_table_numbers_just_below_a_thousand_are_written_out(benchmarks_importable):
    from harness import format_number

    assert [format_number(value) for value in (999.4, 999.7, -999.8, 1234.5, 0.000123456)] == [
        "999",
        "1,000",
        "-1,000",
        "1,234",
        "0.000123",
    ]


def test_counts_below_one_are_refused_with_the_argument_named(benchmarks_importable):
    from harness import Stats, positive_int

    assert positive_int("3") == 3
    for text, message in [("0", "0 is not a positive integer"), ("-2", "-2 is not"), ("x", "'x' is not an integer")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            positive_int(text)
    with pytest.raises(ValueError, match="time at least one repeat"):
        Stats.of([])
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--repeats", "0"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
    )
    assert completed.returncode == 2 and "argument --repeats: 0 is not a positive integer" in completed.stderr


def test_generation_checkpoint_is_trained_once_and_cached(tmp_path, benchmarks_importable):
    from fixtures import QUICK_SIZE, load_corpus, random_model, trained_checkpoint, transformer_config

    cache = tmp_path / "cache"
    corpus = load_corpus(tmp_path / "no-data", cache, QUICK_SIZE.vocab_size, train_limit=200, validation_limit=4)
    checkpoint = trained_checkpoint(corpus, QUICK_SIZE, steps=10, cache_dir=cache, max_tokens=256)
    trained = checkpoint.load_ours("eager")
    initial = random_model(transformer_config(QUICK_SIZE, vocab_size=len(corpus.tokenizer)))
    assert not torch.equal(trained.lm_head.weight, initial.lm_head.weight)
    weights = checkpoint.ours / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert trained_checkpoint(corpus, QUICK_SIZE, steps=10, cache_dir=cache, max_tokens=256) == checkpoint
    assert weights.stat().st_mtime_ns == written  # found in the cache, not trained again
    # Built beside its place and renamed into it, each file as readable as the umask makes new files (safetensors
    # writes its own 0600): a carried or shared cache is readable by the accounts that run the benchmarks.
    built = [path.name for path in cache.iterdir() if path.name.startswith("trained")]
    assert built == [checkpoint.directory.name]  # no partial directory left beside it
    probe = cache / "probe"
    probe.touch()
    umask_mode = probe.stat().st_mode & 0o777
    for path in checkpoint.directory.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & umask_mode == umask_mode, path


# --- train_peers.py: the pieces that run without the peers ------------------------------------------------------


def write_multi30k_like(directory: Path, pairs: int = 120) -> Path:
    """Gzipped train / val files of toy sentences, named as Multi30k's."""
    import gzip

    from helpers import synthetic_pairs

    directory.mkdir(parents=True, exist_ok=True)
    for split, count, seed in (("train", pairs, 0), ("val", 20, 1)):
        rows = synthetic_pairs(count, seed=seed)
        for index, lang in enumerate(("en", "de")):
            with gzip.open(directory / f"{split}.{lang}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(row[index] + "\n" for row in rows))
    return directory


def test_train_peers_gives_every_trainer_the_same_tokens_and_vocabulary(tmp_path, benchmarks_importable):
    from train_peers import prepare
    from transformers import PreTrainedTokenizerFast

    prepared = prepare(write_multi30k_like(tmp_path / "data"), tmp_path / "work", limit=100, vocab_size=80)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(prepared.tokenizer)
    ordinary = tokenizer.convert_ids_to_tokens(list(range(3, len(tokenizer))))
    # fairseq's dict.txt and eole's vocabulary: the BPE's tokens after <pad>, <unk>, </s>, in id order.
    assert [line.split(" ")[0] for line in prepared.fairseq_dict.read_text().splitlines()] == ordinary
    assert [line.split("\t")[0] for line in prepared.eole_vocab.read_text().splitlines()] == ordinary
    # The peers' token files are this project's encoding of the same sentences, which it reads as text.
    sources = (prepared.text / "train.en").read_text().splitlines()
    tokens = prepared.tokens("train", "en").read_text().splitlines()
    assert len(sources) == len(tokens) == 100
    for text, line in zip(sources, tokens, strict=True):
        assert tokenizer.convert_tokens_to_ids(line.split(" ")) == tokenizer(text, add_special_tokens=False).input_ids
    stats = json.loads(prepared.stats.read_text())
    assert stats["pairs"] == 100 and stats["vocabulary"] == len(tokenizer)
    assert stats["train_tokens_en"] == sum(len(tokenizer(text).input_ids) for text in sources)
    (prepared.text / "train.en").unlink()  # a second call takes the cache, and builds nothing
    assert prepare(tmp_path / "data", tmp_path / "work", limit=100, vocab_size=80) == prepared
    assert not (prepared.text / "train.en").exists()


def test_train_peers_reads_a_stray_carriage_return_inside_a_sentence_as_text(tmp_path, benchmarks_importable):
    import gzip

    from train_peers import prepare

    data = write_multi30k_like(tmp_path / "data", pairs=20)
    sides = {}
    for lang, stray_at in (("en", 3), ("de", 12)):  # as CommonCrawl holds them; the counts still agree
        lines = gzip.decompress((data / f"train.{lang}.gz").read_bytes()).decode().split("\n")[:-1]
        lines[stray_at] = lines[stray_at].replace(" ", "\r", 1)
        sides[lang] = lines
        (data / f"train.{lang}.gz").write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))

    prepared = prepare(data, tmp_path / "work", limit=None, vocab_size=80)
    for lang, lines in sides.items():  # was each pair from the stray on beside another's, 21 of them
        assert (prepared.text / f"train.{lang}").read_bytes().decode().split("\n")[:-1] == lines


def test_train_peers_spells_whitespace_tokens_so_the_peers_read_them_as_one(benchmarks_importable):
    from collections import Counter

    from train_peers import peer_spelling, vocabulary_files

    tokens = ["<pad>", "<unk>", "</s>", "\t", "▁a", "b"]  # Multi30k's BPE holds a tab token
    fairseq, eole = vocabulary_files(tokens, Counter({"\t": 3, "▁a": 5, "b": 1}))
    assert fairseq.splitlines() == ["<0x09> 3", "▁a 5", "b 1"]
    assert eole.splitlines() == ["<0x09>\t3", "▁a\t5", "b\t1"]
    assert " ".join(map(peer_spelling, ["▁a", "\t", "b"])).split(" ") == ["▁a", "<0x09>", "b"]


def test_train_peers_measures_after_the_warm_up(benchmarks_importable):
    from train_peers import measure

    # (end time, real source, real target, padded source, padded target, sentences) per update.
    records = [[10.0, 5, 5, 8, 8, 2], [11.0, 30, 30, 40, 40, 4], [13.0, 60, 40, 80, 80, 8]]
    rate, per_update, efficiency, updates, seconds = measure(records, warmup=1)
    assert (updates, seconds, per_update) == (2, 3.0, 80.0)
    assert rate == pytest.approx(160 / 3) and efficiency == pytest.approx(160 / 240)
    with pytest.raises(ValueError, match="recorded 3 updates, not more than the 3 of warm-up"):
        measure(records, warmup=3)


def test_train_peers_arguments(tmp_path, benchmarks_importable, capsys):
    from train_peers import parse_arguments

    arguments = parse_arguments(["--only", "ours", "--threads", "1,2"])
    assert arguments.tools == ["ours"] and arguments.thread_counts == [1, 2]
    for argv, message in [
        (["--only", "ours,marian"], "unknown trainers ['marian']"),
        (["--only", "fairseq"], "--fairseq-python is required to run fairseq"),
        (["--only", "eole", "--eole-python", str(tmp_path / "none")], "does not exist"),
        (["--only", "eole", "--eole-python", sys.executable], f"--eole-python {sys.executable} cannot import eole"),
        (["--only", "ours", "--threads", "0"], "--threads must be at least 1"),
        (["--only", "ours", "--updates", "0"], "0 is not a positive integer"),
    ]:
        with pytest.raises(SystemExit):
            parse_arguments(argv)
        assert message in capsys.readouterr().err
    assert parse_arguments(["--dry-run"]).tools == ["ours", "eole", "fairseq"]  # no peer needed to print


def test_train_peers_times_this_project_and_prints_the_table(tmp_path):
    """The whole run for this project's trainer (the peers need their environments): scripts/train.py in a
    worker process, its updates counted and timed."""
    data = write_multi30k_like(tmp_path / "data")
    command = [sys.executable, str(BENCHMARKS / "train_peers.py"), "--only", "ours", "--threads", "1"]
    command += ["--updates", "2", "--warmup-updates", "1", "--repeats", "1", "--limit", "100", "--vocab-size", "80"]
    command += ["--max-tokens", "256", "--data-dir", str(data), "--work-dir", str(tmp_path / "work")]
    command += ["--output-json", str(tmp_path / "peers.json")]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=subprocess_env(), cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "| this project (scripts/train.py) | 1 |" in completed.stdout
    (run,) = json.loads((tmp_path / "peers.json").read_text())["runs"]
    assert run["tool"] == "ours" and run["timed_updates"] == 2 and run["tokens_per_second"] > 0
    assert 0 < run["padding_efficiency"] <= 1 and run["real_tokens_per_update"] > 0

    dry = subprocess.run(
        [*command[:2], "--dry-run", "--limit", "100", "--vocab-size", "80", "--data-dir", str(data), "--work-dir",
         str(tmp_path / "work")],
        capture_output=True, text=True, timeout=120, env=subprocess_env(),
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert [line.split(":")[0] for line in dry.stdout.splitlines() if not line.startswith(" ")] == [
        "ours",
        "eole",
        "fairseq",
    ]


def test_the_peers_worker_imports_without_this_project():
    """`train_peers.py` runs as the worker inside eole's and fairseq's environments, where `modeling` is absent."""
    code = f"import sys; sys.modules['modeling'] = None; sys.path.insert(0, {str(BENCHMARKS)!r}); import train_peers"
    subprocess.run([sys.executable, "-c", code], check=True, env=subprocess_env())
