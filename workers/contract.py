"""The names the workers and the layers above share: metrics, tags, params, MLflow links.

Nothing else in the project spells these strings; the trainer, the tracking code, the
Tune driver, the report, the service and the CLI all import them from here. A name only the
layers above use lives there instead (the progress record and its states in
:mod:`sweeps.status`, the driver's environment in :mod:`service.orchestrator.driver_env`).
The module is pure Python (no torch, Ray or MLflow), so the light service modules may import it.

Layout (add new names to the group they belong to):
    metric names, registered names, tags, params, MLflow locations and links, a trial's
    training status, read-outs.
"""

from __future__ import annotations

import math
import os
from enum import StrEnum
from pathlib import Path

# --- metric names: ``{split}/{name}`` (``step`` = epoch) ---------------------------------

TRAIN = "train"
VAL = "val"
TEST = "test"
SPLITS: tuple[str, ...] = (TRAIN, VAL, TEST)
"""Every split of the task (the data generator's, the read-outs')."""
EPOCH_SPLITS: tuple[str, ...] = (TRAIN, VAL)
"""The splits the training loop logs :data:`SPLIT_METRICS` on every epoch."""

# Logged on every split by the training loop.
SPLIT_METRICS: tuple[str, ...] = (
    "loss", "recon_uniform", "recon_token_weighted", "recon_ncc", "kl",
    "kappa_mean", "kappa_p50", "kappa_p90", "kappa_max", "cv2_mean", "elbo",
)
ELBO = "elbo"
"""``{split}/elbo``: mean over examples of sum_t l_t + KL (the negative ELBO, nats; lower is
better), identical for every stack, logged on every trial; a label-less dataset's default."""
# Latent use (every split, overall; docs/concepts/trials.md "Read-outs"): I(x; z) in nats, the
# units whose posterior mean varies over x (Burda et al. 2016; a discrete latent's units are its
# one-hot coordinates, so a collapsed one reads 0), and the discrete categories the aggregate
# posterior gives mass >= 0.01 (which a collapsed, spread posterior fills: not a use measure).
MUTUAL_INFO = "mutual_info"
ACTIVE_UNITS = "active_units"
USED_CATEGORIES = "used_categories"
KL = "kl"  # the rate E[KL] (nats per example), every split
KL_MULTIPLIER = "kl_multiplier"  # train/kl_multiplier: the KL weight in effect at the epoch's end
KL_TRAIN_TARGET = "kl_train_target"  # train/kl_train_target: the train rate the epoch's steps steered to
TARGET_RATE_PARAM = "target_rate"  # the kl target rate in nats per example; NaN when rate control is off
RATE_TOLERANCE = 0.15
"""A rate is on its target within 15%: |achieved / target - 1| <= 0.15. The report flags a cell
off beyond it; under a target rate the checkpoint is chosen among the epochs on target."""


def off_target(achieved: float | None, target: float | None) -> bool | None:
    """Whether ``achieved`` is more than :data:`RATE_TOLERANCE` of ``target`` away from it
    (None when either is unknown): the report's flag and the on-target checkpoint's rule."""
    if achieved is None or target is None or not math.isfinite(achieved) or target <= 0:
        return None
    return abs(achieved / target - 1) > RATE_TOLERANCE

LATENT_AMI, LATENT_NMI_SHUFFLED = "latent_ami", "latent_nmi_shuffled"
# Latent recovery and use, valid objective metrics on val.
LATENT_METRICS: tuple[str, ...] = ("latent_nmi", "latent_ari", LATENT_AMI, MUTUAL_INFO, ACTIVE_UNITS)


def metric_name(split: str, name: str, kind: str | None = None) -> str:
    """``{split}/{name}``, or ``{split}/{kind}/{name}`` for one example kind."""
    return f"{split}/{name}" if kind is None else f"{split}/{kind}/{name}"


