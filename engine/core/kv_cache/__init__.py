"""Paged KV cache: a pool of fixed-size blocks, their allocator and per-sequence block tables."""

from tokenmill.engine.core.kv_cache.block_allocator import BlockAllocator, OutOfBlocks
from tokenmill.engine.core.kv_cache.host_tier import HostTier
from tokenmill.engine.core.kv_cache.manager import KVCacheManager, KVCacheStats
from tokenmill.engine.core.kv_cache.prefix_cache import PrefixMatch

__all__ = ["BlockAllocator", "OutOfBlocks", "HostTier", "KVCacheManager", "KVCacheStats",
           "PrefixMatch"]
