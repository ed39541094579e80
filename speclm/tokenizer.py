"""Tokenizers built with the `tokenizers` library from GGUF metadata, tokenizer.json, or llama2.c files;
chat templates; incremental detokenization for streaming."""

from __future__ import annotations

import json
import os
import struct
from datetime import datetime

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

import speclm.models.families as families
from speclm.models.checkpoint import ModelLoadError

SPIECE_UNDERLINE = "\u2581"

# Pre-tokenizer regexes for the GGUF `tokenizer.ggml.pre` values we know (as llama.cpp applies them).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (llama-bpe first: the name llama.cpp's converter writes for Llama 3, which GGUF export picks.)
# o200k's (GPT-4o's, Phi-4-mini's): words keep their leading capitals, contractions attach, "/" ends punctuation.
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt-4o": _GPT4O_SPLIT}
BYTE_LEVEL_PRES = ("gpt2", "smollm", *_SPLIT_BY_PRE)  # GGUF's tokenizer.ggml.pre names speclm rebuilds


RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt")  # (set by the renderer itself)


def check_template_kwargs(template_kwargs: dict | None) -> None:
    """A chat template's variables: string names, none of those the renderer sets (ValueError naming it)."""
    for key in template_kwargs or {}:
        if not isinstance(key, str) or key in RESERVED_TEMPLATE_KWARGS:
            raise ValueError(f"chat_template_kwargs may not set {key!r} (the request's own fields do)")


