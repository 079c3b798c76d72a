"""Read-outs of a trial at epoch end: per split, overall and per example kind.

A split as they take it (``split_data``); one evaluation pass and the model's read-outs
(``evaluate``); those of the surprisal alone (``surprisal``); how the latent is used and what it
recovers (``recovery``, ``latent``, ``confounds``); the trivial explanations of a recovery
(``controls``, and for a label, ``label_gate`` with ``text_features``); where the latent's
learning signal comes from (``gradients``); how fast NMI rises (``speed``). Every function takes
a model or its outputs, data and a loss stack, so a cohort calls it for one member; none of it
runs on the training hot path.
"""
