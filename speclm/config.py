"""Engine-level configuration: which model, which speculative method, how many draft tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass

SPEC_METHODS_HELP = (
    "ngram | ngram:MAX_N | lookahead[:W,N,G] | layerskip:N | "
    "draft:PATH[,vocab=V,weights=FORMAT,stop=P,branch=T,window=W,sinks=S,lookup=on|off] | "
    "medusa:PATH[,width=W] | eagle:PATH[,topk=T,beam=B,depth=D] (lookahead: Jacobi window W, N-grams, G "
    "candidates, default 5,3,3; draft: prompt lookup where the context repeats itself and the draft model "
    "elsewhere, chosen per step (lookup=off: the draft model only), the draft drafting over the V most "
    "frequent tokens (default 32768; 0 = all), on FORMAT weights (default q4_0: the draft's numerics never "
    "change the output), its chain ended once the product of its top probabilities falls below P (default "
    "0: always K drafts; with a stop K defaults to 8), as a tree with a second branch where its top "
    "probability is below T (default 0: a chain), reading of a prompt longer than S+W tokens only its first S"
    " and its last W (window=W; default window=0: all of it, which kept more drafts accepted; sinks default "
    "4); medusa/eagle: K is the tree's node budget; eagle topk=1 drafts a chain of K)"
)
# draft:PATH options: vocab = size of the draft's output head (0: the whole vocabulary; a distilled draft's
# own token map wins); weights = the draft's runtime format (see WEIGHTS_HELP below). The defaults make the
# cheapest draft of the real pair (measured in docs/speculation.md); the target verifies, so both are exact.
# branch = T in (0, 1): a token tree with the draft's second choice as a leaf where its first has
# probability below T (0: a chain). window = W, sinks = S: the draft reads only the first S and the last W
# tokens of a longer prompt (window 0, the default: all of it; a window lowered acceptance on rag and
# summarization prompts, benchmarks/draft_window/draft_window.md).
# lookup: prompt lookup drafts where it is expected to beat the draft model (speclm/speculative/hybrid.py).
# stop = P in [0, 1): the draft ends its chain once the product of its top probabilities along it (its own
# estimate that every draft so far is accepted) falls below P, so a sure chain runs long and an unsure one
# costs no further draft passes (0, the default: always the K the controller asks for). With a stop the
# default K is DRAFT_STOP_K. Off by default until a served run shows the gain that a simulation predicts
# (benchmarks/draft_stop/README.md).
DRAFT_OPTIONS = {"vocab": 32768, "weights": "q4_0", "stop": 0.0, "branch": 0.0, "window": 0, "sinks": 4, "lookup": True}
DEFAULT_K = 4  # draft tokens per step (the maximum when adaptive) unless --k says otherwise
DRAFT_STOP_K = 8  # ... for a draft model that stops its own chains
# Defaults sized for a CPU, where a verification pass costs more with every row past a few
# (benchmarks/tree_cost.md) and every draft depth costs an output-head matmul.
HEAD_OPTIONS = {"medusa": {"width": 3}, "eagle": {"topk": 2, "beam": 2, "depth": 5}}
# lookahead:W,N,G default: a window of W future positions, N-grams, up to G pool candidates per step.
LOOKAHEAD_SHAPE = (5, 3, 3)


SPEC_MAX_BATCH = 8  # speculation's default batch limit
DRAFT_MODEL_CPU_MAX_BATCH = 1  # draft: on a CPU (SpecConfig.default_max_batch)


@dataclass
class SpecConfig:
    """A parsed --spec value: method 'ngram' (prompt lookup), 'layerskip' (first N target layers as
    the draft), 'draft' (a separate model sharing the tokenizer), or 'medusa' / 'eagle' (draft heads
    on the target's features, a directory written by speclm.speculative.heads.save_head, drafting trees)."""

    method: str
    argument: str | None = None
    num_speculative_tokens: int | None = None  # None: the method's default (max_k)
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "layerskip", "draft", "lookahead", *HEAD_OPTIONS):
            raise ValueError(f"unknown speculative method {self.method!r}; expected {SPEC_METHODS_HELP}")
        if self.num_speculative_tokens is not None and not 1 <= self.num_speculative_tokens <= 32:
            raise ValueError(f"--k must be in 1..32, got {self.num_speculative_tokens}")
        if self.method == "layerskip" and not (self.argument or "").isdigit():
            raise ValueError(f"layerskip needs a layer count, e.g. layerskip:4; got {self.argument!r}")
        if self.method == "draft":
            self.draft_path_and_options()  # validates
        if self.method == "ngram" and self.argument is not None and not self.argument.isdigit():
            raise ValueError(f"ngram takes an optional maximum n, e.g. ngram:4; got {self.argument!r}")
        if self.method in HEAD_OPTIONS:
            self.head_path_and_options()  # validates
        if self.method == "lookahead":
            self.lookahead_shape()  # validates

    def lookahead_shape(self) -> tuple[int, int, int]:
        """For lookahead: (W, N, G), the window, the n-gram size and the candidate n-grams per step."""
        if self.argument is None:
            return LOOKAHEAD_SHAPE
        parts = self.argument.split(",")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"lookahead takes W,N,G (e.g. lookahead:5,3,3); got {self.argument!r}")
        w, n, g = (int(p) for p in parts)
        if not (1 <= w <= 16 and 2 <= n <= 8 and 0 <= g <= 8):
            raise ValueError(f"lookahead needs 1 <= W <= 16, 2 <= N <= 8, 0 <= G <= 8; got {self.argument!r}")
        return w, n, g

    def head_path_and_options(self) -> tuple[str, dict[str, int]]:
        """For medusa/eagle: the head directory and its options (defaults filled in)."""
        path, *items = (self.argument or "").split(",")
        if not path:
            raise ValueError(
                f"{self.method} needs a head directory, e.g. {self.method}:drafters/{self.method}-smollm2-135m"
            )
        options = dict(HEAD_OPTIONS[self.method])
        for item in items:
            key, _, value = item.partition("=")
            if key not in options or not value.isdigit() or int(value) < 1:
                raise ValueError(
                    f"bad {self.method} option {item!r}; expected "
                    + ", ".join(f"{k}=N (N >= 1, default {v})" for k, v in HEAD_OPTIONS[self.method].items())
                )
            options[key] = int(value)
        return path, options

    def draft_path_and_options(self) -> tuple[str, dict]:
        """For draft: the model path and its options (defaults filled in)."""
        path, *items = (self.argument or "").split(",")
        if not path:
            raise ValueError(
                "draft needs a model path, e.g. draft:/path/to/model.gguf[,vocab=32768,weights=q4_0,window=512]"
            )
        options = dict(DRAFT_OPTIONS)
        for item in items:
            key, _, value = item.partition("=")
            if key in ("vocab", "window", "sinks") and value.isdigit():
                options[key] = int(value)
            elif key == "lookup" and value in ("on", "off"):
                options[key] = value == "on"
            elif key == "weights" and value:
                options[key] = WeightFormat.parse(value).label  # ValueError for an unknown format
            elif key in ("branch", "stop") and _is_fraction(value):
                options[key] = float(value)
            else:
                raise ValueError(
                    f"bad draft option {item!r}; expected vocab=N (0 = all tokens), weights=FORMAT, stop=P "
                    "(0 <= P < 1), branch=T (0 <= T < 1), window=N (0 = the whole prompt), sinks=N or lookup=on|off"
                )
        return path, options

    @property
    def max_k(self) -> int:
        """K: draft tokens per step (the maximum when adaptive), as given or the method's default."""
        if self.num_speculative_tokens is not None:
            return self.num_speculative_tokens
        if self.method == "draft":
            options = self.draft_path_and_options()[1]
            if options["stop"] > 0 and not options["branch"]:
                return DRAFT_STOP_K
        return DEFAULT_K

    @classmethod
    def parse(cls, spec: str, num_speculative_tokens: int | None = None, adaptive: bool = True) -> SpecConfig:
        method, _, argument = spec.partition(":")
        return cls(method.strip().lower(), argument or None, num_speculative_tokens, adaptive)

    @property
    def label(self) -> str:
        return self.method if self.argument is None else f"{self.method}:{self.argument}"

    def default_max_batch(self, on_cpu: bool) -> int:
        """The engine's batch limit for speculation (it drafts only in steps with at most this many running
        sequences) unless one is given. A draft model runs its passes sequence by sequence, so on a CPU,
        where a batched target step costs little more than one sequence's, a batch's drafts cost about
        the batch size times one sequence's and stop paying beyond DRAFT_MODEL_CPU_MAX_BATCH sequences
        (benchmarks/spec_max_batch/)."""
        return DRAFT_MODEL_CPU_MAX_BATCH if on_cpu and self.method == "draft" else SPEC_MAX_BATCH


