"""The model as remote code: a saved directory loads, runs and generates with `trust_remote_code=True` where this
package cannot be imported, and transformers releases older than the code supports are refused in one line."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import batch, tiny_model

REMOTE_CODE_FILES = {
    "configuration_transformer.py",
    "modeling_transformer.py",
    "generation_transformer.py",
    "cache_transformer.py",
    "onednn_transformer.py",
}

# Prepended to a subprocess's script: a meta-path finder refuses `modeling`, so the process is a machine without
# this project (the editable install lives in site-packages).
BLOCK_THE_PACKAGE = """
import importlib.abc, sys
class BlockModeling(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "modeling" or name.startswith("modeling."):
            raise ModuleNotFoundError("blocked: " + name)
sys.meta_path.insert(0, BlockModeling())
try:
    import modeling
    sys.exit("the package was importable")
except ModuleNotFoundError:
    pass
"""


def run_without_the_package(script: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    code = BLOCK_THE_PACKAGE + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_remote_code_loads_and_generates_where_the_package_cannot_be_imported(tmp_path):
    model = tiny_model()
    model.generation_config.max_length_offset = 6  # an untrained model runs to its limit
    save_dir = tmp_path / "checkpoint"
    model.save_pretrained(save_dir)
    assert REMOTE_CODE_FILES <= {path.name for path in save_dir.iterdir()}, "every remote-code file is saved"
    inputs = batch()
    torch.save(inputs, tmp_path / "batch.pt")
    with torch.inference_mode():
        torch.save(model(**inputs).logits, tmp_path / "logits.pt")
        torch.save(model.model(**inputs).last_hidden_state, tmp_path / "hidden_states.pt")
        generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    result = run_without_the_package(
        f"""
        import json, torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(save_dir)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        base = AutoModel.from_pretrained({str(save_dir)!r}, trust_remote_code=True).eval()
        assert type(base).__name__ == "TransformerModel", type(base)
        inputs = torch.load({str(tmp_path / "batch.pt")!r})
        with torch.inference_mode():
            logits = model(**inputs).logits
            hidden_states = base(**inputs).last_hidden_state
            generated = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        assert torch.equal(logits, torch.load({str(tmp_path / "logits.pt")!r})), "logits differ"
        assert torch.equal(hidden_states, torch.load({str(tmp_path / "hidden_states.pt")!r})), "AutoModel's differ"
        print(json.dumps(generated.tolist()))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == generated.tolist(), "the paper's beam search, remotely"


def test_auto_map_names_the_encoder_decoder_for_automodel_too(tmp_path):
    """transformers writes the saved class's entry only: `AutoModel.from_pretrained(..., trust_remote_code=True)`
    found none."""
    tiny_model().save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_transformer.TransformerConfig",
        "AutoModel": "modeling_transformer.TransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_transformer.TransformerForConditionalGeneration",
    }


@pytest.mark.parametrize("version", ["5.17.0", "4.57.1"])
def test_an_older_transformers_is_refused_in_one_line_naming_the_version(version, tmp_path):
    """5.17 imports the model file, then fails in the first forward pass (`cache` was `past_key_values` before
    5.24); 4.x has no `PreTrainedConfig`. The configuration file, which every way in imports first, says so."""
    save_dir = tmp_path / "checkpoint"
    tiny_model().save_pretrained(save_dir)
    pretend = f"import transformers\ntransformers.__version__ = {version!r}\n"
    load = f"""
        from transformers import AutoModelForSeq2SeqLM
        try:
            AutoModelForSeq2SeqLM.from_pretrained({str(save_dir)!r}, trust_remote_code=True)
        except ImportError as error:
            print(error)
        else:
            raise SystemExit("loaded under transformers {version}")
        """
    through_the_hub_path = run_without_the_package(pretend + textwrap.dedent(load), tmp_path)
    through_the_package = subprocess.run(
        [sys.executable, "-c", pretend + "try:\n    import modeling\nexcept ImportError as error:\n    print(error)"],
        capture_output=True,
        text=True,
    )
    for result in (through_the_hub_path, through_the_package):
        assert result.returncode == 0, result.stderr[-3000:]
        message = result.stdout.strip()
        assert "\n" not in message, "one line"
        assert f"needs transformers>=5.24, found {version}" in message
        assert "pip install -U 'transformers>=5.24'" in message
