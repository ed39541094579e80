"""Greedy output on the GPU equals the CPU's fp32 path (stories260K, a random checkpoint of each family),
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


# Each family with its quirks on (head_dim 32, a power of two as in the real models, != hidden / heads):
# gemma3's window of 8 is passed by the 40-token runs; phi3 as Phi-4-mini (12 of 16 dims turn, LongRoPE's
# long factors past an original context of 16, tied embeddings).
GEMMA3 = dict(
    head_dim=32,
    sliding_window=8,
    query_pre_attn_scalar=20,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)
PHI4_MINI = dict(
    original_max_position_embeddings=16,
    partial_rotary_factor=0.75,
    rope_scaling={
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(6)],
        "long_factor": [1.5 + 0.7 * i for i in range(6)],
    },
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "gemma3": ("Gemma3TextConfig", GEMMA3),
    "phi3": ("Phi3Config", PHI4_MINI),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny_dir(request, tmp_path_factory):
    """A random checkpoint of each family, vocabulary 512 so stories260K's tokenizer serves it."""
    transformers = pytest.importorskip("transformers")
    from tests.models.hf_tiny import tiny_hf_model

    config, overrides = FAMILIES[request.param]
    model = tiny_hf_model(getattr(transformers, config), seed=3, **overrides, vocab_size=512)
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
