"""Fixtures shared by the test files; the plain helpers they build on are in `helpers.py`."""

import gc
import locale
import signal
import sys
from pathlib import Path

import datasets
import pytest
import torch
from helpers import (
    FAIRSEQ_MODELS,
    HUB_TOKEN,
    LAUNCHER_PROCESS_COUNTS,
    LOG_HISTORY,
    convert_fairseq_fixture,
    convert_fairseq_fixture_into,
    mixed_corpus,
    save_tiny_checkpoint,
    synthetic_pairs,
)
from hub_server import running_hub_server
from huggingface_hub import constants, hf_api, set_client_factory
from huggingface_hub.utils._http import default_client_factory
from transformers.utils import hub as transformers_hub

import modeling.hub_client as hub_client
from modeling import TransformerForConditionalGeneration, onednn_transformer
from modeling.evaluation import metrics_filename
from modeling.files import write_json
from modeling.hub_client import HUB_ATTEMPTS_ENV, HUB_TIMEOUT_ENV
from modeling.scoring import corpus_scores


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models run several times faster on one thread, above all on a shared machine: they gain nothing from
    more, and OpenMP threads competing with other processes for the cores spin and slow everything down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="module")
def long_lived_objects_frozen():
    """`Trainer.train()` collects garbage in full (accelerate's `free_memory`), and so traversed every object of the
    imports and of the fixtures alive: a million, 0.3 to 0.8 s a time, half the trainer tests' time. Frozen at the
    start of each module, they are left out; unfrozen at its end, what they hold becomes collectable again."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def onednn_linear(monkeypatch) -> None:
    """oneDNN's linear layers taken on any x86 CPU, Intel's included (where this project leaves MKL by default, as
    the faster), so that their code is tested on every x86 machine; skipped where the kernel cannot run."""
    if not onednn_transformer._ONEDNN_KERNEL:
        pytest.skip("oneDNN's linear kernel runs on x86 CPUs only")
    monkeypatch.setattr(onednn_transformer, "_ONEDNN_LINEAR", True)


@pytest.fixture
def decoder_steps(monkeypatch) -> list[int]:
    """The rows of every decoding step the static-cache beam search runs (`_decoder_step` calls), in order; it
    stays empty when `generate()` takes transformers' own loop."""
    steps: list[int] = []
    decoder_step = TransformerForConditionalGeneration._decoder_step

    def recording(self, tokens, cache):
        steps.append(len(tokens))
        return decoder_step(self, tokens, cache)

    monkeypatch.setattr(TransformerForConditionalGeneration, "_decoder_step", recording)
    return steps


@pytest.fixture
def sigint_raises_keyboard_interrupt():
    """Python's own SIGINT handler for the test: a shell starts background jobs (`pytest ... &`) with SIGINT
    ignored, and Python then leaves it ignored."""
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, outer)


@pytest.fixture
def sighup_handled():
    """SIGHUP's default action for the test, as a terminal session's process has: under `nohup` the suite starts with
    it ignored, and the callback leaves an ignored signal ignored."""
    outer = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, outer)


