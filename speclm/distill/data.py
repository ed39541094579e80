"""Target data for drafter training, cached on disk: the target's own greedy responses to prompts
and its features (post-final-norm hidden states) over prompt + response, plus token counts."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from speclm.config import CacheConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from speclm.models.attention import AttentionMetadata
from speclm.sampling_params import SamplingParams

DATA_FILE = "target_data.safetensors"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DataSettings:
    """How the target data is made. chat: wrap prompts in the chat template; prompts longer than
    max_prompt_tokens are skipped (they would dominate the training cost); batch_size: sequences
    the batched engine decodes together."""

    max_new_tokens: int = 128
    max_prompt_tokens: int = 512
    chat: bool = True
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.max_prompt_tokens < 1 or self.batch_size < 1:
            raise ValueError(f"data settings must be positive, got {self}")


@dataclass
class TargetData:
    """Concatenated sequences: tokens [N], features [N, hidden] bf16 (f_t for every position t),
    offsets [S+1] (sequence s is rows offsets[s]:offsets[s+1]), prompt_lengths [S], and
    token_counts [vocab] (how often each token occurs in the responses)."""

    tokens: torch.Tensor
    features: torch.Tensor
    offsets: torch.Tensor
    prompt_lengths: torch.Tensor
    token_counts: torch.Tensor

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(tokens [n], features [n, hidden] fp32, prompt length) of sequence i."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b], self.features[a:b].float(), int(self.prompt_lengths[i])

    def subset(self, indices: list[int]) -> TargetData:
        """The sequences `indices`, in that order, as their own TargetData (token_counts kept whole:
        the token map is chosen from all the data, as the runtime head's is)."""
        rows = [torch.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in indices]
        lengths = torch.tensor([r.numel() for r in rows], dtype=self.offsets.dtype)
        index = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        return TargetData(
            self.tokens[index], self.features[index], offsets, self.prompt_lengths[indices], self.token_counts
        )

    def save(self, path: str, metadata: dict) -> None:
        tensors = {k: v.contiguous() for k, v in asdict(self).items()}
        save_file(tensors, path, metadata={"speclm_distill": json.dumps(metadata)})

    @classmethod
    def load(cls, path: str) -> TargetData:
        t = load_file(path)
        return cls(t["tokens"], t["features"], t["offsets"], t["prompt_lengths"], t["token_counts"])


def split_sequences(num_sequences: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) sequence indices, each ascending: a seeded permutation's first
    round(fraction * S) sequences (at least one when fraction > 0) are held out."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {fraction}")
    held = max(1, round(fraction * num_sequences)) if fraction > 0 else 0
    if held >= num_sequences:
        raise ValueError(f"--val-fraction {fraction} leaves no training sequences out of {num_sequences}")
    order = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[held:]), sorted(order[:held])


