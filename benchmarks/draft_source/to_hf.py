"""Write a GGUF draft's weights (dequantized, fp32) as a Hugging Face directory, for comparing the same
draft read from either kind of file: python benchmarks/draft_source/to_hf.py DRAFT.gguf OUT_DIR"""

import sys

from speclm.compress.save import save_checkpoint
from speclm.models.loader import load_checkpoint
from speclm.tokenizer import load_tokenizer

source, out = sys.argv[1:3]
checkpoint = load_checkpoint(source)
save_checkpoint(out, checkpoint.config, dict(checkpoint.tensors), load_tokenizer(source))
print("wrote", out)
