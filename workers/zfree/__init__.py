"""The z-free base: b_t (a token's surprisal without the latent) and c_base for a trial.

:mod:`.base` holds the synthetic task's exact oracle and the learned z-free decoder, cached
on disk; :mod:`.dataset` picks a registered dataset's base (learned, precomputed or
:mod:`.causal_lm`, a registered language model, whose name :mod:`.resolve` pins per sweep).
"""
