"""Export a saved or Hub model to a deployment runtime: CTranslate2, MarianMT or ONNX.

    python scripts/export.py --model runs/base_en_de/averaged --to ctranslate2 --output-dir deploy/ct2
    python scripts/export.py --model runs/base_en_de/averaged --to ctranslate2 --quantization int8 --output-dir int8
    python scripts/export.py --model you/transformer-base --to marian --output-dir deploy/marian
    python scripts/export.py --model runs/base_en_de/averaged --to onnx --output-dir deploy/onnx

The directory appears whole or not at all, and replaces only a previous export. CTranslate2 cannot express the
paper's GNMT length penalty or its per-sentence limit (source + 50): the export's export.json lists what differs.
"""

import argparse
import sys

from modeling.cli import add_model_arguments, reporting_on_stdout, summary
from modeling.export import CTRANSLATE2_QUANTIZATIONS, FORMATS, export
from modeling.translation import load_model_and_tokenizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--to", required=True, choices=FORMATS, help="the runtime to export to")
    parser.add_argument("--output-dir", required=True, help="directory to write (a previous export is replaced)")
    parser.add_argument(
        "--quantization",
        choices=CTRANSLATE2_QUANTIZATIONS,
        help="CTranslate2 only: quantise the weights once (default: float32, quantisable when loading)",
    )
    args = parser.parse_args()
    if args.quantization and args.to != "ctranslate2":
        parser.error(f"--quantization applies to --to ctranslate2, not --to {args.to}")
    return args


def main() -> None:
    args = parse_args()
    options = {"quantization": args.quantization} if args.quantization else {}
    try:
        model, tokenizer = load_model_and_tokenizer(args.model, revision=args.revision, device="cpu")
    except (ImportError, OSError, ValueError) as error:  # a fairseq tokenizer without sacremoses: named
        sys.exit(f"error: {error}")
    try:
        output_dir = export(model, tokenizer, args.output_dir, to=args.to, **options)
    except ImportError as error:
        sys.exit(f"error: {error} (pip install 'vaswani-transformer[deploy]')")
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {output_dir}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
