"""The project as users install it: `pip install .` (not editable) ships the model-card template with the code,
so that a card renders and a model pushes from an installed copy, far from this checkout."""

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