VAL_LATENT_NMI = metric_name(VAL, "latent_nmi")
VAL_LATENT_ARI = metric_name(VAL, "latent_ari")
VAL_LATENT_AMI = metric_name(VAL, LATENT_AMI)
VAL_MUTUAL_INFO = metric_name(VAL, MUTUAL_INFO)
VAL_ACTIVE_UNITS = metric_name(VAL, ACTIVE_UNITS)
VAL_LOSS = metric_name(VAL, "loss")
TRAIN_LOSS = metric_name(TRAIN, "loss")
VAL_BASELINE_SELF_CHECK = metric_name(VAL, "baseline_self_check")
PERF_EPOCH_SECONDS = "perf/epoch_seconds"
PERF_TOKENS_PER_SECOND = "perf/tokens_per_second"
PERF_COMPILE_SECONDS = "perf/compile_seconds"  # a compiled cohort's warm-up steps (compile included)
VAL_KL = metric_name(VAL, KL)
TRAIN_KL = metric_name(TRAIN, KL)
TRAIN_KL_MULTIPLIER = metric_name(TRAIN, KL_MULTIPLIER)
"""The KL's weight beta in effect at each epoch's end (train only, every trial with a kl term):
the target-rate control's multiplier, else the configured weight at its schedule."""
TRAIN_KL_TRAIN_TARGET = metric_name(TRAIN, KL_TRAIN_TARGET)
"""Under a target rate only: the train rate the multiplier steered to in the epoch (the target,
corrected at each epoch's end by the val rate; objectives/rate_control.py)."""
VAL_KAPPA_MEAN = metric_name(VAL, "kappa_mean")

# The per-epoch curves a trial's outcome keeps (the report's plots; a cohort keeps them per member).
HISTORY_METRICS: tuple[str, ...] = (VAL_LATENT_NMI, VAL_LATENT_ARI, VAL_LOSS, VAL_KL, VAL_KAPPA_MEAN)

# The metrics a sweep may optimise or report on (docs/concepts/design.md, "What a trial records").
TEST_ELBO = metric_name(TEST, ELBO)
VAL_ELBO = metric_name(VAL, ELBO)
METRIC_NAMES: tuple[str, ...] = (
    *(metric_name(split, name) for split in EPOCH_SPLITS for name in SPLIT_METRICS),
    *(metric_name(VAL, name) for name in LATENT_METRICS),
    TEST_ELBO,
    TRAIN_KL_MULTIPLIER,
)
# Latent recovery beside its chance level (labelled data, overall only, every epoch): AMI and
# the NMI against shuffled labels (workers.readouts.recovery.chance_readouts).
# The latent's assignment against the quartiles of target length and of kappa (workers.readouts.
# confounds): what its clusters share with nuisance variables, beside the NMI against the label.
LATENT_NMI_LENGTH, LATENT_NMI_KAPPA = "latent_nmi_length", "latent_nmi_kappa"
# AMI conditional on length: the AMI of the latent with the label within each quartile of the
# target length, averaged with the quartiles' sizes as weights (workers.readouts.confounds).
LATENT_AMI_WITHIN_LENGTH = "latent_ami_within_length"
CHANCE_READOUTS: tuple[str, ...] = (LATENT_AMI, LATENT_NMI_SHUFFLED, LATENT_NMI_LENGTH, LATENT_NMI_KAPPA,
                                    LATENT_AMI_WITHIN_LENGTH)

# --- registered names (datasets and language models) -------------------------------------

# A registered dataset's or model's name: a file name on every platform, never a path.
REGISTERED_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
# A content hash as the registries store it (sha256, lower-case hex).
SHA256_HEX_PATTERN = r"[0-9a-f]{64}"

# --- tags (MLflow run and experiment tags, Ray Job metadata) ------------------------------

TAG_PREFIX = "ksweep."
SWEEP_ID_TAG = "ksweep.sweep_id"
TRIAL_ID_TAG = "ksweep.trial_id"
RUN_KIND_TAG = "ksweep.run_kind"
RUN_KIND_TRIAL = "trial"  # the only kind counted as trials
RUN_KIND_SWEEP = "sweep"  # the parent run of a sweep (summary runs: sweeps.report.summary_runs)
SHARED_BY_TAG = "ksweep.shared_by"
"""On a trial run that stands in several rows: the rows, ``stack@alpha=a`` comma-separated."""
TRIAL_HASH_TAG = "ksweep.trial_hash"
"""On a trial run: the content hash of everything that determined its result
(:mod:`sweeps.plan.identity`); a sweep with ``reuse`` finds earlier trials by it."""
FAILURE_TAG = "ksweep.failure"
WRITER_TAG = "ksweep.writer"
"""On a trial run: the process now writing its epochs. A retried trial claims the run before it
reads what the run holds, and a process it superseded (a worker cut off from the network and
given up by Ray) drops a write it retries afterwards instead of logging an epoch twice."""
STOPPED_EARLY_TAG = "ksweep.stopped_early"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# Without it MLflow 3's UI opens an experiment on its GenAI traces overview.
EXPERIMENT_KIND = "custom_model_development"
# MLflow caps tag values; failure reasons and errors are cut to this many characters.
MAX_ERROR_CHARS = 5000


