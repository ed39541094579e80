"""Architecture hyper-parameters of a llama-family decoder, independent of the file format."""

from __future__ import annotations

from dataclasses import dataclass, field

import speclm.models.families as families

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", *families.FAMILY_ARCHITECTURES)


@dataclass
class ModelConfig:
    """Everything the forward pass needs to know about a llama-family model."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    rotary_dim: int = 0  # the leading dims of each head that rotary turns (partial rotary, phi3); 0 means head_dim
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qwen2 has biases on q/k/v
    attention_output_bias: bool = False  # llama's attention_bias=True also puts one on o_proj
    bos_token_id: int | None = 1
    eos_token_ids: list[int] = field(default_factory=lambda: [2])
    # The newer families' quirks (speclm/models/families.py); the defaults are the llama block.
    qk_norm: bool = False  # per-head RMSNorm on q and k before rotary (qwen3, gemma3)
    sandwich_norms: bool = False  # a norm after attention and after the MLP too, 4 per layer (gemma3)
    hidden_act: str = "silu"  # silu (SwiGLU) | gelu_pytorch_tanh (GeGLU)
    embedding_scale: float = 1.0  # the embedding lookup times this (gemma3: sqrt(hidden))
    attention_scale: float | None = None  # None: head_dim ** -0.5
    sliding_window: int | None = None  # keys a local layer sees (itself included), with layer_types
    layer_types: list[str] | None = None  # per layer "sliding_attention" | "full_attention"; None: all full
    rope_local_theta: float | None = None  # the local layers' rope base (gemma3), without rope_scaling
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    norms_add_one: bool = False  # a HF file's norms hold weight - 1 (gemma): the loader adds the 1

    @property
    def is_variant(self) -> bool:
        """Whether the layers need speclm/models/variants.py (anything the llama block does not do)."""
        return self.qk_norm or self.sandwich_norms or self.hidden_act != "silu" or bool(self.layer_types)

    def is_local(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window."""
        local = bool(self.layer_types) and self.sliding_window is not None
        return local and self.layer_types[layer] == "sliding_attention"

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; speclm supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.rotary_dim == 0:
            self.rotary_dim = self.head_dim
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} must be even and at most head_dim={self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

    def to_hf_dict(self) -> dict:
        """The config.json Hugging Face transformers expects for this architecture."""
        arch_class = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
        arch_class |= {arch: name for name, arch in families.HF_CLASSES.items()}
        d = {
            "architectures": [arch_class[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids,
            "torch_dtype": "float32",
        }
        if self.architecture == "llama":
            d["attention_bias"] = self.attention_bias
        return d | families.hf_dict_extras(self)

    @classmethod
    def from_hf_dict(cls, d: dict) -> ModelConfig:
        """Read a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and the
        families of families.py)."""
        archs = d.get("architectures") or []
        by_class = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
        by_class |= families.HF_CLASSES
        arch = next((by_class[a] for a in archs if a in by_class), None) or d.get("model_type", "")
        arch = families.HF_MODEL_TYPES.get(arch, arch)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs or d.get('model_type')!r}; speclm loads {', '.join(by_class)}"
            )
        eos = d.get("eos_token_id", 2)
        num_heads = d["num_attention_heads"]
        rope_theta = d.get("rope_theta")
        rope_scaling = d.get("rope_scaling")
        rope_parameters = d.get("rope_parameters")  # transformers >= 5 nests theta and scaling here
        if isinstance(rope_parameters, dict):
            rope_theta = rope_theta or rope_parameters.get("rope_theta")
            if rope_parameters.get("rope_type", "default") != "default":
                rope_scaling = rope_scaling or rope_parameters
        max_positions = d.get("max_position_embeddings", 2048)
        window = d.get("sliding_window")
        if arch in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
            window = None  # qwen2 configs carry a window they do not use
        if window and window < max_positions and arch != "gemma3":  # (gemma3's local layers run their window)
            # We attend to the whole context; past the window that would differ from the model, so
            # the usable context is the window.
            max_positions = window
        extras = families.hf_extras(arch, d)
        fields = dict(
            architecture=arch,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta or 10000.0,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=arch == "qwen2" or d.get("attention_bias", False),
            attention_output_bias=arch != "qwen2" and bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=list(eos) if isinstance(eos, list) else ([eos] if eos is not None else []),
        )
        return cls(**(fields | extras))
