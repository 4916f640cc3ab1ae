"""scripts/push_to_hub.py: a real push + download round trip against the local Hub look-alike (tests/hub_server.py),
then the repo loaded by id in a fresh interpreter that cannot import `modeling` and starts from an empty cache:
what a user without this project gets from the Hub."""

import json
import os
import runpy
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import (
    HUB_TOKEN,
    REPO_ROOT,
    hub_env,
    requests_made,
    save_tiny_checkpoint,
    script_error,
    training_run_holding,
)
from huggingface_hub import HfApi, metadata_load

import modeling.hub as hub_module
from modeling.files import sole_writer
from modeling.hub_client import HUB_ATTEMPTS_ENV

REPO_ID = "tester/tiny-transformer"


SENTENCES = ["the small dog sees a red ball.", "a cat likes the house today.", "big ball."]


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


def run_push(endpoint: str, home, *args) -> subprocess.CompletedProcess:
    """scripts/push_to_hub.py with `args`, in a child process that pushes to the loopback Hub with the test token."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "push_to_hub.py"), *map(str, args)],
        env=hub_env(endpoint, home, HUB_TOKEN),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_push_while_another_process_replaces_the_directory_is_refused_before_any_upload(hub, tmp_path):
    """An average being written into the directory (here: the lock its writer holds): before, the push checked the
    old weights, then uploaded the new ones unchecked, without the card the replacement deleted."""
    endpoint, root = hub
    model_dir = tmp_path / "averaged"
    save_tiny_checkpoint(model_dir)
    with sole_writer(model_dir):
        push = run_push(endpoint, tmp_path / "home", "--model", model_dir, "--repo-id", "user/locked")
    assert push.returncode == 1
    assert push.stderr.strip().splitlines()[-1] == (
        f"error: another process is writing {model_dir} (it holds {tmp_path / '.averaged.lock'}): wait for it to "
        "end, then run this again"
    )
    assert not any("user/locked" in path for _, path, _ in requests_made(root)), "nothing sent to the Hub"
    assert not (model_dir / "README.md").exists()
    pushed = run_push(endpoint, tmp_path / "home", "--model", model_dir, "--repo-id", "user/locked")
    assert pushed.returncode == 0, pushed.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged"], "no lock file left"


def test_a_push_of_a_run_directory_while_the_run_trains_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A run resumed to train on in the directory of its earlier final model saves its new one there, file by file,
    when it ends: a push meanwhile uploaded the new weights, unchecked, with the card and scores of the old ones."""
    run = tmp_path / "run"
    save_tiny_checkpoint(run)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(hub_module, "HfApi", lambda *args, **kwargs: pytest.fail("nothing may be pushed"))
    with training_run_holding(run) as holder:
        message = script_error("push_to_hub.py", "--model", run, "--repo-id", REPO_ID, monkeypatch=monkeypatch)
    assert message == (
        f"error: {run} is in use by a training run ({holder}), which saves its final model there when it ends: push "
        "it once the run has ended, or push one of its checkpoints"
    )
    assert not (run / "README.md").exists()


def test_a_push_whose_report_cannot_be_printed_is_pushed(hub, tmp_path):
    """`push_to_hub.py ... | head -0`, or a terminal gone: the print of "Wrote the model card" raised EPIPE, which
    ended the script with "error: [Errno 32] Broken pipe" before anything was pushed."""
    endpoint, root = hub
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    read_end, write_end = os.pipe()
    os.close(read_end)
    command = [sys.executable, str(REPO_ROOT / "scripts" / "push_to_hub.py"), "--model", str(model_dir)]
    command += ["--repo-id", "user/unread"]
    env = hub_env(endpoint, tmp_path / "home", HUB_TOKEN)
    push = subprocess.run(command, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert push.returncode == 1 and "Traceback" not in push.stderr and "error" not in push.stderr
    assert (root / "user/unread" / "model.safetensors").is_file() and (root / "user/unread" / "README.md").is_file()


def test_push_then_load_by_repo_id_without_the_package(hub, tmp_path, card_dir):
    endpoint, root = hub
    model_dir = tmp_path / "model"
    model, tokenizer = save_tiny_checkpoint(model_dir)

    push = run_push(
        endpoint, tmp_path / "home_push", "--model", model_dir, "--repo-id", REPO_ID, "--card-from", card_dir
    )
    assert push.returncode == 0, push.stderr
    assert f"{endpoint}/{REPO_ID}" in push.stdout
    assert HUB_TOKEN not in push.stdout + push.stderr
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
        assert HUB_TOKEN.encode() not in path.read_bytes(), f"the token leaked into {path.name}"

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


def test_a_truncated_weights_file_is_refused_even_when_a_card_exists(tmp_path, monkeypatch):
    """With a README.md already there the card is not rendered again; the check of every file still runs."""
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    (model_dir / "README.md").write_text("---\nlicense: apache-2.0\n---\nA card.\n")
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size - 64])
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(hub_module, "HfApi", lambda *args, **kwargs: pytest.fail("a broken model must not be pushed"))
    message = script_error("push_to_hub.py", "--model", model_dir, "--repo-id", REPO_ID, monkeypatch=monkeypatch)
    assert message.startswith("error: ") and "model.safetensors is truncated" in message and "\n" not in message