@pytest.fixture
def no_launcher(monkeypatch) -> None:
    """A process that no launcher started: none of the variables a launcher gives the process count in is set."""
    for name in LAUNCHER_PROCESS_COUNTS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """Keep the Arrow files of local datasets out of the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))


def use_hub_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Point huggingface_hub's calls at `endpoint`, those of the HfApi objects made before the test included:
    transformers' shared one kept the endpoint of the first test that used it, so a tokenizer's listing of the repo
    went to a Hub server stopped since, and waited out five retries (48 s) before giving up."""
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)  # `file_exists` and its kin: made at import
    monkeypatch.setattr(transformers_hub.hf_api(), "endpoint", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Start tests/hub_server.py on a free port; yield (endpoint, storage root); stop it by its pid."""
    root = tmp_path_factory.mktemp("hub")
    with running_hub_server(root, HUB_TOKEN) as endpoint:
        yield endpoint, root


@pytest.fixture
def hub_here(hub, tmp_path, monkeypatch):
    """The loopback Hub for this process's loads and pushes, datasets' too, with an empty cache: (endpoint, storage
    root)."""
    endpoint, root = hub
    use_hub_endpoint(monkeypatch, endpoint)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    return endpoint, root


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """(directory, model, tokenizer) of a saved tiny checkpoint."""
    directory = tmp_path_factory.mktemp("model")
    model, tokenizer = save_tiny_checkpoint(directory)
    return directory, model, tokenizer


@pytest.fixture(scope="module")
def eval_data_dir(tmp_path_factory) -> Path:
    """Line-aligned test.en / test.de files, as in Multi30k."""
    directory = tmp_path_factory.mktemp("data")
    pairs = synthetic_pairs(6, seed=7)
    (directory / "test.en").write_text("".join(en + "\n" for en, _ in pairs))
    (directory / "test.de").write_text("".join(de + "\n" for _, de in pairs))
    return directory


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return mixed_corpus()


@pytest.fixture(scope="module")
def eval_result() -> dict:
    """A real evaluation JSON, as scripts/evaluate.py writes it, scored on synthetic sentences."""
    references = [f"{de} rot-weiß" for _, de in synthetic_pairs(10, seed=4)]
    hypotheses = [ref.replace("Hund", "Katze").replace("Ball", "ball") for ref in references]
    scores = corpus_scores(hypotheses, references, "de")
    assert len({scores["sacrebleu"], scores["paper_bleu"], scores["tokenized_bleu_lc"]}) == 3, "tell them apart"
    return {"split": "test", "dataset": "synthetic", "source_lang": "en", "target_lang": "de", **scores}


@pytest.fixture(scope="module")
def card_dir(tmp_path_factory, eval_result) -> Path:
    """Everything a model card is rendered from: an evaluation, a trainer state, training arguments, data stats."""
    directory = tmp_path_factory.mktemp("card_inputs")
    write_json(directory / metrics_filename("test"), eval_result)
    write_json(directory / "trainer_state.json", {"global_step": 20, "log_history": LOG_HISTORY})
    write_json(directory / "training_args.json", {"learning_rate": 7e-4, "output_dir": "/x", "max_tokens": 25000})
    stats = {"language_pair": "en-de", "sentence_pairs": {"train": 200}, "cleaning": {"too_long": 3}}
    write_json(directory / "data_stats.json", stats)
    return directory


@pytest.fixture(scope="session")
def converted_fairseq():
    """{fixture model name: (model, tokenizer)}: both fairseq-made models, converted once."""
    return {name: convert_fairseq_fixture(name) for name in FAIRSEQ_MODELS}


@pytest.fixture(scope="session")
def converted_fairseq_dir(tmp_path_factory) -> Path:
    """The directory `modeling.fairseq.convert_fairseq` writes for the fixtures' transformer_wmt_en_de."""
    return convert_fairseq_fixture_into(tmp_path_factory.mktemp("fairseq") / "converted")


@pytest.fixture
def quick_hub(monkeypatch):
    """A Hub timeout of 0.3 s and 2 attempts, so that failing calls fail fast."""
    monkeypatch.setenv(HUB_TIMEOUT_ENV, "0.3")
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "2")
    monkeypatch.setattr(hub_client, "FIRST_BACKOFF", 0.1)

    yield lambda endpoint: use_hub_endpoint(monkeypatch, endpoint)
    set_client_factory(default_client_factory)  # no 0.3 s client left behind for later tests


@pytest.fixture
def ascii_locale():
    """The locale of a job started under LANG=C with PYTHONUTF8=0: `open` without an encoding reads ASCII."""
    if sys.flags.utf8_mode:
        pytest.skip("UTF-8 mode reads UTF-8 whatever the locale")
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
            pytest.skip("the C locale's encoding is UTF-8 here")
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