class Tokenizer:
    """Text <-> token ids, with the model's special tokens and chat template."""

    def __init__(
        self,
        backend: BackendTokenizer,
        bos_token_id: int | None,
        eos_token_ids: list[int],
        add_bos: bool,
        chat_template: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        # SentencePiece models (llama2.c, GGUF "llama"): (pieces, scores, add_space_prefix), kept so that
        # GGUF export can write them back; the backend alone does not keep the scores.
        self.sentencepiece: tuple[list[str], list[float], bool] | None = None

    # -- encoding / decoding -------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; BOS is prepended when the model expects it (or `add_bos` says so).
        The empty string gives [BOS] so generation can start from BOS alone."""
        ids = self.backend.encode(text, add_special_tokens=False).ids if text else []
        want_bos = self.add_bos if add_bos is None else add_bos
        if (want_bos or not ids) and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def added_token_ids(self) -> list[int]:
        """Ids of the tokens added to the base vocabulary: control tokens and chat markers (Qwen's
        <|im_start|>, <|endoftext|>, <tool_call>, its fill-in-the-middle tokens), in id order."""
        return sorted(self.backend.get_added_tokens_decoder())

    # -- chat ---------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> str:
        """Render a conversation with the model's Jinja chat template (as transformers does); `tools`
        (OpenAI tool objects) go to templates that take them (see speclm.structured.tools);
        `template_kwargs` are the template's own variables (Qwen3's enable_thinking: what transformers'
        apply_chat_template takes as keyword arguments, vLLM and llama-server as chat_template_kwargs)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a plain prompt instead of chat mode")
        check_template_kwargs(template_kwargs)
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii
        )
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        special = {
            "bos_token": self._token_text(self.bos_token_id),
            "eos_token": self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
        }
        return env.from_string(self.chat_template).render(
            **(special | (template_kwargs or {})),
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )

    def encode_chat(self, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
        """Token ids of a rendered conversation, ready for the assistant's reply."""
        return self.encode(self.apply_chat_template(messages, template_kwargs=template_kwargs), add_bos=False)

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str) -> Tokenizer:
        """From the `tokenizer.ggml.*` metadata of a GGUF file (gpt2 byte-level BPE or llama SentencePiece)."""
        from speclm.models.gguf_loader import field_value, open_gguf

        reader = open_gguf(path)
        kind = field_value(reader, "tokenizer.ggml.model")
        tokens = field_value(reader, "tokenizer.ggml.tokens")
        if tokens is None:
            raise ModelLoadError(f"{path}: GGUF file has no tokenizer; pass --tokenizer")
        token_types = field_value(reader, "tokenizer.ggml.token_type") or []
        bos = field_value(reader, "tokenizer.ggml.bos_token_id")
        eos = field_value(reader, "tokenizer.ggml.eos_token_id")
        eot = field_value(reader, "tokenizer.ggml.eot_token_id")
        if kind == "gpt2":
            merges = field_value(reader, "tokenizer.ggml.merges") or []
            try:
                backend = byte_level_bpe(
                    tokens, [tuple(m.split(" ", 1)) for m in merges], field_value(reader, "tokenizer.ggml.pre")
                )
            except ValueError as e:
                raise ModelLoadError(f"{path}: {e}") from e
            default_add_bos = False
        elif kind == "llama":
            scores = field_value(reader, "tokenizer.ggml.scores")
            add_space = field_value(reader, "tokenizer.ggml.add_space_prefix", True)
            backend = sentencepiece_bpe(tokens, scores, add_dummy_prefix=add_space)
            default_add_bos = True
        else:
            raise ModelLoadError(f"{path}: unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
        add_special_tokens(backend, tokens, token_types)
        add_bos = field_value(reader, "tokenizer.ggml.add_bos_token", default_add_bos)
        arch = field_value(reader, "general.architecture")
        end_of_generation = [backend.token_to_id(t) for t in families.END_OF_GENERATION_TOKENS]
        eos_ids = list(dict.fromkeys(int(x) for x in (eos, eot, *end_of_generation) if x is not None))
        template = field_value(reader, "tokenizer.chat_template") or families.DEFAULT_CHAT_TEMPLATES.get(arch)
        tokenizer = cls(backend, bos, eos_ids, bool(add_bos), template)
        if kind == "llama":
            tokenizer.sentencepiece = (list(tokens), [float(s) for s in scores], bool(add_space))
        return tokenizer

    @classmethod
    def from_hf_dir(cls, path: str) -> Tokenizer:
        """From tokenizer.json (+ tokenizer_config.json for the chat template and special tokens)."""
        file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(file):
            raise ModelLoadError(f"{path}: no tokenizer.json (pass --tokenizer)")
        backend = BackendTokenizer.from_file(file)
        cfg: dict = {}
        cfg_path = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path) as f:
                cfg = json.load(f)
        model_cfg: dict = {}
        if os.path.exists(os.path.join(path, "config.json")):
            with open(os.path.join(path, "config.json")) as f:
                model_cfg = json.load(f)

        def special_id(key: str) -> int | None:
            tok = cfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            if tok is not None and backend.token_to_id(tok) is not None:
                return backend.token_to_id(tok)
            value = model_cfg.get(f"{key}_id")
            return value[0] if isinstance(value, list) else value

        bos = special_id("bos_token")
        eos = special_id("eos_token")
        eos_ids = model_cfg.get("eos_token_id")
        eos_ids = eos_ids if isinstance(eos_ids, list) else [x for x in (eos, eos_ids) if x is not None]
        # generation_config.json's too: where transformers' generate stops (Phi-3.5-mini's <|end|> is only there)
        generation = os.path.join(path, "generation_config.json")
        if os.path.exists(generation):
            with open(generation) as f:
                more = json.load(f).get("eos_token_id")
            eos_ids = eos_ids + (more if isinstance(more, list) else [more] if more is not None else [])
        probe = backend.encode("a", add_special_tokens=True).ids
        add_bos = cfg.get("add_bos_token", bool(probe) and probe[0] == bos and bos is not None)
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        jinja = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.exists(jinja):
            with open(jinja) as f:
                template = f.read()
        return cls(backend, bos, list(dict.fromkeys(eos_ids)), bool(add_bos), template)

    @classmethod
    def from_llama2c(cls, path: str) -> Tokenizer:
        """From a llama2.c tokenizer.bin: int32 max_len, then per token float32 score, int32 len, bytes."""
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < 4:
            raise ModelLoadError(f"{path}: not a llama2.c tokenizer file")
        offset, tokens, scores = 4, [], []
        try:
            while offset < len(data):
                score, length = struct.unpack_from("<fi", data, offset)
                offset += 8
                tokens.append(data[offset : offset + length].decode("utf-8"))
                scores.append(score)
                offset += length
        except (struct.error, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path}: corrupt llama2.c tokenizer file: {e}") from e
        pieces = [t if t.startswith("<") and t.endswith(">") else t.replace(" ", SPIECE_UNDERLINE) for t in tokens]
        backend = sentencepiece_bpe(pieces, scores, add_dummy_prefix=True)
        types = [3 if i < 3 else 1 for i in range(len(pieces))]  # <unk>, "\n<s>\n", "\n</s>\n"
        add_special_tokens(backend, pieces, types)
        tokenizer = cls(backend, bos_token_id=1, eos_token_ids=[2], add_bos=True)
        tokenizer.sentencepiece = (pieces, scores, True)
        return tokenizer