def failure_text(error: BaseException) -> str:
    """``Type: message``, cut to :data:`MAX_ERROR_CHARS` (the ``ksweep.failure`` tag)."""
    return f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]


def runs_with_tag_filter(**tags: str) -> str:
    """An MLflow ``filter_string`` matching runs whose tags equal ``tags`` (keys: contract tags)."""
    return " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())


# --- params on every trial run ------------------------------------------------------------

C_BASE_PARAM = "c_base"
TRAIN_TARGET_LENGTH_PARAM = "train_target_length"
"""The train split's mean number of active target tokens (what beta in ELBO units multiplies)."""
TOTAL_STEPS_PARAM = "total_steps"
"""The trial's budget in optimizer steps: epochs x ceil(train rows / batch_size)."""
ELBO_BETA_PARAM = "elbo_beta"
"""Beta in ELBO units (objectives/units.py): effective beta x the mean target length under the
per-example KL, effective beta under the per-token KL."""
TRAINED_BETA_PARAM = "trained_beta"
"""The KL weight the trial trained at: its beta, or effective beta x S (kl weight_units: effective)."""
RUN_CONSTANT_PARAMS: tuple[str, ...] = (
    C_BASE_PARAM, TRAIN_TARGET_LENGTH_PARAM, TOTAL_STEPS_PARAM, ELBO_BETA_PARAM, TRAINED_BETA_PARAM,
    TARGET_RATE_PARAM)
"""What a trial's whole run is measured in: params of its run, and in its last results."""

# --- a trial's identity -------------------------------------------------------------------

TRAINING_COMPAT_VERSION = 1
"""Raised whenever the training semantics change in a way the code digest may not see (a
data generator, a read-out, a default): trials hashed under another version are never
reused (:mod:`sweeps.plan.identity`)."""

# --- MLflow locations and links -----------------------------------------------------------

LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"


def default_tracking_uri() -> str:
    """The tracking URI to use when none is given.

    Returns:
        ``$MLFLOW_TRACKING_URI`` when set and non-empty, else
        ``sqlite:///<absolute path of ./mlflow.db>``. The path is made absolute so that
        Ray workers, whose working directory differs from the driver's, write to the same
        store.
    """
    from_env = os.environ.get("MLFLOW_TRACKING_URI")
    if from_env:
        return from_env
    return f"sqlite:///{Path('mlflow.db').resolve()}"


