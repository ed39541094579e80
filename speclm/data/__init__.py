"""Data shipped with speclm: the Spec-Bench dev prompts (Apache-2.0, see LICENSE.spec-bench)."""
from __future__ import annotations

from pathlib import Path

# 240 of the 480 Spec-Bench questions: fields question_id, category, turns (benchmarks and drafter training).
SPECBENCH_PROMPTS = str(Path(__file__).with_name("specbench_dev.jsonl"))
