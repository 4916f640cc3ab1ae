"""Train the Transformer with the recipe of Vaswani et al. (2017), or fine-tune one (see modeling/training.py).

    python scripts/train.py --preset tiny --data-dir ../shared/data/multi30k --source-lang en --target-lang de \\
        --output-dir runs/tiny
    python scripts/train.py configs/train/base_en_de.yaml
    accelerate launch --config_file configs/accelerate/8gpu_bf16.yaml scripts/train.py configs/train/base_en_de.yaml
    python scripts/train.py configs/train/base_en_de.yaml  # again, with resume_from_checkpoint: last in the file

Every `Seq2SeqTrainingArguments` flag works (`--max_steps`, `--save_steps`, `--bf16`, ...), with dashes or
underscores. The preset supplies the defaults of the paper's recipe; flags, or keys of the JSON / YAML file given as
the only argument, override them.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from modeling.presets import get_preset
from modeling.training import train

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def parse(argv: list[str]) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments]:
    parser = HfArgumentParser((ModelArguments, DataArguments, TranslationTrainingArguments))
    if len(argv) == 1 and argv[0].endswith(CONFIG_SUFFIXES):
        text = Path(argv[0]).read_text(encoding="utf-8")
        values = json.loads(text) if argv[0].endswith(".json") else yaml.safe_load(text)
        preset = get_preset(values.get("preset", ModelArguments.preset))
        return parser.parse_dict({**preset.training_defaults(), **values})
    preset_parser = argparse.ArgumentParser(add_help=False)
    preset_parser.add_argument("--preset", default=ModelArguments.preset)
    parser.set_defaults(**get_preset(preset_parser.parse_known_args(argv)[0].preset).training_defaults())
    return parser.parse_args_into_dataclasses(argv)


def main() -> None:
    model_args, data_args, training_args = parse(sys.argv[1:])
    level = logging.INFO if training_args.should_log else logging.WARNING  # the main process tells the story
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    output_dir = train(model_args, data_args, training_args)
    logging.getLogger("train").info("Model, tokenizer and generation config saved to %s", output_dir)


if __name__ == "__main__":
    main()
