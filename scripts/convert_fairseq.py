"""Convert a fairseq Transformer (a published WMT model, or your own) into a model directory of this project.

    python scripts/convert_fairseq.py --checkpoint wmt16.en-de.joined-dict.transformer/model.pt \\
        --data-bin wmt16.en-de.joined-dict.transformer --source-lang en --target-lang de \\
        --bpe-codes wmt16.en-de.joined-dict.transformer/bpecodes --output-dir models/wmt16-en-de

--data-bin holds fairseq's dictionaries (dict.en.txt, dict.de.txt). The directory written (whole or not at all;
only a previous conversion is replaced) loads with `from_pretrained`, translates as fairseq-interactive with
`--tokenizer moses --bpe subword_nmt --beam 4 --lenpen 0.6` does, and pushes with scripts/push_to_hub.py.
--bpe-codes defaults to DATA_BIN/bpecodes (where the published archives keep them); with --pretokenized instead,
inputs must be Moses-tokenised and BPE-split already, and outputs stay tokenised.
The tokenizer needs sacremoses (pip install "vaswani-transformer[fairseq]"); fairseq itself is not needed.
"""

import argparse
import sys

from modeling.cli import reporting_on_stdout, summary
from modeling.fairseq import convert_fairseq


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--checkpoint", required=True, help="fairseq checkpoint, e.g. model.pt of a published archive")
    parser.add_argument("--data-bin", required=True, help="folder with dict.SRC.txt and dict.TGT.txt")
    parser.add_argument("--source-lang", required=True)
    parser.add_argument("--target-lang", required=True)
    parser.add_argument("--bpe-codes", help="subword-nmt codes (default: DATA_BIN/bpecodes)")
    parser.add_argument(
        "--pretokenized", action="store_true", help="no BPE codes: inputs already Moses-tokenised and BPE-split"
    )
    parser.add_argument("--output-dir", required=True, help="the model directory to write")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        output_dir = convert_fairseq(
            args.checkpoint,
            args.data_bin,
            args.output_dir,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            bpe_codes=args.bpe_codes,
            pretokenized=args.pretokenized,
        )
    except ImportError as error:  # sacremoses, which the tokenizer needs
        sys.exit(f"error: {error} (pip install sacremoses, or 'vaswani-transformer[fairseq]')")
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {output_dir}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
