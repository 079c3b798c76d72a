"""Read-outs of a trial at epoch end: per split, overall and per example kind.

- ``split_data``: one split as the read-outs take it, and the rows an epoch end reads of it.
- ``surprisal``: what depends on b_t and h_t only (kappa, 1/kappa, b_u, the share of pi on
  strategy-explained surprisal), computed once per split.
- ``evaluate``: one eval pass of a model over a split and its model-dependent read-outs
  (losses, R_tok, R~, R^, rate, latent recovery, I(z; s), KL-kappa rank correlation).
- ``recovery``: how the latent is used (I(x; z), active units) and whether it recovers the
  hidden labels (NMI, ARI, AMI beside chance).
- ``latent``: I(z; s) estimators and the rank correlation.
- ``confounds``: latent NMI against length and kappa quartiles.
- ``controls``: the trivial explanations of a recovery number (length, vocabulary, kappa).
- ``gradients``: where the latent's learning signal comes from (gradient shares).
- ``speed``: NMI-AUC over a fixed horizon and epochs to NMI >= 0.9 (censoring marked).

Every function is a function of (model or its outputs, data, loss stack), so a cohort
trainer can call it for one member. None of it runs on the training hot path.
"""
