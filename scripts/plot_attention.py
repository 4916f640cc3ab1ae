"""Heatmaps of encoder self-, decoder self- and cross-attention for one sentence pair.

    python scripts/plot_attention.py --model runs/base_en_de/averaged --source "The house is small." \\
        --target "Das Haus ist klein." --layer all --head mean --output attention.png

Without `--target`, the model's own translation of the source is used. The model is loaded with eager
attention, the only implementation that returns attention weights.
"""

import argparse
import sys

from modeling.attention import ATTENTION_KINDS, attention_maps, figure_format, plot_attention_maps
from modeling.checkpoints import check_outside_live_checkpoints
from modeling.cli import add_model_arguments, reporting_on_stdout, summary
from modeling.files import check_writable
from modeling.translation import load_model_and_tokenizer


def layer_or_all(value: str) -> int | None:
    return None if value == "all" else int(value)


def head_or_mean(value: str) -> int | None:
    return None if value == "mean" else int(value)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--source", required=True, help="source sentence")
    parser.add_argument("--target", help="target sentence (default: the model's translation)")
    parser.add_argument("--layer", type=layer_or_all, default=None, help="layer index, or 'all' (default)")
    parser.add_argument("--head", type=head_or_mean, default=None, help="head index, or 'mean' (default)")
    parser.add_argument(
        "--kinds", nargs="+", choices=list(ATTENTION_KINDS), default=list(ATTENTION_KINDS), help="which attentions"
    )
    parser.add_argument("--output", default="attention.png", help="PNG to write")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        figure_format(args.output)  # before check_writable, whose refusal of a .gz name speaks of plain text
        check_outside_live_checkpoints(args.output, "--output")  # first: check_writable creates missing folders
        check_writable(args.output)  # a directory there: named as such, not the temporary file's rename refused
        model, tokenizer = load_model_and_tokenizer(args.model, revision=args.revision, attn_implementation="eager")
        maps = attention_maps(model, tokenizer, args.source, args.target)
        path = plot_attention_maps(maps, args.output, layer=args.layer, head=args.head, kinds=args.kinds)
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    target = args.target
    if target is None:  # the translation the maps are of, as translate.py prints it
        target = tokenizer.decode(tokenizer.convert_tokens_to_ids(maps.target_tokens), skip_special_tokens=True)
    print(f"target: {target.strip()}")
    print(f"Wrote {path}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
