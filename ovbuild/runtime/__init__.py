"""Running ovbuild IRs: numpy references, paged KV cache, compiled paged models, scheduler."""
