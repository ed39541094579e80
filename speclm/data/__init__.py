"""Data shipped with speclm: the Spec-Bench dev prompts (Apache-2.0, see LICENSE.spec-bench), speclm's own
coding prompts, and reading Spec-Bench style prompt files."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# 240 of the 480 Spec-Bench questions: fields question_id, category, turns (benchmarks and drafter training).
SPECBENCH_PROMPTS = str(Path(__file__).with_name("specbench_dev.jsonl"))
# 16 coding requests written for speclm's benchmarks (same fields; category "code"), part of speclm's sources.
CODING_PROMPTS = str(Path(__file__).with_name("coding_prompts.jsonl"))


def load_prompts(path: str, per_category: int | None = None, categories: list[str] | None = None) -> list[dict]:
    """First turns, keeping at most `per_category` prompts of each category (file order). `path` may
    name several files, comma-separated ("code" from one, Spec-Bench's categories from another); a file
    may hold none of the categories, but each category asked for must be in one of them."""
    prompts = [p for one in path.split(",") for p in _load_file(one, per_category, categories)]
    missing = sorted(set(categories or ()) - {p["category"] for p in prompts})
    if missing:
        raise ValueError(f"{path}: no prompts of category {', '.join(missing)}")
    if not prompts:
        raise ValueError(f"{path}: no prompts selected")
    return prompts


def _load_file(path: str, per_category: int | None, categories: list[str] | None) -> list[dict]:
    taken: dict[str, int] = defaultdict(int)
    prompts = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                category, text = row["category"], row["turns"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a Spec-Bench prompt line ({e})") from e
            if categories and category not in categories:
                continue
            if per_category is not None and taken[category] >= per_category:
                continue
            taken[category] += 1
            prompts.append({"id": row.get("question_id", line_no), "category": category, "text": text})
    return prompts
