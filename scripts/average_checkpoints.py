"""Average the weights of the last N checkpoints of a training run (Vaswani et al. 2017, Sec. 6.1).

    python scripts/average_checkpoints.py --checkpoint-dir runs/base --last 5 --output-dir runs/base/averaged

The paper averaged the last 5 checkpoints of base models and the last 20 of big ones. The output directory loads
with `from_pretrained`, with the configuration, generation config and tokenizer of the newest checkpoint.
"""

import argparse
import sys

from modeling.averaging import average_checkpoints, last_checkpoints
from modeling.cli import positive_int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint-dir", required=True, help="directory holding checkpoint-<step> directories")
    parser.add_argument(
        "--last", type=positive_int, required=True, help="how many of the newest checkpoints to average"
    )
    parser.add_argument("--output-dir", required=True, help="where to write the averaged model")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        checkpoints = last_checkpoints(args.checkpoint_dir, args.last)
        output_dir = average_checkpoints(checkpoints, args.output_dir)
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"Averaged {', '.join(path.name for path in checkpoints)} into {output_dir}")


if __name__ == "__main__":
    main()
