"""The names every component shares (torch-free constants and small pure functions).

Metric names: ``{split}/{name}`` overall, ``{split}/{kind}/{name}`` per example kind,
``selected/{split}/{name}`` at the checkpoint val chose, ``selected/epoch`` that epoch.
The README's "Read-outs" section documents each name below.
"""

from __future__ import annotations


def metric_name(split: str, name: str, kind: str | None = None) -> str:
    """``{split}/{name}``, or ``{split}/{kind}/{name}`` for one example kind."""
    return f"{split}/{name}" if kind is None else f"{split}/{kind}/{name}"


# ==== names added by sci-task (read-outs of issue 11) =====================================
# Keep this block separate when merging with the other helpers' versions of this module.

READOUT_SPLITS: tuple[str, ...] = ("train", "val", "test")
EXAMPLE_KINDS: tuple[str, ...] = ("prefix", "diffuse", "private")
SELECTED_PREFIX = "selected/"
SELECTED_EPOCH = "selected/epoch"
STOP_EPOCH = "training/stop_epoch"  # epochs trained (< max when early stopping ended the run)
SELECTION_METRIC = "val/loss"  # what early stopping and the checkpoint choice read (never NMI)

# Depend on b_t (and h_t) only: computed once per split, logged every epoch, overall and per kind.
SURPRISAL_READOUTS: tuple[str, ...] = (
    "kappa_mean", "kappa_p10", "kappa_p50", "kappa_p90",
    "inv_kappa_mean", "inv_kappa_p10", "inv_kappa_p50", "inv_kappa_p90",
    "b_u", "pi_explained_share", "pi_unexplained_share",
)
# Depend on the model: every epoch, overall and per kind.
MODEL_READOUTS: tuple[str, ...] = (
    "loss", "recon_uniform", "recon_token_weighted", "recon_cc", "recon_ncc", "kl",
    "latent_nmi", "latent_ari", "mi_zs", "kl_kappa_spearman",
)
CONTINUOUS_READOUTS: tuple[str, ...] = ("active_units",)  # also per kind, continuous family only
OVERALL_ONLY_READOUTS: tuple[str, ...] = ("c_base",)  # the trial's constant (train split)

# Gradient shares (val, fixed evaluation batch, epoch end): projection share of each token
# group in the gradient of the stack's reconstruction part w.r.t. q(z|x,y)'s parameters.
GRADIENT_GROUPS: tuple[str, ...] = (
    "prefix", "top_decile_b", "explained",
    *(f"kind_{kind}" for kind in EXAMPLE_KINDS),
)


def grad_share_name(group: str, split: str = "val") -> str:
    """``val/grad_share_{group}``; the complement (body, rest, unexplained) is 1 minus it."""
    return f"{split}/grad_share_{group}"


GRAD_NORM_NAME = "val/grad_norm_encoder"  # norm of the full reconstruction gradient

# Speed read-outs (logged once, at the end, overall and per kind, for val and test).
NMI_AUC = "nmi_auc"
EPOCHS_TO_NMI = "epochs_to_nmi90"
EPOCHS_TO_NMI_CENSORED = "epochs_to_nmi90_censored"

# Provenance params of every trial run.
PROVENANCE_PARAMS: tuple[str, ...] = (
    "provenance.git_commit", "provenance.git_dirty", "provenance.torch", "provenance.ray",
    "provenance.mlflow", "provenance.numpy", "data.hash.train", "data.hash.val",
    "data.hash.test", "data.resolved_seed",
)


def readout_names(family: str = "discrete", splits: tuple[str, ...] = READOUT_SPLITS) -> list[str]:
    """Every per-epoch read-out name of a trial of ``family``, overall and per kind."""
    names = SURPRISAL_READOUTS + MODEL_READOUTS + (
        CONTINUOUS_READOUTS if family == "continuous" else ())
    out = []
    for split in splits:
        for kind in (None, *EXAMPLE_KINDS):
            out.extend(metric_name(split, name, kind) for name in names)
        out.extend(metric_name(split, name) for name in OVERALL_ONLY_READOUTS)
    return out


def selected_name(name: str) -> str:
    """``selected/{split}/...`` for a per-epoch name ``{split}/...``."""
    return SELECTED_PREFIX + name
