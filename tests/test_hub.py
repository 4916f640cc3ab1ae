"""Model card, curves, and a real push + download round trip against the local Hub look-alike (tests/hub_server.py).

The round trip runs `scripts/push_to_hub.py`, then loads the repo by id in a fresh interpreter that cannot import
`modeling` and starts from an empty cache: what a user without this project gets from the Hub.
"""

import json
import os
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_server import card_metadata_errors, running_hub_server
from huggingface_hub import ModelCard, metadata_load
from tiny_checkpoint import save_tiny_checkpoint, synthetic_pairs

import modeling.hub as hub_module
from modeling.evaluation import corpus_scores, metrics_filename, write_json
from modeling.hub import check_model_dir, collect_card_inputs, plot_training_curves, render_model_card

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_test_token_not_a_real_one"
REPO_ID = "tester/tiny-transformer"
SENTENCES = ["the small dog sees a red ball.", "a cat likes the house today.", "big ball."]

LOG_HISTORY = [
    {"loss": 5.1, "learning_rate": 1e-4, "epoch": 0.5, "step": 10},
    {"loss": 4.2, "learning_rate": 2e-4, "epoch": 1.0, "step": 20},
    {"eval_loss": 4.6, "eval_sacrebleu": 1.5, "epoch": 1.0, "step": 20},
    {"train_runtime": 12.5, "train_loss": 4.65, "epoch": 1.0, "step": 20},
]


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
    directory = tmp_path_factory.mktemp("card_inputs")
    write_json(directory / metrics_filename("test"), eval_result)
    write_json(directory / "trainer_state.json", {"global_step": 20, "log_history": LOG_HISTORY})
    write_json(directory / "training_args.json", {"learning_rate": 7e-4, "output_dir": "/x", "max_tokens": 25000})
    stats = {"language_pair": "en-de", "sentence_pairs": {"train": 200}, "cleaning": {"too_long": 3}}
    write_json(directory / "data_stats.json", stats)
    return directory


# --- card and curves, no server -----------------------------------------------------------------------------


def test_card_metadata_has_the_bleu_results_in_model_index(eval_result):
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result])
    data = ModelCard(str(card)).data  # parse back what would be README.md
    assert data.model_name == "tiny"
    assert data.language == ["en", "de"] and data.pipeline_tag == "translation"
    assert data.library_name == "transformers" and data.license == "apache-2.0"
    by_name = {result.metric_name: result for result in data.eval_results}
    sacrebleu = by_name["sacreBLEU"]
    assert sacrebleu.metric_type == "bleu" and sacrebleu.task_type == "translation"
    assert sacrebleu.metric_value == round(eval_result["sacrebleu"], 2)
    assert sacrebleu.metric_config == eval_result["sacrebleu_signature"]
    assert sacrebleu.dataset_type == "synthetic" and sacrebleu.dataset_split == "test"
    paper = by_name["BLEU (tokenised, compound splitting, as in the paper)"]
    assert paper.metric_value == round(eval_result["paper_bleu"], 2)
    assert by_name["BLEU (tokenised, lowercased)"].metric_value == round(eval_result["tokenized_bleu_lc"], 2)
    assert by_name["chrF"].metric_type == "chrf"
    assert f"{eval_result['sacrebleu']:.2f}" in card.text
    assert "@inproceedings{vaswani2017attention" in card.text
    assert f'from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text


def test_the_test_hub_validates_model_index_like_the_hub(eval_result):
    card = str(render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result]))
    assert card_metadata_errors(card) == []
    broken = card.replace("value: ", "value: about ", 1)  # the first metric value becomes a string
    assert card_metadata_errors(broken) == ['"model-index[].results[].metrics[]" needs a "type" and a numeric "value"']


def test_card_without_measurements_says_so_and_invents_nothing():
    card = render_model_card(model_name="tiny", repo_id=REPO_ID)
    assert "model-index" not in str(card)
    assert card.data.eval_results is None
    for sentence in ("Not measured", "Hyperparameters: not recorded", "Data statistics: not recorded"):
        assert sentence in card.text
    assert "Training curves: not recorded" in card.text


def test_training_curves_and_collected_inputs(card_dir, tmp_path):
    inputs = collect_card_inputs([card_dir])
    assert inputs["log_history"] == LOG_HISTORY and len(inputs["eval_results"]) == 1
    png = plot_training_curves(inputs["log_history"], tmp_path / "curves.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="no train loss"):
        plot_training_curves([{"learning_rate": 1.0, "step": 1}], tmp_path / "empty.png")


def test_check_model_dir_refuses_a_directory_without_remote_code(tmp_path):
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "modeling_transformer.py").unlink()
    with pytest.raises(FileNotFoundError, match="modeling_transformer.py"):
        check_model_dir(tmp_path)