def _is_fraction(value: str) -> bool:
    try:
        return 0.0 <= float(value) < 1.0
    except ValueError:
        return False


EVICTION_POLICIES = ("streaming", "h2o", "snapkv")


def parse_kv_budget(value: str | None) -> int | float | None:
    """A --kv-budget value: a whole number of tokens ("512") or a fraction of the sequence ("0.25")."""
    if value is None:
        return None
    text = value.strip()
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        raise ValueError(
            f"--kv-budget takes tokens (e.g. 512) or a fraction in (0, 1) (e.g. 0.25), got {value!r}"
        ) from None


@dataclass
class CacheConfig:
    """The paged KV cache and the batch it serves: block size, size of the pool, prefix caching,
    and the scheduler's per-step limits. num_blocks None sizes the pool from kv_cache_mb, capped at
    max_num_seqs full-context sequences."""

    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_mb: float = 512.0
    enable_prefix_caching: bool = True
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    kv_cache_dtype: str = "auto"  # "auto" = the model's dtype; "int8" = int8 with a scale per head and token
    streaming_window: int | None = None  # StreamingLLM: tokens of KV kept per sequence (sinks + recent)
    attention_sinks: int = 4  # first tokens always kept (StreamingLLM rounds them up to whole blocks)
    # KV eviction (docs/runtime.md#kv-eviction): "streaming" (= streaming_window), "h2o" or "snapkv",
    # with a per-sequence budget: an int of tokens, or a float fraction in (0, 1) of the sequence's length.
    kv_eviction: str | None = None
    kv_budget: int | float | None = None
    # Sliding-window layers (gemma3's local ones) in a pool of their own that keeps their window only
    # (speclm/kv/hybrid.py); False: they read a whole-length pool through a mask (what memory is compared with).
    sliding_window_pool: bool = True

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise ValueError(f"kv_cache_dtype must be 'auto' or 'int8', got {self.kv_cache_dtype!r}")
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in 1..1024, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not self.kv_cache_mb > 0:
            raise ValueError(f"kv_cache_mb must be > 0, got {self.kv_cache_mb}")
        self._check_eviction()
        if self.streaming_window is not None and self.streaming_window <= self.attention_sinks:
            raise ValueError(
                f"streaming_window ({self.streaming_window}) must exceed attention_sinks ({self.attention_sinks})"
            )
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_seqs and max_num_batched_tokens must be >= 1, "
                f"got {self.max_num_seqs}, {self.max_num_batched_tokens}"
            )

    def _check_eviction(self) -> None:
        budget, policy = self.kv_budget, self.kv_eviction
        if policy is None:
            if budget is not None:
                raise ValueError(f"kv_budget ({budget}) needs a kv_eviction policy ({', '.join(EVICTION_POLICIES)})")
            return
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown kv_eviction policy {policy!r}; expected one of {', '.join(EVICTION_POLICIES)}")
        if budget is None or isinstance(budget, bool) or not isinstance(budget, int | float):
            raise ValueError(
                f"kv_eviction {policy!r} needs a kv_budget (tokens, or a fraction in (0, 1)); got {budget!r}"
            )
        if isinstance(budget, float) and not 0.0 < budget < 1.0:
            raise ValueError(f"a fractional kv_budget must be in (0, 1), got {budget}")
        if isinstance(budget, int) and budget < self.min_kv_budget:
            raise ValueError(
                f"kv_budget must be at least {self.min_kv_budget} tokens (the {self.attention_sinks} attention "
                f"sinks + 4), got {budget}"
            )
        if policy == "streaming":
            if not isinstance(budget, int):
                raise ValueError(f"the streaming policy takes a budget in tokens, got the fraction {budget}")
            if self.streaming_window not in (None, budget):
                raise ValueError(f"streaming_window ({self.streaming_window}) and kv_budget ({budget}) disagree")
            self.streaming_window = budget
        elif self.streaming_window is not None:
            raise ValueError(f"streaming_window is the streaming policy; it does not combine with {policy!r}")

    @property
    def token_eviction(self) -> bool:
        """True for the token-granular policies (H2O, SnapKV), which keep any set of a sequence's tokens."""
        return self.kv_eviction in ("h2o", "snapkv")

    @property
    def min_kv_budget(self) -> int:
        return self.attention_sinks + 4

    def eviction_batch(self, budget: int) -> int:
        """Entries a full sequence drops at once (a block, or less for a small budget): evicting in batches
        leaves room for draft rows between evictions."""
        return max(1, min(self.block_size, (budget - self.attention_sinks - 2) // 2))

    def budget_tokens(self, sequence_tokens: int) -> int:
        """The KV budget, in tokens, of a sequence that may reach `sequence_tokens` tokens (a fraction is
        rounded up and never goes below min_kv_budget)."""
        assert self.kv_budget is not None
        if isinstance(self.kv_budget, float):
            return max(self.min_kv_budget, math.ceil(self.kv_budget * sequence_tokens))
        return self.kv_budget

    def resolve_num_blocks(self, bytes_per_token: int, context_length: int) -> int:
        """Blocks in the pool for a model storing bytes_per_token of keys+values per token."""
        if self.num_blocks is not None:
            return self.num_blocks
        by_memory = int(self.kv_cache_mb * 2**20 // (bytes_per_token * self.block_size))
        by_demand = -(-self.max_num_seqs * context_length // self.block_size)
        return max(1, min(by_memory, by_demand))

    def resolve_hybrid_blocks(
        self, full_bytes_per_token: int, local_bytes_per_token: int, context_length: int, window: int
    ) -> tuple[int, int]:
        """(full, local) blocks of the two pools of a model with sliding-window layers (speclm/kv/hybrid.py).
        A running sequence holds at most its window plus a step's rows in the local pool; the local pool is
        sized for max_num_seqs of those (at most half of kv_cache_mb, never more blocks than the full pool)
        and the full pool gets the rest of kv_cache_mb, or num_blocks when that is given."""
        per_sequence = -(-(window - 1 + self.max_num_batched_tokens) // self.block_size) + 1
        local_demand = self.max_num_seqs * per_sequence
        if self.num_blocks is not None:
            return self.num_blocks, min(self.num_blocks, local_demand)
        budget, block = self.kv_cache_mb * 2**20, self.block_size
        local = max(per_sequence, min(local_demand, int(budget / 2 // (local_bytes_per_token * block))))
        by_memory = int((budget - local * local_bytes_per_token * block) // (full_bytes_per_token * block))
        full = max(1, min(by_memory, -(-self.max_num_seqs * context_length // block)))
        return full, min(full, local)


WEIGHT_FORMATS = ("auto", "fp32", "bf16", "int8", "int4", "q4_0")
HEAD_ONLY_FORMATS = ("w8a8",)  # chosen by head_format, not by users
INT4_GROUP_SIZES = (32, 64, 128, 256)
WEIGHTS_HELP = (
    "auto (a GGUF file's own quantization types; fp32 for other files) | fp32 | bf16 | int8 | int4 | int4:GROUP "
    "(GROUP in 32, 64, 128, 256; default 32) | q4_0 (linear layers re-quantized to GGUF Q4_0 on the same kernels "
    "as auto, an untied output head too; a GGUF's embedding keeps its type: a cheaper draft model)"
)


@dataclass(frozen=True)
class WeightFormat:
    """A parsed --weights value: the format name and, for int4, the quantization group size."""

    name: str = "fp32"
    group_size: int = 32

    def __post_init__(self) -> None:
        if self.name not in WEIGHT_FORMATS + HEAD_ONLY_FORMATS:
            raise ValueError(f"unknown weight format {self.name!r}; expected {WEIGHTS_HELP}")
        if self.group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, got {self.group_size}")

    @classmethod
    def parse(cls, value: str | WeightFormat | None) -> WeightFormat:
        if value is None:
            return cls()
        if isinstance(value, WeightFormat):
            return value
        name, _, group = str(value).strip().lower().partition(":")
        if name in HEAD_ONLY_FORMATS:
            raise ValueError(f"unknown weight format {name!r}; expected {WEIGHTS_HELP}")
        if group and name != "int4":
            raise ValueError(f"only int4 takes a group size (int4:64); got {value!r}")
        if group and not group.isdigit():
            raise ValueError(f"int4 group size must be an integer, got {value!r}")
        return cls(name, int(group) if group else 32)

    @property
    def label(self) -> str:
        return f"int4:{self.group_size}" if self.name == "int4" and self.group_size != 32 else self.name