def cache_key(model_path: str, weights: str, prompts: list[str], settings: DataSettings) -> str:
    """A hash of everything the data depends on (the model file's size and mtime stand for its bytes)."""
    stat = os.stat(model_path) if os.path.isfile(model_path) else None
    ident = {
        "model": os.path.abspath(model_path),
        "size": stat.st_size if stat else None,
        "mtime": int(stat.st_mtime) if stat else None,
        "weights": weights,
        "prompts": prompts,
        "settings": asdict(settings),
        "version": FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def encode_prompts(llm, prompts: list[str], settings: DataSettings) -> list[list[int]]:
    """Token ids of the prompts that fit max_prompt_tokens (chat template when settings.chat)."""
    if settings.chat and not llm.tokenizer.chat_template:
        raise ValueError("the model's tokenizer has no chat template; make the data with chat=False")
    encoded = [
        llm.tokenizer.encode_chat([{"role": "user", "content": p}]) if settings.chat else llm.tokenizer.encode(p)
        for p in prompts
    ]
    kept = [ids for ids in encoded if len(ids) <= settings.max_prompt_tokens]
    if not kept:
        raise ValueError(f"no prompt fits max_prompt_tokens={settings.max_prompt_tokens}")
    return kept


def generate_responses(llm, prompt_ids: list[list[int]], settings: DataSettings) -> list[list[int]]:
    """The target's greedy responses (EOS included when it stopped there), decoded `batch_size` at a
    time by the engine (a batch reads the weights once per step for all its sequences)."""
    config = CacheConfig(max_num_seqs=settings.batch_size, max_num_batched_tokens=2048)
    engine = Engine(llm.runner, llm.tokenizer, config)
    params = SamplingParams(temperature=0.0, max_tokens=settings.max_new_tokens)
    for ids in prompt_ids:  # the engine trusts its requests: check them all before any is queued
        engine.limits.check_prompt(ids)
    for i, ids in enumerate(prompt_ids):
        engine.add_request(Request(str(i), ids, params))
    responses: list[list[int] | None] = [None] * len(prompt_ids)
    with tqdm(total=len(prompt_ids), desc="target responses", unit="seq") as bar:
        while engine.has_unfinished():
            for out in engine.step():
                if out.output is not None:
                    responses[int(out.request_id)] = out.output.token_ids
                    bar.update(1)
    return responses


def target_features(model, tokens: list[int]) -> torch.Tensor:
    """One target forward over the whole sequence: post-norm hidden states [n, hidden]."""
    n = len(tokens)
    return model(torch.tensor(tokens), torch.arange(n), model.new_cache(n), AttentionMetadata(0, n))


def build_target_data(llm, prompts: list[str], settings: DataSettings) -> TargetData:
    """Generate responses and record features for every prompt that fits (see DataSettings)."""
    prompt_ids = encode_prompts(llm, prompts, settings)
    responses = generate_responses(llm, prompt_ids, settings)
    tokens, features, offsets, prompt_lengths = [], [], [0], []
    counts = torch.zeros(llm.model.config.vocab_size, dtype=torch.long)
    for ids, response in tqdm(list(zip(prompt_ids, responses)), desc="target features", unit="seq"):
        sequence = ids + response
        tokens.append(torch.tensor(sequence))
        features.append(target_features(llm.model, sequence).to(torch.bfloat16))
        offsets.append(offsets[-1] + len(sequence))
        prompt_lengths.append(len(ids))
        counts += torch.bincount(torch.tensor(response, dtype=torch.long), minlength=counts.numel())
    return TargetData(
        torch.cat(tokens), torch.cat(features), torch.tensor(offsets), torch.tensor(prompt_lengths), counts
    )


def load_or_build(
    llm, weights: str, prompts: list[str], settings: DataSettings, cache_dir: str
) -> tuple[TargetData, str]:
    """The cached data for (model, weights, prompts, settings) under cache_dir/KEY/, built on a miss.
    Returns (data, path of the data file)."""
    key = cache_key(llm.model_path, weights, prompts, settings)
    directory = os.path.join(cache_dir, key)
    path = os.path.join(directory, DATA_FILE)
    if os.path.isfile(path):
        return TargetData.load(path), path
    data = build_target_data(llm, prompts, settings)
    os.makedirs(directory, exist_ok=True)
    meta = {"model": llm.model_path, "weights": weights, "num_prompts": len(prompts), "settings": asdict(settings)}
    data.save(path + ".tmp", meta)
    os.replace(path + ".tmp", path)  # a half-written file never looks like a cache hit
    return data, path


def frequent_tokens(counts: torch.Tensor, size: int, always: list[int] = ()) -> torch.Tensor:
    """A token_map: the `size` most frequent token ids by `counts` [vocab] (ties by lower id), with
    the `always` ids (EOS) forced in, sorted ascending."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"token map size must be in 1..{counts.numel()}, got {size}")
    order = torch.sort(counts, descending=True, stable=True).indices.tolist()
    chosen = list(dict.fromkeys(list(always) + order))[:size]
    return torch.tensor(sorted(chosen), dtype=torch.long)
