"""KV cache storage."""

from speclm.kv.cache import KVCache

__all__ = ["KVCache"]
