"""Reading a training config file (YAML or JSON) for `scripts/train.py`: its keys are fields of the three
argument groups, each value checked against its field's type before any work.

The values become the parser's defaults, which argparse passes through a field's type only when they are strings:
anything else (`max_steps: 5.5`, `bf16: "true"`) would reach the Trainer unchecked and fail there, after the data
was prepared, without naming the file. A syntax error is one line naming the file, the line and the column.
YAML is read as YAML 1.2: booleans are `true` and `false` only, so YAML 1.1's `yes` / `on` for a boolean field are
refused by name (`bf16: yes` -> "bf16 must be true or false, got 'yes'"), and stay strings elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
import typing
from collections.abc import Hashable
from pathlib import Path

import yaml

from .arguments import DataArguments, ModelArguments, TranslationTrainingArguments

ARGUMENT_GROUPS = (ModelArguments, DataArguments, TranslationTrainingArguments)
# A shell variable, `$NAME` or `${NAME}`, which a config file's value keeps as written.
_VARIABLE = re.compile(r"\$(?:[A-Za-z_]|\{)")


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading as YAML 1.2 does: `1e-9` is a number rather than a string (YAML 1.1), the
    usual way to write a learning rate or an epsilon, and a string would be refused for a float field; only
    `true` and `false` are booleans, so that `eval_strategy: no` and `target_lang: no` (Norwegian) stay strings;
    integers are decimal unless `0o` or `0x` says otherwise, so that YAML 1.1's octal (`save_steps: 0500`, 320) and
    base 60 (`save_every_minutes: 10:00`, 600) do not change the number written.
    A key given twice is an error (PyYAML keeps the last one without a word: an edited copy of a config would
    silently run with the value further down)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: PyYAML merges it below, under the keys here
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):  # a list or a mapping as a key: PyYAML's own error, in one line
                raise yaml.constructor.ConstructorError(None, None, "a key that cannot be a name", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = self.construct_scalar(node).replace("_", "")
        return int(text, 0) if text.lstrip("+-")[:2] in ("0o", "0x") else int(text)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
ConfigLoader.yaml_implicit_resolvers = {  # the loader's own copy, made by the call above
    first: [
        (tag, pattern) for tag, pattern in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")
    ]
    for first, resolvers in ConfigLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*|[-+]?0o[0-7]+|[-+]?0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
ConfigLoader.add_constructor("tag:yaml.org,2002:int", ConfigLoader.construct_yaml_int)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _without_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refusing a key given twice (which `json.loads` would take the last of)."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"{repeated} given twice")
    return dict(pairs)


def load_config_text(path: str, text: str) -> object:
    """The JSON or YAML document in `text`; a syntax error or a key given twice is a one-line ValueError naming the
    file (and the line)."""
    if path.lower().endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=_without_repeated_keys)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: invalid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
            ) from None
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    try:
        return yaml.load(text, Loader=ConfigLoader)
    except yaml.MarkedYAMLError as error:
        mark, problem = error.problem_mark, error.problem or error.context
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = error.context if error.problem else None
        if context and error.context_mark is not None:
            context += f" from line {error.context_mark.line + 1}, column {error.context_mark.column + 1}"
        raise ValueError(f"{path}: invalid YAML{where}: {problem}{f' ({context})' if context else ''}") from None
    except yaml.YAMLError as error:  # unreadable characters, with their position
        raise ValueError(f"{path}: invalid YAML: {' '.join(str(error).split())}") from None


def field_types() -> dict[str, typing.Any]:
    """The type of every option of the three argument groups, by name: not a field the run sets itself
    (`init=False`, such as `model_commit`), which the parser has no option for."""
    return {
        field.name: typing.get_type_hints(group)[field.name]
        for group in ARGUMENT_GROUPS
        for field in dataclasses.fields(group)
        if field.init
    }


def _is_union(hint: typing.Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _members(hint: typing.Any) -> tuple[typing.Any, ...]:
    """The types a union allows. As in HfArgumentParser, `SomeEnum | str` takes the enum's values only: any other
    string would fail later, in the Trainer's arguments, without naming the file."""
    members = typing.get_args(hint)
    if any(isinstance(member, type) and issubclass(member, enum.Enum) for member in members):
        members = tuple(member for member in members if member is not str)
    return members


def value_fits(hint: typing.Any, value: object) -> bool:
    """Whether a field of type `hint` takes a config file's `value` as it is. Neither a bool nor a float is taken
    for an int, so that `max_steps: 5.5` and `max_steps: true` are refused rather than truncated or read as 1."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if _is_union(hint):
        return any(value_fits(member, value) for member in _members(hint))
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin in (list, tuple, set):
        return isinstance(value, list) and (not args or all(value_fits(args[0], item) for item in value))
    if origin is dict:
        return isinstance(value, dict) and (
            not args or all(value_fits(args[0], key) and value_fits(args[1], item) for key, item in value.items())
        )
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return any(value == member.value for member in hint)  # a list or a mapping is no member, nor unhashable
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a type this check does not know: left to the dataclass


def _plural(hint: typing.Any) -> str:
    names = {str: "strings", int: "integers", float: "numbers", bool: "booleans", typing.Any: "values"}
    return names.get(hint) or f"items that are each {describe_type(hint)}"


def describe_type(hint: typing.Any) -> str:
    """`hint` in words: "an integer", "null, a string or a list of strings", "one of ['no', 'steps', 'epoch']"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "null"
    if _is_union(hint):
        # "a boolean or null" rather than "true or false or null"
        words = [("a boolean" if member is bool else describe_type(member)) for member in _members(hint)]
        words = list(dict.fromkeys(words))
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    if origin is typing.Literal:  # as the file would write them: false, "fp16"
        return " or ".join(json.dumps(arg) for arg in args)
    if origin in (list, tuple, set):
        return f"a list of {_plural(args[0])}" if args else "a list"
    if origin is dict or hint is dict:
        keys, values = args or (typing.Any, typing.Any)
        if keys is typing.Any and values is typing.Any:
            return "a mapping"
        return f"a mapping of {_plural(keys)} to {_plural(values)}"
    named = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in named:
        return named[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {[member.value for member in hint]}"
    return f"a {getattr(hint, '__name__', hint)}"


def read_config_file(path: str) -> dict:
    """The keys of a JSON or YAML config file, each a field of one of the three argument groups with a value of
    that field's type (see the module docstring)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:  # a ValueError that would not name the file
        raise ValueError(f"{path}: {error}") from None
    values = load_config_text(path, text) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of argument names to values.")
    known = field_types()
    unknown = sorted(set(values) - set(known), key=str)  # YAML keys may be numbers too
    if unknown:
        raise ValueError(f"{path}: unknown arguments {unknown}.")
    for name, value in values.items():
        if not value_fits(known[name], value):
            raise ValueError(f"{path}: {name} must be {describe_type(known[name])}, got {value!r}")
        if isinstance(value, str) and _VARIABLE.search(value):  # `output_dir: $SCRATCH/runs` ran in ./$SCRATCH/runs
            raise ValueError(
                f"{path}: {name} {value!r}: no shell expands a variable in a config file; write the value out, or "
                "give it as a flag"
            )
    return values
