"""Step 3 of the draft fine-tuning experiment: write a draft (a Hugging Face directory or a GGUF file) as a
Q8_0 GGUF with the stock draft's tokenizer, so the stock and the fine-tuned draft reach the engine through
the same loader and the same runtime re-quantization (draft:PATH's weights=q4_0)."""

import argparse

from speclm.compress.gguf_export import export_gguf
from speclm.models.loader import load_checkpoint
from speclm.tokenizer import load_tokenizer

parser = argparse.ArgumentParser()
parser.add_argument("source")
parser.add_argument("out")
parser.add_argument("--tokenizer-from", required=True, help="the stock draft GGUF")
args = parser.parse_args()
export_gguf(load_checkpoint(args.source), load_tokenizer(args.tokenizer_from), args.out, "Q8_0")
print("wrote", args.out)
