"""The project as users install it: `pip install .` (not editable) ships the model-card template with the code,
so that a card renders and a model pushes from an installed copy, far from this checkout; and translating needs
only the core dependencies, none of the extras."""

import shutil
import subprocess
import sys
import textwrap

from helpers import HUB_TOKEN, REPO_ROOT, hub_env, save_tiny_checkpoint


def test_a_non_editable_install_renders_a_card_and_pushes(tmp_path, hub, card_dir):
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(REPO_ROOT / "modeling", source / "modeling", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    installed = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(installed), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)

    endpoint, root = hub
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(installed)!r})
        import modeling
        assert modeling.__file__.startswith({str(installed)!r}), modeling.__file__
        from modeling.hub import push_model_dir
        from modeling.model_card import write_model_card
        card = write_model_card({str(model_dir)!r}, repo_id="tester/installed", card_from=[{str(card_dir)!r}])
        print(push_model_dir({str(model_dir)!r}, "tester/installed"))
        """
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = hub_env(endpoint, tmp_path / "hf_home", HUB_TOKEN)
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("tester/installed")
    pushed = root / "tester" / "installed"
    assert "sacreBLEU" in (pushed / "README.md").read_text(), "the card was rendered from the shipped template"
    assert {"model.safetensors", "generation_transformer.py"} <= {path.name for path in pushed.iterdir()}


# The modules of the optional extras (pyproject.toml) that the core dependencies do not bring themselves (transformers
# brings huggingface_hub, PyYAML, numpy, tqdm): made unimportable, as on a machine that installed none of them.
EXTRAS_MODULES = (
    "accelerate datasets evaluate pyarrow sacrebleu sacremoses tensorboard matplotlib jinja2 ctranslate2 psutil onnx "
    "onnxruntime onnxscript"
).split()


def test_translating_needs_none_of_the_extras(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_checkpoint(model_dir)
    (tmp_path / "in.txt").write_text("a b c\n\nd e\n")
    script = textwrap.dedent(
        f"""
        import runpy, sys
        for name in {EXTRAS_MODULES!r}:
            sys.modules[name] = None  # import raises ImportError, importlib.util.find_spec gives None
        import modeling.translation
        sys.argv = ["translate.py", "--model", {str(model_dir)!r}, "--input-file", {str(tmp_path / "in.txt")!r},
                    "--output-file", {str(tmp_path / "out.txt")!r}]
        runpy.run_path({str(REPO_ROOT / "scripts" / "translate.py")!r}, run_name="__main__")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 3