def test_train_script_reports_an_unreachable_hub_in_one_line(tmp_path, monkeypatch, quick_hub):
    """The push at the end of training is checked first (token, repo): a refused connection is one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed when the block ends: refused
    quick_hub(endpoint)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setenv(HUB_ATTEMPTS_ENV, "1")
    flags = ["--preset", "tiny", "--use_cpu", "--report_to", "none", "--push_to_hub", "--hub_model_id", REPO_ID]
    flags += ["--data-dir", tmp_path / "none", "--output-dir", tmp_path]
    message = script_error("train.py", *flags, monkeypatch=monkeypatch)
    assert message.startswith(f"error: POST {endpoint}/api/repos/create: cannot connect (")
    assert "\n" not in message and not list(tmp_path.iterdir()), "nothing trained, nothing written"


def no_hub(*args, **kwargs):
    pytest.fail("nothing may reach the Hub")


def test_an_invalid_repo_id_is_refused_before_the_card_is_written(tmp_path, monkeypatch, card_dir):
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(hub_module, "HfApi", no_hub)
    flags = ["--model", model_dir, "--repo-id", "me/bad name", "--card-from", card_dir]
    message = script_error("push_to_hub.py", *flags, monkeypatch=monkeypatch)
    assert message.startswith("error: ") and "me/bad name" in message and "\n" not in message
    assert not (model_dir / "README.md").exists() and not (model_dir / "training_curves.png").exists()


def test_a_repo_id_without_namespace_gets_the_token_owners_in_the_card(tmp_path, monkeypatch):
    from helpers import run_script
    from huggingface_hub import HfApi

    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(HfApi, "whoami", lambda self, *args, **kwargs: {"name": "tester"})
    pushed = []
    monkeypatch.setattr(hub_module, "push_model_dir", lambda path, repo_id, **kwargs: pushed.append(repo_id) or "url")
    run_script("push_to_hub.py", "--model", model_dir, "--repo-id", "noslash", monkeypatch=monkeypatch)
    assert pushed == ["tester/noslash"]
    assert 'from_pretrained("tester/noslash"' in (model_dir / "README.md").read_text()


def test_another_models_scores_are_refused_before_anything_is_written(tmp_path, monkeypatch, eval_result):
    from modeling.files import write_json

    model_dir, other = tmp_path / "model", tmp_path / "other"
    save_tiny_checkpoint(model_dir)
    other.mkdir()
    write_json(tmp_path / "eval" / "eval_results_test.json", {**eval_result, "model": str(other)})
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(hub_module, "HfApi", no_hub)
    flags = ["--model", model_dir, "--repo-id", REPO_ID, "--card-from", tmp_path / "eval"]
    message = script_error("push_to_hub.py", *flags, monkeypatch=monkeypatch)
    assert message.startswith("error: ") and str(other) in message and str(model_dir) in message
    assert not (model_dir / "README.md").exists()


def test_stale_training_curves_are_not_uploaded_and_leave_the_repo(hub, tmp_path, card_dir):
    """A card rendered without curves after one with them: the old PNG stays on disk (it may be the user's) but is
    not uploaded beside a card that says "Training curves: not recorded", and an earlier push's copy is deleted."""
    endpoint, root = hub
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    (model_dir / "training_curves.png").write_bytes(b"\x89PNG an earlier card's curves")
    repo_id = "tester/no-curves"
    earlier_push = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    earlier_push.create_repo(repo_id)
    earlier_push.upload_file(path_or_fileobj=b"\x89PNG curves", path_in_repo="training_curves.png", repo_id=repo_id)
    assert (root / repo_id / "training_curves.png").is_file()
    push = run_push(
        endpoint, tmp_path / "home_push", "--model", model_dir, "--repo-id", repo_id, "--card-from", tmp_path
    )
    assert push.returncode == 0, push.stderr
    stored = {path.name for path in (root / repo_id).iterdir()}
    assert "README.md" in stored and "training_curves.png" not in stored
    assert "Training curves: not recorded" in (root / repo_id / "README.md").read_text()
    assert (model_dir / "training_curves.png").exists()


def test_a_file_or_directory_given_for_the_other_is_named_as_such(tmp_path, monkeypatch):
    """Each was said not to exist: "Model directory notes.txt does not exist.", "Card input directory notes.txt does
    not exist.", "Model card template templates does not exist; pass template_path.\""""
    model_dir, notes, templates = tmp_path / "model", tmp_path / "notes.txt", tmp_path / "templates"
    save_tiny_checkpoint(model_dir)
    notes.write_text("")
    templates.mkdir()
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setattr(hub_module, "HfApi", no_hub)
    cases = {
        ("--model", notes): f"error: Model directory {notes} is a file: give the directory that holds it.",
        (
            "--model",
            model_dir,
            "--card-from",
            notes,
        ): f"error: Card input directory {notes} is a file: give the directory that holds it.",
        ("--model", model_dir, "--template", templates): (
            f"error: Model card template {templates} is a directory: give the template file."
        ),
    }
    for flags, expected in cases.items():
        assert script_error("push_to_hub.py", *flags, "--repo-id", REPO_ID, monkeypatch=monkeypatch) == expected
    assert not (model_dir / "README.md").exists()
