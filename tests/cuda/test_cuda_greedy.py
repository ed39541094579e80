"""Greedy output on the GPU equals the CPU's fp32 path (stories260K, random llama and qwen2 checkpoints),
and the GPU forward matches transformers on the same GPU."""

from __future__ import annotations

import pytest
import torch

from speclm import SamplingParams
from speclm.models.attention import AttentionMetadata
from tests.conftest import STORIES_TOKENIZER
from tests.cuda.conftest import DEVICE, PROMPTS, needs_cuda

pytestmark = needs_cuda

GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)


def outputs(llm, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, params)]


def test_stories_gpu_fp32_greedy_equals_cpu(stories_cpu, stories_gpu_fp32):
    assert stories_gpu_fp32.model.device.type == torch.device(DEVICE).type
    assert stories_gpu_fp32.model.norm.weight.dtype == torch.float32
    assert outputs(stories_gpu_fp32) == outputs(stories_cpu)


def test_stories_gpu_half_precision_follows_the_cpu(stories_cpu, stories_gpu):
    """bf16 is not fp32: its greedy choices, teacher-forced on the CPU's output, agree nearly everywhere."""
    assert stories_gpu.model.norm.weight.dtype in (torch.bfloat16, torch.float16)
    agree = total = 0
    for ids, prompt in zip(outputs(stories_cpu), PROMPTS):
        seq = stories_cpu.encode(prompt) + ids
        cpu = teacher_forced_logits(stories_cpu.model, seq).argmax(-1)
        gpu = teacher_forced_logits(stories_gpu.model, seq).argmax(-1)
        agree += int((cpu == gpu).sum())
        total += len(seq)
    assert agree >= 0.95 * total, f"{agree}/{total}"


def teacher_forced_logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(len(ids))
    device = model.device
    n = len(ids)
    hidden = model(torch.tensor(ids, device=device), torch.arange(n, device=device), cache, AttentionMetadata(0, n))
    return model.compute_logits(hidden)  # on the host


def decode_logits(model, ids: list[int], prompt: int) -> torch.Tensor:
    """Prefill `prompt` tokens, then one token at a time: logits of every position, [len(ids), vocab]."""
    cache, device, out = model.new_cache(len(ids)), model.device, []
    for start, end in [(0, prompt)] + [(i, i + 1) for i in range(prompt, len(ids))]:
        tokens = torch.tensor(ids[start:end], device=device)
        hidden = model(tokens, torch.arange(start, end, device=device), cache, AttentionMetadata(start, end - start))
        cache.truncate(end)
        out.append(model.compute_logits(hidden))
    return torch.cat(out)


@pytest.fixture(scope="module", params=["LlamaConfig", "Qwen2Config"])
def tiny_dir(request, tmp_path_factory):
    """A random checkpoint of each family, vocabulary 512 so stories260K's tokenizer serves it."""
    transformers = pytest.importorskip("transformers")
    from tests.models.hf_tiny import tiny_hf_model

    model = tiny_hf_model(getattr(transformers, request.param), seed=3, vocab_size=512)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return str(path), model


def test_random_checkpoint_gpu_forward_matches_transformers_on_gpu(tiny_dir):
    from speclm.models.builder import build_model
    from speclm.models.loader import load_checkpoint

    path, hf = tiny_dir
    ours = build_model(load_checkpoint(path), weights="fp32", device=DEVICE)
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = hf.to(DEVICE)(torch.tensor([ids], device=DEVICE)).logits[0].float().cpu()
    hf.to("cpu")
    got = decode_logits(ours, ids, 12)
    assert (got - expected).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_random_checkpoint_gpu_greedy_equals_cpu(tiny_dir):
    from speclm import LLM

    path, _ = tiny_dir
    cpu = LLM(path, tokenizer=STORIES_TOKENIZER, device="cpu", weights="fp32")
    gpu = LLM(path, tokenizer=STORIES_TOKENIZER, device=DEVICE, weights="fp32")
    prompts = [[1, 5, 9, 200, 3], [1, 44, 44, 44, 44, 44], [1]]
    assert outputs(gpu, prompts) == outputs(cpu, prompts)
    half = LLM(path, tokenizer=STORIES_TOKENIZER, device=DEVICE)
    assert len(outputs(half, prompts)[0]) == GREEDY.max_tokens


def test_cpu_only_formats_are_refused_on_the_gpu(stories_gpu):
    from speclm import LLM
    from tests.conftest import STORIES_MODEL

    for weights in ("int8", "int4", "q4_0"):
        with pytest.raises(ValueError, match="CPU only"):
            LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, device=DEVICE, weights=weights)
