"""Smoke tests of benchmarks/: everything runs end to end at tiny sizes and prints its tables.

No timing is asserted (the numbers of a tiny run on a shared machine mean nothing). The runs use one thread: with
two OpenMP threads on two busy cores, every tiny operator waits at a barrier for a descheduled thread, and a
one-second run takes twenty. The main run uses the synthetic corpus, so it needs no data; the Multi30k run skips
when ../shared is absent.
"""

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
# The benchmark scripts put benchmarks/ first on sys.path, so `modeling` would come from wherever it is installed
# (another checkout, for an editable install): this checkout's goes first, as gpu_check.sh does for itself.
CHECKOUT_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
TABLE_HEADERS = {
    "train_step": "| contender | tokens/s (median) |",
    "train_data": "| pipeline | real tokens/s (median) |",
    "generate": "| contender | sentences/s (median) |",
    "memory": "| workload: contender | peak RSS (MiB) |",
}


def run_quick(tmp_path: Path, *arguments: str) -> tuple[str, dict]:
    output = tmp_path / "results.json"
    command = [sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--cache-dir", str(tmp_path / "cache")]
    command += ["--threads", "1"]
    command += ["--output-json", str(output), *arguments]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=CHECKOUT_ENV)
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
    assert results["sections"]["generate"]["agreement"]["MarianMT (sdpa)"] == 1.0
    assert results["sections"]["generate"]["agreement"]["CTranslate2 float32"] == 1.0


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
        env={**os.environ, "PYTHON": sys.executable, "WHEELS": str(wheels), "TMPDIR": str(tmp_path)},
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
    assert set(json.loads(output.read_text())["sections"]) == {"train_base", "train_big", "generate"}


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


def test_training_profile_quick_run_prints_its_tables():
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "investigations" / "profile_training.py"), "--quick", "--threads", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=CHECKOUT_ENV,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    for row in ("| training step |", "| training step, dropout 0 |", "| its matrix products alone |"):
        assert row in completed.stdout
    assert "### Top operators over 4 profiled steps" in completed.stdout


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
        env=CHECKOUT_ENV,
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
