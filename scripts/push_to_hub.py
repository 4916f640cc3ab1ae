"""Push a saved model directory to the Hugging Face Hub, with a model card built from measured results.

    python scripts/push_to_hub.py --model runs/base_en_de/averaged --repo-id you/transformer-base-wmt14-en-de \\
        --card-from runs/base_en_de/eval --card-from runs/base_en_de [--private]

`--card-from` directories are searched for `eval_results_*.json` (scripts/evaluate.py), `trainer_state.json`,
`training_args.json` and `data_stats.json`; the card (README.md) and `training_curves.png` are written into the
model directory, then pushed with it. Without `--card-from`, an existing README.md is kept as it is (a run
that saves a new final model removes the card of its earlier one).
The token comes from HF_TOKEN or `hf auth login`, never from the command line (shell history, `ps`).
"""

import argparse
import sys
from pathlib import Path

from modeling.checkpoints import training_run_in
from modeling.cli import reporting_on_stdout, summary
from modeling.files import sole_writer
from modeling.hub import MissingHubTokenError, check_model_dir, full_repo_id, push_model_dir, resolve_token
from modeling.model_card import write_model_card


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--model", required=True, help="directory written by save_pretrained (model + tokenizer)")
    parser.add_argument("--repo-id", required=True, help="Hub repo to create or update, e.g. you/transformer-base")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument(
        "--card-from",
        action="append",
        default=[],
        metavar="DIR",
        help="directory with evaluation / training outputs for the model card (repeatable)",
    )
    parser.add_argument(
        "--template", default=None, help="model card template (default: modeling/templates/model_card.md)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        token = resolve_token()
        # Before anything is written: a card naming a bad id, or one without its namespace, would stay behind
        repo_id = full_repo_id(args.repo_id, token)
        with sole_writer(args.model):  # what is checked and described is what is uploaded: no average replaces it
            if holder := training_run_in(args.model):  # its final save, file by file, would mix two models
                raise ValueError(
                    f"{args.model} is in use by a training run ({holder}), which saves its final model there when "
                    "it ends: push it once the run has ended, or push one of its checkpoints"
                )
            check_model_dir(args.model)
            if args.card_from or not (Path(args.model) / "README.md").is_file():
                card = write_model_card(
                    args.model, repo_id=repo_id, card_from=args.card_from, template_path=args.template
                )
                print(f"Wrote the model card {card}")
            # check_model_dir read every weight and JSON file above, even with the README kept as it is
            url = push_model_dir(args.model, repo_id, token=token, private=args.private, verify=False)
    except (MissingHubTokenError, OSError, ValueError) as error:  # OSError includes Hub HTTP errors
        sys.exit(f"error: {error}")
    print(f"Pushed {args.model} to {url}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