# --- push and download through the local Hub ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Start tests/hub_server.py on a free port; yield (endpoint, storage root); stop it by its pid."""
    root = tmp_path_factory.mktemp("hub")
    with running_hub_server(root, TOKEN) as endpoint:
        yield endpoint, root


def hub_env(endpoint: str, hf_home: Path, token: str | None) -> dict[str, str]:
    """Environment of a fresh process talking to the local Hub only, with its own empty cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS="1",  # tiny model: extra threads only contend with the other test processes
    )
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def requests_made(root: Path) -> list[tuple[str, str, int]]:
    lines = (root / "requests.jsonl").read_text().splitlines() if (root / "requests.jsonl").exists() else []
    return [(r["method"], r["path"], r["status"]) for r in map(json.loads, lines)]


# Runs in `python -I` (no PYTHONPATH, no user site) from an empty directory. The editable install of this project
# lives in site-packages, so a meta-path finder refuses `modeling` first: the process is a machine without it.
LOADER = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoProjectPackage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "modeling" or name.startswith("modeling."):
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, NoProjectPackage())
    try:
        import modeling
    except ImportError:
        pass
    else:
        sys.exit("the project package is importable: this would not test remote code")

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    repo_id, sentences, output = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
    plain_tokenizer = AutoTokenizer.from_pretrained(repo_id)  # no flag: prompts (stdout), EOF declines
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with open(output, "w") as f:
        json.dump({
            "module": type(model).__module__,
            "ids": model.generate(**batch).tolist(),
            "plain_tokenizer_ids": plain_tokenizer(sentences)["input_ids"],
            "num_beams": model.generation_config.num_beams,
            "max_length_offset": model.generation_config.max_length_offset,
        }, f)
    """
)


def test_push_then_load_by_repo_id_without_the_package(hub, tmp_path, card_dir):
    endpoint, root = hub
    model_dir = tmp_path / "model"
    model, tokenizer = save_tiny_checkpoint(model_dir)

    push = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "push_to_hub.py"), "--model", str(model_dir)]
        + ["--repo-id", REPO_ID, "--card-from", str(card_dir)],
        env=hub_env(endpoint, tmp_path / "home_push", TOKEN),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert push.returncode == 0, push.stderr
    assert f"{endpoint}/{REPO_ID}" in push.stdout
    assert TOKEN not in push.stdout + push.stderr
    flow = [(method, path) for method, path, status in requests_made(root) if status == 200]
    assert flow.index(("POST", "/api/repos/create")) < flow.index(("POST", "/api/validate-yaml"))
    assert ("POST", f"/api/models/{REPO_ID}/commit/main") in flow

    stored = root / REPO_ID
    expected = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"}
    assert expected | {"configuration_transformer.py", "modeling_transformer.py", "training_curves.png"} <= {
        p.name for p in stored.iterdir()
    }
    metadata = metadata_load(stored / "README.md")
    assert metadata["model-index"][0]["name"] == "tiny-transformer" and metadata["language"] == ["en", "de"]
    card = (stored / "README.md").read_text()
    assert (
        "| sentence_pairs.train | 200 |" in card and "![Training and evaluation curves](training_curves.png)" in card
    )
    for path in stored.iterdir():
        assert TOKEN.encode() not in path.read_bytes(), f"the token leaked into {path.name}"

    empty_dir = tmp_path / "elsewhere"
    empty_dir.mkdir()
    load = subprocess.run(
        [sys.executable, "-I", "-c", LOADER, REPO_ID, json.dumps(SENTENCES), str(tmp_path / "loaded.json")],
        cwd=empty_dir,
        env=hub_env(endpoint, tmp_path / "home_load", token=None),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert load.returncode == 0, load.stderr
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["module"].startswith("transformers_modules."), "the model class must come from the repo's code"
    assert loaded["num_beams"] == 4, "generation_config.json travels with the repo"
    assert loaded["max_length_offset"] == model.generation_config.max_length_offset

    batch = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    with torch.inference_mode():
        expected_ids = model.generate(**batch).tolist()
    assert loaded["ids"] == expected_ids
    assert loaded["plain_tokenizer_ids"] == tokenizer(SENTENCES)["input_ids"]


def test_push_without_a_token_fails_clearly_before_any_request(tmp_path, monkeypatch):
    """In-process (a third interpreter would cost seconds of imports): no HF_TOKEN and no saved login."""
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_module, "get_token", lambda: None)  # what a machine without `hf auth login` returns

    def no_network(*args, **kwargs):
        raise AssertionError("a push without a token must not reach the Hub")

    monkeypatch.setattr(hub_module, "HfApi", no_network)
    script = REPO_ROOT / "scripts" / "push_to_hub.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--model", str(model_dir), "--repo-id", "tester/no-token"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    message = str(exit_info.value.code)
    assert message.startswith("error: No Hugging Face token found")
    assert "HF_TOKEN" in message and "hf auth login" in message
    assert not (model_dir / "README.md").exists(), "nothing is written before the token is known"
