"""Registered causal language models as the z-free base: the store, loading, and b_t.

The store (:mod:`.registry`) is torch-free; :mod:`.loading` and :mod:`.surprisal` import
torch and transformers only when called. Every load is offline and never runs remote code.
"""
