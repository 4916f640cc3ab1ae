"""scripts/translate.py end to end on a tiny checkpoint, in this process."""

import errno
import gzip
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import (
    HUB_TOKEN,
    SCRIPTS,
    closed_port_endpoint,
    fed_pipe,
    run_script,
    script_error,
    subprocess_env,
    training_run_holding,
)

from modeling import translation
from modeling.quantization import quantize_int8
from modeling.translation import model_files, translate

# The scripts load local datasets: their Arrow files go to a temporary cache, not the user's.
pytestmark = pytest.mark.usefixtures("datasets_cache")


def test_translate_from_stdin_keeps_order_and_empty_lines(tiny_checkpoint, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    lines = ["the small dog sees a red ball.", "", "a cat.", "  ", "big house today."]
    stdin = "\r\n".join(lines).encode() + b"\n"
    run_script("translate.py", "--model", model_dir, monkeypatch=monkeypatch, stdin=stdin)

    output = capsys.readouterr().out
    assert output.count("\n") == len(lines)
    translations = output.split("\n")[:-1]
    assert translations[1] == translations[3] == ""
    assert translations == translate(model, tokenizer, lines)


@pytest.mark.parametrize("to_file", [False, True], ids=["to stdout", "to a file"])
def test_a_pipe_as_input_file_loses_no_line(to_file, tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """`--input-file <(command)`: the checks before loading the model must not read the pipe's first lines."""
    model_dir, model, tokenizer = tiny_checkpoint
    lines = [f"the dog sees {count} red balls." for count in range(40)]
    output = tmp_path / "out.de"
    with fed_pipe(tmp_path / "pipe", "".join(line + "\n" for line in lines)) as pipe:
        destination = ["--output-file", output] if to_file else []
        run_script("translate.py", "--model", model_dir, "--input-file", pipe, *destination, monkeypatch=monkeypatch)
    translations = (output.read_text() if to_file else capsys.readouterr().out).split("\n")[:-1]
    assert translations == translate(model, tokenizer, lines)


def test_output_file_dash_is_standard_output(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    monkeypatch.chdir(tmp_path)
    run_script("translate.py", "--model", model_dir, "--output-file", "-", "a cat.", monkeypatch=monkeypatch)
    assert capsys.readouterr().out == translate(model, tokenizer, ["a cat."])[0] + "\n"
    assert not list(tmp_path.iterdir()), "no file named '-'"


def test_an_output_file_that_is_the_input_file_is_refused_before_loading(tiny_checkpoint, tmp_path, monkeypatch):
    model_dir = tiny_checkpoint[0]
    source = tmp_path / "news.en"
    source.write_text("a cat.\n")
    message = script_error(
        "translate.py", "--model", model_dir, "--input-file", source, "--output-file", source, monkeypatch=monkeypatch
    )
    assert message == f"error: --output-file {source} is --input-file {source}: writing it would destroy it; " + (
        "choose another path"
    )
    assert source.read_text() == "a cat.\n"


def test_an_output_file_that_is_one_of_the_models_files_is_refused_before_loading(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """`--output-file MODEL/config.json` wrote the translations over the model's config (exit 0)."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_checkpoint[0], model_dir)
    config = (model_dir / "config.json").read_text()
    (model_dir / "README.md").write_text("# card\n")
    for name in ("config.json", "model.safetensors", "README.md"):
        message = script_error(
            "translate.py", "--model", model_dir, "--output-file", model_dir / name, "a cat.", monkeypatch=monkeypatch
        )
        assert message == (
            f"error: --output-file {model_dir / name} is the model's {name} {model_dir / name}: writing it would "
            "destroy it; choose another path"
        )
    assert (model_dir / "config.json").read_text() == config
    (model_dir / "test.de").write_text("Eine Katze.\n")  # an earlier translation beside the model: written again
    assert "the model's test.de" not in model_files(model_dir) and "the model's README.md" in model_files(model_dir)
    assert model_files("owner/name") == {}


def test_an_output_file_inside_a_checkpoint_of_a_run_still_training_is_refused(tiny_checkpoint, tmp_path, monkeypatch):
    """`--output-file runs/x/checkpoint-N/test.de`: the run's rotation (`--save_total_limit`) deleted the checkpoint,
    and with it the translation and the partial file it would resume from. Beside a finished run's, it is written."""
    checkpoint = tmp_path / "run" / "checkpoint-8"
    shutil.copytree(tiny_checkpoint[0], checkpoint)
    output = checkpoint / "test.de"
    with training_run_holding(checkpoint.parent) as holder:
        message = script_error(
            "translate.py", "--model", checkpoint, "--output-file", output, "a cat.", monkeypatch=monkeypatch
        )
    assert message == (
        f"error: --output-file {output} lies inside {checkpoint}, which the training run in {checkpoint.parent} "
        f"({holder}) deletes when it rotates its checkpoints: write it outside that directory"
    )
    assert not output.exists()
    run_script("translate.py", "--model", checkpoint, "--output-file", output, "a cat.", monkeypatch=monkeypatch)
    assert output.read_text().count("\n") == 1


def test_translate_from_arguments_and_gzipped_file(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    sentences = ["a cat likes the ball.", "", "the dog."]
    run_script("translate.py", "--model", model_dir, *sentences, monkeypatch=monkeypatch)
    from_arguments = capsys.readouterr().out.split("\n")[:-1]
    assert from_arguments == translate(model, tokenizer, sentences)

    with gzip.open(tmp_path / "input.en.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(s + "\n" for s in sentences))
    output_file = tmp_path / "output.de"
    args = ["--model", model_dir, "--input-file", tmp_path / "input.en.gz", "--output-file", output_file]
    run_script("translate.py", *args, monkeypatch=monkeypatch)
    assert output_file.read_text().split("\n")[:-1] == from_arguments


def test_translate_with_int8_gives_what_the_quantised_model_gives(tiny_checkpoint, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    sentences = ["a cat likes the ball.", "", "the dog."]
    run_script("translate.py", "--model", model_dir, "--int8", *sentences, monkeypatch=monkeypatch)
    assert capsys.readouterr().out.split("\n")[:-1] == translate(quantize_int8(model), tokenizer, sentences)


def test_translate_with_two_workers_gives_what_one_gives(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    sentences = ["a cat likes the ball.", "", "the dog.", "big house today.", "the small dog sees a red ball."]
    (tmp_path / "input.en").write_text("".join(s + "\n" for s in sentences))
    args = ["--model", model_dir, "--input-file", tmp_path / "input.en", "--max-tokens", "40", "--workers", "2"]
    run_script("translate.py", *args, monkeypatch=monkeypatch)
    assert capsys.readouterr().out.split("\n")[:-1] == translate(model, tokenizer, sentences, max_tokens=40)


def test_a_full_disk_leaves_the_old_output_file_and_says_so_in_one_line(tiny_checkpoint, tmp_path, monkeypatch):
    output_file = tmp_path / "output.de"
    output_file.write_text("the earlier translations\n")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    args = ["--model", tiny_checkpoint[0], "--output-file", output_file, "a cat."]
    message = script_error("translate.py", *args, monkeypatch=monkeypatch)
    assert message.startswith(f"error: No space left on device while writing {output_file}") and "\n" not in message
    assert output_file.read_text() == "the earlier translations\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["output.de"], "no temporary file left"


def test_the_input_and_the_destination_are_named_before_any_model_is_loaded(tmp_path, monkeypatch):
    model = ["--model", tmp_path / "no_model_here"]  # reaching the model would fail with another message
    blocker = tmp_path / "results"
    blocker.write_text("")
    destination = ["--output-file", blocker / "news.de"]
    message = script_error("translate.py", *model, *destination, "a cat.", monkeypatch=monkeypatch)
    assert message == f"error: cannot write {blocker / 'news.de'}: {blocker} is a file, not a directory"

    message = script_error("translate.py", *model, "--input-file", tmp_path / "news.en", monkeypatch=monkeypatch)
    assert "No such file or directory" in message and str(tmp_path / "news.en") in message

    (tmp_path / "latin1.en").write_bytes("grün\n".encode("latin-1"))
    message = script_error("translate.py", *model, "--input-file", tmp_path / "latin1.en", monkeypatch=monkeypatch)
    assert message.startswith(f"error: {tmp_path / 'latin1.en'}:1: not valid UTF-8")


def test_bad_utf8_further_on_is_named_and_what_came_before_is_kept(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    stdin = b"a cat.\nthe dog.\n" + "grün\n".encode("latin-1")
    with pytest.raises(SystemExit) as exit_info:
        run_script("translate.py", "--model", model_dir, "--chunk-lines", "2", monkeypatch=monkeypatch, stdin=stdin)
    assert str(exit_info.value.code).startswith("error: <stdin>:3: not valid UTF-8")
    assert capsys.readouterr().out.split("\n")[:-1] == translate(model, tokenizer, ["a cat.", "the dog."])


def test_an_interrupted_translation_says_where_it_is_kept_and_the_same_command_resumes(
    tiny_checkpoint, tmp_path, monkeypatch
):
    model_dir, model, tokenizer = tiny_checkpoint
    lines = [f"the dog sees {n} red balls." for n in range(7)]
    (tmp_path / "news.en").write_text("".join(line + "\n" for line in lines))
    calls = []

    def interrupted_at_the_third_chunk(model, tokenizer, sentences, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(sentences)
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation, "translate", interrupted_at_the_third_chunk)
    command = ["--model", model_dir, "--input-file", tmp_path / "news.en", "--output-file", tmp_path / "news.de"]
    message = script_error("translate.py", *command, "--chunk-lines", "2", monkeypatch=monkeypatch)
    partial = tmp_path / ".news.de.partial"
    assert message == f"interrupted: what was translated is kept in {partial}; the same command resumes after it"
    calls.clear()
    monkeypatch.setattr(
        translation, "translate", lambda *args, **kwargs: calls.append(args[2]) or translate(*args, **kwargs)
    )
    run_script("translate.py", *command, "--chunk-lines", "2", monkeypatch=monkeypatch)
    assert calls == [lines[4:6], lines[6:]], "the four lines translated before are not translated again"
    assert (tmp_path / "news.de").read_text().split("\n")[:-1] == translate(model, tokenizer, lines)


def test_sentences_given_as_arguments_interrupted_are_not_said_to_be_kept_for_resuming(
    tiny_checkpoint, tmp_path, monkeypatch
):
    """They are written to --output-file at once at the end: interrupted, no partial file holds any of them, and the
    same command translates them all again (it said "kept in .news.de.partial; the same command resumes after it")."""
    model_dir, _, _ = tiny_checkpoint
    (tmp_path / "news.de").write_text("an earlier translation\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translation, "translate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_script(
            "translate.py",
            "--model",
            model_dir,
            "a cat.",
            "--output-file",
            tmp_path / "news.de",
            monkeypatch=monkeypatch,
        )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.de"]
    assert (tmp_path / "news.de").read_text() == "an earlier translation\n"


def test_a_reader_that_stops_early_stops_the_translation_quietly(tiny_checkpoint, tmp_path):
    """`translate.py ... | head -1`: no traceback and no error line once the pipe is closed."""
    (tmp_path / "news.en").write_text("the dog sees a red ball.\n" * 40)
    command = [sys.executable, str(SCRIPTS / "translate.py"), "--model", str(tiny_checkpoint[0])]
    command += ["--input-file", str(tmp_path / "news.en"), "--chunk-lines", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    assert process.stdout.readline()
    process.stdout.close()  # as `head -1` does
    stderr = process.communicate(timeout=120)[1].decode()
    assert process.returncode == 1
    assert "Traceback" not in stderr and "error" not in stderr.lower() and "Exception ignored" not in stderr


def test_a_help_whose_reader_is_gone_ends_quietly():
    """`translate.py --help | head -1`: the help was flushed only at exit, "Exception ignored ... BrokenPipeError"
    and exit code 120."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = subprocess_env()
    env.pop("PYTHONUNBUFFERED", None)  # else the write raised at once, within the block
    command = [sys.executable, str(SCRIPTS / "translate.py"), "--help"]
    result = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


class FullDiskFile(io.StringIO):
    """Standard output redirected to a file on a full disk: writes are buffered, and their flush fails."""

    def flush(self) -> None:
        if self.getvalue():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_translations_that_cannot_be_written_to_standard_output_say_so_in_one_line(tiny_checkpoint, monkeypatch):
    """`translate.py ... "sentence" > out.de` on a full disk: the translations were flushed only at exit, whose
    error Python reports as "Exception ignored in: <_io.TextIOWrapper name='<stdout>'>" with exit code 120."""
    monkeypatch.setattr(sys, "stdout", FullDiskFile())
    message = script_error("translate.py", "--model", tiny_checkpoint[0], "a cat.", monkeypatch=monkeypatch)
    assert message == "error: cannot write the translations to standard output: [Errno 28] No space left on device"


@pytest.mark.parametrize("given", ["arguments", "input file"])
def test_translations_that_a_full_disk_refuses_at_once_say_so_in_one_line(
    given, tiny_checkpoint, tmp_path, monkeypatch
):
    """`translate.py --input-file news.en > news.de` on a full disk, or any redirect under PYTHONUNBUFFERED=1 (which
    many Docker images set): the write itself raised, not a later flush, and the message named no file: "error:
    [Errno 28] No space left on device"."""
    (tmp_path / "news.en").write_text("a cat.\nbig ball.\n")
    source = ["a cat."] if given == "arguments" else ["--input-file", tmp_path / "news.en"]
    monkeypatch.setattr(sys, "stdout", FullDisk())
    message = script_error("translate.py", "--model", tiny_checkpoint[0], *source, monkeypatch=monkeypatch)
    assert message == "error: cannot write the translations to standard output: [Errno 28] No space left on device"


def test_a_closed_standard_output_is_refused_in_one_line(tiny_checkpoint, monkeypatch):
    """`translate.py ... >&-`: Python's `sys.stdout` is None, and writing the translations to it was a traceback
    (AttributeError) once they were all done."""
    monkeypatch.setattr(sys, "stdout", None)
    message = script_error("translate.py", "--model", tiny_checkpoint[0], "a cat.", monkeypatch=monkeypatch)
    assert message == "error: standard output is closed, where the translations go: give --output-file"


def test_a_closed_standard_input_is_refused_in_one_line_before_loading(monkeypatch):
    """`translate.py --model M <&-` (a cron job, a service without standard input): Python's `sys.stdin` is None, and
    reading the sentences from it was a traceback (AttributeError) once the model had loaded."""
    monkeypatch.setattr(sys, "stdin", None)
    for source in ([], ["--input-file", "-"]):
        message = script_error("translate.py", "--model", "no/such-model", *source, monkeypatch=monkeypatch)
        assert message == "error: standard input is closed, where the sentences are read from: give --input-file"


class FullDisk(io.StringIO):
    """Standard error redirected to a log file on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_log_that_cannot_be_written_leaves_the_translation_to_finish(tiny_checkpoint, monkeypatch, capsys):
    """`translate.py ... 2> log` with the log on a full disk: transformers' bar of the weights loaded raised, and
    the script ended before translating anything, with an error line that went to the full disk too."""
    monkeypatch.setattr(sys, "stderr", FullDisk())
    run_script("translate.py", "--model", tiny_checkpoint[0], "a cat.", "big ball.", monkeypatch=monkeypatch)
    assert len(capsys.readouterr().out.splitlines()) == 2


# Loads each repo id of argv[1:] (`id` or `id@revision`) and prints what came of it, one JSON line each.
OFFLINE_LOADER = """
import json, sys
from modeling.translation import load_model_and_tokenizer

for name in sys.argv[1:]:
    repo_id, _, revision = name.partition("@")
    try:
        model, tokenizer = load_model_and_tokenizer(repo_id, revision=revision or None)
        print(json.dumps({name: "loaded"}))
    except Exception as error:
        print(json.dumps({name: f"{type(error).__name__}: {error}"}))
"""


def test_offline_a_cache_that_lacks_a_file_of_the_model_is_named_with_the_download_that_fills_it(
    hub, tiny_checkpoint, tmp_path
):
    """A compute node without internet (HF_HUB_OFFLINE=1) loads what a login node downloaded. A download that left
    out the tokenizer failed in FairseqTokenizer's "arg `langs` needs to be a list"; one without the weights blamed
    the repo; one of a pinned revision (no main) could not be loaded at all, or named."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, _ = hub
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    downloads = {  # repo id: what the login node downloaded of it
        "offline/whole": {},
        "offline/no-tokenizer": {"allow_patterns": ["config.json", "generation_config.json", "*.safetensors"]},
        "offline/no-weights": {"allow_patterns": ["*.json"]},
        "offline/pinned": {"revision": "pinned"},
    }
    commits = {}
    for repo_id, options in downloads.items():
        api.create_repo(repo_id, exist_ok=True)
        commits[repo_id] = api.upload_folder(folder_path=tiny_checkpoint[0], repo_id=repo_id).oid
        if options.get("revision"):
            options["revision"] = commits[repo_id]
        snapshot_download(repo_id, cache_dir=tmp_path / "hub", endpoint=endpoint, token=HUB_TOKEN, **options)
    pinned = commits["offline/pinned"]
    env = subprocess_env(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_endpoint())
    names = [*downloads, "offline/never-downloaded", f"offline/pinned@{pinned}"]
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_LOADER, *names], env=env, capture_output=True, text=True, timeout=300
    )
    outcome = {name: text for line in result.stdout.splitlines() for name, text in json.loads(line).items()}
    cache = tmp_path / "hub"
    assert outcome["offline/whole"] == outcome[f"offline/pinned@{pinned}"] == "loaded"
    download = "download it where the Hub can be reached, into the same HF_HOME (hf download {})"
    assert outcome["offline/no-tokenizer"] == (
        f"FileNotFoundError: The Hub cache {cache} holds 'offline/no-tokenizer' without tokenizer.json or "
        "tokenizer_config.json, and offline mode (HF_HUB_OFFLINE) keeps it from the Hub: "
        + download.format("offline/no-tokenizer")
    )
    assert (
        "holds 'offline/no-weights' without model.safetensors or model.safetensors.index.json"
        in (outcome["offline/no-weights"])
    )
    assert outcome["offline/never-downloaded"] == (
        f"FileNotFoundError: 'offline/never-downloaded' is not in the Hub cache {cache}, and offline mode "
        "(HF_HUB_OFFLINE) keeps it from the Hub: " + download.format("offline/never-downloaded")
    )
    assert f"holds 'offline/pinned' at the revisions {pinned} only, not its main" in outcome["offline/pinned"]
    assert "name one as the revision (--revision; train.py: --model_revision)" in outcome["offline/pinned"]

    # Online but unreachable, the tokenizer not cached: the Hub named, not "has no tokenizer".
    unreachable = closed_port_endpoint()
    online = {name: value for name, value in env.items() if name != "HF_HUB_OFFLINE"} | {"HF_ENDPOINT": unreachable}
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_LOADER, "offline/no-tokenizer"], env=online, capture_output=True, text=True
    )
    [(_, message)] = json.loads(result.stdout).items()
    assert message.startswith(f"HubError: Could not load 'offline/no-tokenizer' from the Hub: HEAD {unreachable}/")
    assert message.endswith("(without internet, set HF_HUB_OFFLINE=1 to load from the cache)")

    translated = subprocess.run(
        [sys.executable, str(SCRIPTS / "translate.py"), "--model", "offline/pinned", "--revision", pinned, "a dog."],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert translated.returncode == 0, translated.stderr
    assert len(translated.stdout.splitlines()) == 1


def test_a_revision_is_refused_for_a_local_directory(tiny_checkpoint, monkeypatch):
    error = script_error(
        "translate.py", "--model", tiny_checkpoint[0], "--revision", "v1", "a dog.", monkeypatch=monkeypatch
    )
    assert (
        error
        == f"error: {str(tiny_checkpoint[0])!r} is a local directory: a revision names a version of a Hub repo only."
    )


def test_a_directory_named_like_a_hub_id_says_it_hides_the_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "repo").mkdir(parents=True)
    error = script_error("translate.py", "--model", "owner/repo", "a dog.", monkeypatch=monkeypatch)
    assert error == (
        "error: 'owner/repo' has no config.json: it is not a model saved with save_pretrained (a directory of this "
        "name where the command runs is read instead of the Hub repo of that id: run it elsewhere)."
    )


@pytest.mark.parametrize("source", ["arguments", "stdin"])
def test_translations_reach_standard_output_in_utf8_whatever_its_locale_encoding(source, tiny_checkpoint, monkeypatch):
    """The input is read and --output-file written as UTF-8 whatever the locale: standard output in a locale whose
    encoding lacks a character of a translation (ASCII under PYTHONUTF8=0, Latin-1 and German quotes) ended the
    run in `error: 'ascii' codec can't encode character '\\xdf'`, the chunk translated lost."""
    translated = "die große Straße „heute“"
    monkeypatch.setattr(translation, "translate", lambda model, tokenizer, lines, **_: [translated] * len(lines))
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    arguments = ["a street.", "a big street."] if source == "arguments" else []
    stdin = None if arguments else b"a street.\na big street.\n"
    run_script("translate.py", "--model", tiny_checkpoint[0], *arguments, monkeypatch=monkeypatch, stdin=stdin)
    stdout.flush()
    assert stdout.buffer.getvalue().decode("utf-8") == f"{translated}\n{translated}\n"
