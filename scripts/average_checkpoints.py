"""Average the weights of the last N checkpoints of a training run (Vaswani et al. 2017, Sec. 6.1).

    python scripts/average_checkpoints.py --checkpoint-dir runs/base --last 5 --output-dir runs/base/averaged
    python scripts/average_checkpoints.py --checkpoints runs/base/checkpoint-{9000,9500,10000} --output-dir avg

The paper averaged the last 5 checkpoints of base models and the last 20 of big ones. The output directory loads
with `from_pretrained`, with the configuration, generation config and tokenizer of the newest checkpoint. `--last N`
refuses a run whose N newest checkpoints on disk are not its N last saves (an old best checkpoint that
`save_total_limit`'s rotation kept, the saves after it deleted); `--checkpoints` averages the ones named.
"""

import argparse
import sys

from modeling.averaging import average_checkpoints, last_checkpoints, named_checkpoints
from modeling.checkpoints import check_outside_live_checkpoints
from modeling.cli import positive_int, reporting_on_stdout, summary


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--checkpoint-dir", help="directory holding checkpoint-<step> directories (with --last)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=positive_int, help="how many of the newest checkpoints to average")
    which.add_argument("--checkpoints", nargs="+", metavar="DIR", help="the checkpoint directories to average")
    parser.add_argument("--output-dir", required=True, help="where to write the averaged model")
    args = parser.parse_args()
    if (args.last is None) != (args.checkpoint_dir is None):
        parser.error("--checkpoint-dir goes with --last (and --checkpoints names the directories itself)")
    return args


def main() -> None:
    args = parse_args()
    try:
        check_outside_live_checkpoints(args.output_dir, "--output-dir")
        if args.checkpoints is None:
            checkpoints = last_checkpoints(args.checkpoint_dir, args.last)
        else:
            checkpoints = named_checkpoints(args.checkpoints)
        output_dir = average_checkpoints(checkpoints, args.output_dir)
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"Averaged {', '.join(path.name for path in checkpoints)} into {output_dir}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