def byte_level_bpe(tokens: list[str], merges: list[tuple[str, str]], pre: str | None) -> BackendTokenizer:
    """GPT-2 style byte-level BPE; `pre` is GGUF's pre-tokenizer name (smollm splits digits)."""
    backend = BackendTokenizer(
        models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False, ignore_merges=False)
    )
    if pre in _SPLIT_BY_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_BY_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    elif pre in (None, "gpt2"):
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # (GPT-2's split instead would encode the model's text into pieces it was not trained on)
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r} (supported: {', '.join(BYTE_LEVEL_PRES)})")
    backend.decoder = decoders.ByteLevel()
    return backend


def sentencepiece_bpe(pieces: list[str], scores: list[float], add_dummy_prefix: bool) -> BackendTokenizer:
    """SentencePiece-style BPE with byte fallback; merge priority follows the merged piece's score."""
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for piece, score in zip(pieces, scores):
        if len(piece) < 2 or (piece.startswith("<") and piece.endswith(">")):
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((score, vocab[piece], left, right))
    merges.sort(key=lambda m: (-m[0], m[1]))
    backend = BackendTokenizer(
        models.BPE(vocab, [(a, b) for _, _, a, b in merges], unk_token=pieces[0], fuse_unk=True, byte_fallback=True)
    )
    steps = [normalizers.Replace(" ", SPIECE_UNDERLINE)]
    if add_dummy_prefix:
        steps.insert(0, normalizers.Prepend(SPIECE_UNDERLINE))
    backend.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace(SPIECE_UNDERLINE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_dummy_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(dec)
    return backend


def add_special_tokens(backend: BackendTokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens (type 3) become special tokens, user-defined ones (type 4) added tokens, so the
    text of e.g. `<|im_start|>` maps to its single id."""
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, token_types) if k == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, token_types) if k == 4]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def load_tokenizer(model_path: str, tokenizer_path: str | None = None) -> Tokenizer:
    """The tokenizer for a model: an explicit --tokenizer, else the one inside/next to the model."""
    source = tokenizer_path or model_path
    if not os.path.exists(source):
        raise ModelLoadError(f"tokenizer file not found: {source}")
    if os.path.isdir(source):
        return Tokenizer.from_hf_dir(source)
    if source.endswith(".json"):
        return Tokenizer.from_hf_dir(os.path.dirname(source) or ".")
    with open(source, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return Tokenizer.from_gguf(source)
    if tokenizer_path is None:
        sibling = os.path.join(os.path.dirname(model_path), "tokenizer.bin")
        if source.endswith(".bin") and os.path.exists(sibling):
            return Tokenizer.from_llama2c(sibling)
        raise ModelLoadError(f"{model_path}: a llama2.c checkpoint needs --tokenizer (e.g. tok512.bin)")
    return Tokenizer.from_llama2c(source)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting multi-byte characters."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        # A few prompt tokens of context keep leading-space handling the same as a full decode.
        self.prefix_offset = max(len(self.ids) - 5, 0)
        self.read_offset = len(self.ids)

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the text they complete (may be '' while a character is incomplete)."""
        self.ids.extend(token_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""
