"""Paged caches: KV blocks, their prefix hashes, a hybrid target's state pool, and the cache manager over them."""
