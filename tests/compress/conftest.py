"""The compression tests' command line on stories260K."""

from speclm.cli import main
from tests.conftest import SPECBENCH, STORIES_MODEL, STORIES_TOKENIZER

# Calibration on Spec-Bench's dev prompts with summarization held out (the text held-out perplexity reads).
CALIBRATION = [
    "--calib-text",
    SPECBENCH,
    "--calib-exclude-categories",
    "summarization",
    "--calib-samples",
    "4",
    "--calib-seq-len",
    "128",
]


def stories_command(command: str, *args: str) -> int:
    """The exit status of `speclm COMMAND --model stories260K --tokenizer (its tokenizer) ARGS`."""
    return main([*command.split(), "--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER, *args])
