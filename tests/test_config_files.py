"""Tests of modeling/config_files.py: a training config file's values checked against their fields' types, nested
types included, and a file that is no mapping or not YAML refused in one line naming it. The script's handling of
config files (flags over the file, the common wrong types, syntax errors) is tested in
tests/scripts/test_train_script.py."""

import re
import typing

import pytest

from modeling.config_files import read_config_file, value_fits


def _config(tmp_path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("name", "text"), [("run.yaml", "- preset: tiny\n"), ("run.yaml", "tiny\n"), ("run.json", '["tiny"]')]
)
def test_a_file_that_holds_no_mapping_is_refused_naming_it(name, text, tmp_path):
    """A list or a bare word was read as its items' or letters' names, or failed on them as unhashable."""
    path = _config(tmp_path, text, name)
    with pytest.raises(ValueError, match=rf"^{re.escape(path)} must hold a mapping of argument names to values\.$"):
        read_config_file(path)


def test_characters_yaml_cannot_read_are_one_line_naming_the_file(tmp_path):
    path = _config(tmp_path, "preset: tiny\x07\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: invalid YAML: unacceptable character #x0007"):
        read_config_file(path)


def test_mappings_and_literals_are_taken_where_their_fields_allow_them(tmp_path):
    text = (
        "gradient_checkpointing_kwargs: {use_reentrant: false}\n"  # dict[str, Any]
        "liger_kernel_config: {rope: true, swiglu: false}\n"  # dict[str, bool]
        "trackio_static_space_id: false\n"  # str | None | Literal[False]
    )
    assert read_config_file(_config(tmp_path, text)) == {
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "liger_kernel_config": {"rope": True, "swiglu": False},
        "trackio_static_space_id": False,
    }


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "liger_kernel_config: {rope: 1}",
            "liger_kernel_config must be a mapping of strings to booleans or null, got {'rope': 1}",
        ),
        ("liger_kernel_config: 3", "liger_kernel_config must be a mapping of strings to booleans or null, got 3"),
        (
            "gradient_checkpointing_kwargs: {1: true}",
            "gradient_checkpointing_kwargs must be a mapping of strings to values, a string or null, got {1: True}",
        ),
        ("trackio_static_space_id: true", "trackio_static_space_id must be a string, null or false, got True"),
        (
            "debug: [5]",  # a list of another type than str, int, float or bool: its items described
            "debug must be a string or a list of items that are each one of "
            "['underflow_overflow', 'tpu_metrics_debug'], got [5]",
        ),
        ("trackio_static_space_id: 0", "trackio_static_space_id must be a string, null or false, got 0"),
        # A field no file can set (its type is a class): refused by name, not failing on the type's description.
        ("parallelism_config: {}", "parallelism_config must be a ParallelismConfig or null, got {}"),
    ],
)
def test_nested_values_and_literals_of_the_wrong_type_are_refused_naming_the_field(line, message, tmp_path):
    path = _config(tmp_path, f"preset: tiny\n{line}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: {re.escape(message)}$"):
        read_config_file(path)


def test_a_field_that_is_not_an_option_is_an_unknown_argument(tmp_path):
    """`model_commit` (set by the run itself, `init=False`) was taken from a file, and the script then failed with
    "run() takes 3 positional arguments but 4 were given", naming neither the file nor the key."""
    path = _config(tmp_path, "preset: tiny\nmodel_commit: 0123abc\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: unknown arguments \['model_commit'\]\.$"):
        read_config_file(path)


@pytest.mark.parametrize(
    ("text", "where", "character"),
    [("\tpreset: tiny\n", "line 1, column 1", r"'\t'"), ("preset: @tiny\n", "line 1, column 9", "'@'")],
    ids=["a tab indents", "a reserved character"],
)
def test_a_character_that_starts_no_token_is_one_line_naming_the_file(text, where, character, tmp_path):
    # YAML gives this error a context ("while scanning for the next token") without a position of its own.
    path = _config(tmp_path, text)
    message = f"invalid YAML at {where}: found character {character} that cannot start any token"
    with pytest.raises(
        ValueError, match=rf"^{re.escape(path)}: {re.escape(message)} \(while scanning for the next token\)$"
    ):
        read_config_file(path)