def mlflow_ui_url(base_url: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI page of an experiment's runs table, or of one run in it."""
    url = f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{url}/{run_id}" if run_id else url


# --- a trial's training status, where it trains ---------------------------------------

class TrainingStatus(StrEnum):
    """How a trial's training stands in its worker: a cohort member's ``status`` and ``state``
    in the cohort's checkpoint (``members.json``), and how a resumed lone trial's run ended.

    Not the progress record's trial state (:class:`sweeps.status.TrialState`), which the
    driver derives from it and the epochs reached: a member that stopped early at its last
    epoch is a ``done`` trial. The values are stored in checkpoints: never rename one.
    """

    RUNNING = "running"
    FINISHED = "finished"  # trained its whole epoch budget
    STOPPED = "stopped"  # left early: its own early stopping, the cohort's patience, the scheduler
    FAILED = "failed"  # diverged or raised; the error says why


# --- read-outs ----------------------------------------------------------------------------

EXAMPLE_KINDS: tuple[str, ...] = ("prefix", "diffuse", "private")
"""The task's example kinds; an example's kind id is its index here."""
SELECTED_PREFIX = "selected/"
SELECTED_EPOCH = "selected/epoch"
STOP_EPOCH = "training/stop_epoch"  # epochs trained (< max when early stopping ended the run)
SELECTION_METRIC = "val/loss"  # what early stopping reads, and the checkpoint choice by default
# How a trial's checkpoint is chosen (`training.selection`): the epoch of lowest val loss, or
# the best epoch of one val metric (`training.selection_metric`: highest for the latent
# metrics, lowest for the losses; selection_maximises).
SELECTION_VAL_LOSS, SELECTION_VAL_METRIC = "val_loss", "val_metric"
SELECTIONS: tuple[str, ...] = (SELECTION_VAL_LOSS, SELECTION_VAL_METRIC)
SELECTABLE_METRICS: tuple[str, ...] = tuple(m for m in METRIC_NAMES if m.startswith(f"{VAL}/"))


def selection_maximises(metric: str) -> bool:
    """Whether checkpoint selection on ``metric`` keeps its highest value (latent recovery and
    use) rather than its lowest (losses, KL, kappa statistics)."""
    return metric.rsplit("/", 1)[-1] in LATENT_METRICS

# Depend on b_t (and h_t) only: computed once per split, logged every epoch, overall and per kind.
SURPRISAL_READOUTS: tuple[str, ...] = (
    "kappa_mean", "kappa_p10", "kappa_p50", "kappa_p90",
    "inv_kappa_mean", "inv_kappa_p10", "inv_kappa_p50", "inv_kappa_p90",
    "b_u", "pi_explained_share", "pi_unexplained_share",
)
# Depend on the model: every epoch, overall and per kind.
MODEL_READOUTS: tuple[str, ...] = (
    "loss", "recon_uniform", "recon_token_weighted", "recon_cc", "recon_ncc", "kl", "elbo",
    "latent_nmi", "latent_ari", "mi_zs", "kl_kappa_spearman",
)
CONTINUOUS_READOUTS: tuple[str, ...] = (ACTIVE_UNITS,)  # also per kind, continuous family only
OVERALL_ONLY_READOUTS: tuple[str, ...] = ("c_base", MUTUAL_INFO)  # c_base: the trial's constant
DISCRETE_READOUTS: tuple[str, ...] = (ACTIVE_UNITS, USED_CATEGORIES)  # overall, discrete family only

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

COMPACT_B_U = "b_u_compact"
"""``{split}/b_u_compact``: b_u with b_t renormalised to the compact support (the ids the
dataset uses), the scale l_t lives on. A learned base is trained there (it equals b_u); a
precomputed column holds only each token's nats, so it is absent (param base.support =
original)."""

# A trial on a registered dataset: the full content hash (the MLflow dataset input's digest
# holds its first DATASET_DIGEST_CHARS hex characters: MLflow caps a digest at 36).
DATASET_SHA256_PARAM = "dataset_sha256"
DATASET_DIGEST_CHARS = 32

# Provenance params of every trial run.
PROVENANCE_PARAMS: tuple[str, ...] = (
    "provenance.git_commit", "provenance.git_dirty", "provenance.torch", "provenance.ray",
    "provenance.mlflow", "provenance.numpy", "data.hash.train", "data.hash.val",
    "data.hash.test", "data.resolved_seed",
)


def readout_names(family: str = "discrete", splits: tuple[str, ...] = SPLITS) -> list[str]:
    """Every per-epoch read-out name of a trial of ``family``, overall and per kind."""
    names = SURPRISAL_READOUTS + MODEL_READOUTS + (
        CONTINUOUS_READOUTS if family == "continuous" else ())
    out: list[str] = []
    for split in splits:
        for kind in (None, *EXAMPLE_KINDS):
            out.extend(metric_name(split, name, kind) for name in names)
        overall = OVERALL_ONLY_READOUTS + CHANCE_READOUTS + (
            DISCRETE_READOUTS if family == "discrete" else ())
        out.extend(metric_name(split, name) for name in overall)
    return out


def selected_name(name: str) -> str:
    """``selected/{split}/...`` for a per-epoch name ``{split}/...``."""
    return SELECTED_PREFIX + name