def test_a_merge_key_merges_its_mapping_under_the_keys_beside_it(tmp_path):
    """`<<:` failed with "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'", whatever it
    merged: the check for keys given twice built each key, the merge key among them, before PyYAML merged it."""
    path = _config(tmp_path, "<<: {preset: tiny, max_steps: 7}\nmax_steps: 9\n")
    assert read_config_file(path) == {"preset": "tiny", "max_steps": 9}
    # The usual base mapping is a key of its own, which no argument is: refused by its name.
    path = _config(tmp_path, "_base: &base {preset: tiny, max_steps: 7}\n<<: *base\nmax_steps: 9\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: unknown arguments \['_base'\]\.$"):
        read_config_file(path)
    with pytest.raises(ValueError, match=r"'max_steps' is given twice"):  # beside the merge key, still refused
        read_config_file(_config(tmp_path, "<<: {preset: tiny}\nmax_steps: 7\nmax_steps: 9\n"))


@pytest.mark.parametrize(("text", "value"), [("0500", 500), ("1_000", 1000), ("0o10", 8), ("0x10", 16)])
def test_integers_are_the_number_written_not_yaml_1_1s_octal(text, value, tmp_path):
    """YAML 1.1 read a leading zero as octal: `save_steps: 0500` saved every 320 updates."""
    assert read_config_file(_config(tmp_path, f"save_steps: {text}\n")) == {"save_steps": value}


def test_a_time_written_with_a_colon_is_no_number(tmp_path):
    """YAML 1.1 read `10:00` in base 60: a checkpoint every 600 minutes where 10 were meant."""
    path = _config(tmp_path, "save_every_minutes: 10:00\n")
    message = "save_every_minutes must be a number or null, got '10:00'"
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: {re.escape(message)}$"):
        read_config_file(path)


@pytest.mark.parametrize("value", ["$SCRATCH/runs/base", "${SCRATCH}/runs/base"])
def test_a_shell_variable_in_a_value_is_refused_as_no_shell_expands_it(value, tmp_path):
    """`output_dir: $SCRATCH/runs/base` trained into ./$SCRATCH/runs/base, a directory named after the variable under
    the working directory, where the user meant the scratch file system."""
    path = _config(tmp_path, f"output_dir: {value}\n")
    message = f"output_dir {value!r}: no shell expands a variable in a config file; write the value out"
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: {re.escape(message)}"):
        read_config_file(path)
    assert read_config_file(_config(tmp_path, "run_name: costs $5\n")) == {"run_name": "costs $5"}


@pytest.mark.parametrize("value", [None, 3, "f", [1], {"a": 1}])
def test_a_type_the_check_does_not_know_leaves_the_value_to_the_dataclass(value):
    # No field has such a type today: one added later must not refuse every value, nor fail on its type.
    assert value_fits(typing.Callable[[int], int], value)
    assert value_fits(int | typing.Callable[[int], int], value)


def test_a_list_or_a_mapping_without_item_types_takes_any_items():
    assert value_fits(typing.List, [1, "a", None]) and not value_fits(typing.List, "a")  # noqa: UP006
    assert value_fits(typing.Dict, {"a": 1, 2: [3]}) and not value_fits(typing.Dict, [1])  # noqa: UP006


def test_a_config_file_is_read_as_utf8_whatever_the_locale(ascii_locale, tmp_path):
    # YAML and JSON files are UTF-8: read with the locale's encoding, an accent in a path would fail to decode.
    path = _config(tmp_path, "output_dir: runs/café\n")
    assert read_config_file(path) == {"output_dir": "runs/café"}
