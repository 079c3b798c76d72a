"""The names every component shares: metrics, tags, params, MLflow links, the progress record.

Nothing else in the project spells these strings; the trainer, the tracking code, the
Tune driver, the report, the service and the CLI all import them from here. The module
is pure Python (no torch, Ray or MLflow), so the light service modules may import it.

Layout (add new names to the group they belong to):
    metric names, tags, params, MLflow locations and links, the driver's environment,
    the progress record.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

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
# Latent recovery, on val only.
LATENT_METRICS: tuple[str, ...] = ("latent_nmi", "latent_ari", "mutual_info", "active_units")


def metric_name(split: str, name: str, kind: str | None = None) -> str:
    """``{split}/{name}``, or ``{split}/{kind}/{name}`` for one example kind."""
    return f"{split}/{name}" if kind is None else f"{split}/{kind}/{name}"


VAL_LATENT_NMI = metric_name(VAL, "latent_nmi")
VAL_LATENT_ARI = metric_name(VAL, "latent_ari")
VAL_MUTUAL_INFO = metric_name(VAL, "mutual_info")
VAL_ACTIVE_UNITS = metric_name(VAL, "active_units")
VAL_LOSS = metric_name(VAL, "loss")
TRAIN_LOSS = metric_name(TRAIN, "loss")
VAL_BASELINE_SELF_CHECK = metric_name(VAL, "baseline_self_check")
PERF_EPOCH_SECONDS = "perf/epoch_seconds"
PERF_TOKENS_PER_SECOND = "perf/tokens_per_second"
VAL_KL = metric_name(VAL, "kl")
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
)
# The metrics a dataset without a label cannot give (no latent to recover).
# Latent recovery beside its chance level (labelled data, overall only, every epoch): AMI and
# the NMI against shuffled labels (workers.metrics.chance_readouts).
CHANCE_READOUTS: tuple[str, ...] = ("latent_ami", "latent_nmi_shuffled")
LABEL_READOUTS = frozenset({"latent_nmi", "latent_ari", "mi_zs", "nmi_auc", "epochs_to_nmi90",
                            "epochs_to_nmi90_censored", *CHANCE_READOUTS})
LABEL_METRICS = frozenset({VAL_LATENT_NMI, VAL_LATENT_ARI})
DEFAULT_OBJECTIVE_METRIC = VAL_LATENT_NMI
# Latent recovery is better when higher; every loss, KL and concentration statistic when lower.
MAXIMISED_METRICS = frozenset(metric_name(VAL, name) for name in LATENT_METRICS)
# The final values ``ksweep train`` prints.
TRIAL_SUMMARY_METRICS: tuple[str, ...] = (
    TRAIN_LOSS, VAL_LOSS, "val/recon_uniform", "val/recon_token_weighted", "val/recon_ncc",
    "val/kl", "val/kappa_mean", "val/kappa_p90", VAL_LATENT_NMI, VAL_LATENT_ARI,
    VAL_MUTUAL_INFO, VAL_ACTIVE_UNITS, PERF_TOKENS_PER_SECOND,
)
BEST_METRIC_PREFIX = "best/"

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
RUN_KIND_SWEEP = "sweep"  # the parent run of a sweep
RUN_KIND_SUMMARY = "summary"
SHARED_BY_TAG = "ksweep.shared_by"
"""On a trial run that stands in several rows: the rows, ``stack@alpha=a`` comma-separated."""
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
"""MLflow >= 3.15 keeps a shared runs-page view as the experiment tag ``<prefix><key>``."""
VIEW_STATE_QUERY = "viewStateShareKey"
FAILURE_TAG = "ksweep.failure"
STOPPED_EARLY_TAG = "ksweep.stopped_early"
STATE_TAG = "ksweep.state"
BEST_VALUE_TAG = "ksweep.best_value"
ATTEMPT_TAG = "ksweep.attempt"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
# Without it MLflow 3's UI opens an experiment on its GenAI traces overview.
EXPERIMENT_KIND = "custom_model_development"
NOTE_TAG = "mlflow.note.content"
# MLflow caps tag values; failure reasons and errors are cut to this many characters.
MAX_ERROR_CHARS = 5000


def param_tag(name: str) -> str:
    """The run tag mirroring a trial's search param (``ksweep.alpha``...)."""
    return f"{TAG_PREFIX}{name}"


def counter_tag(counter: str) -> str:
    """The parent run's tag mirroring one trial counter (``ksweep.trials_done``...)."""
    return f"{TAG_PREFIX}trials_{counter}"


def failure_text(error: BaseException) -> str:
    """``Type: message``, cut to :data:`MAX_ERROR_CHARS` (the ``ksweep.failure`` tag)."""
    return f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]


def runs_with_tag_filter(**tags: str) -> str:
    """An MLflow ``filter_string`` matching runs whose tags equal ``tags`` (keys: contract tags)."""
    return " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())


# --- params on every trial run ------------------------------------------------------------

ALPHA_PARAM = "alpha"
LOSS_STACK_PARAM = "loss_stack"
MODEL_PARAM = "model"
SEED_PARAM = "seed"
C_BASE_PARAM = "c_base"
BETA_PARAM = "beta"  # the KL weight, a param of a trial only when the sweep sweeps it
FREE_BITS_PARAM = "free_bits"  # likewise
# The search axes of a sweep, in this order, and the named params of every trial run.
SEARCH_AXES: tuple[str, ...] = (ALPHA_PARAM, LOSS_STACK_PARAM, MODEL_PARAM, SEED_PARAM,
                                BETA_PARAM, FREE_BITS_PARAM)

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


def runs_page_url(base_url: str, experiment_id: str, share_key: str | None = None,
                  charts: bool = False) -> str:
    """The runs page of an experiment, opened on a shared view when a key is given, and in
    its chart mode (``compareRunsMode=CHART``) with ``charts``."""
    url = mlflow_ui_url(base_url, experiment_id)
    query = [f"{VIEW_STATE_QUERY}={share_key}"] if share_key is not None else []
    query += ["compareRunsMode=CHART"] if charts else []
    return f"{url}?{'&'.join(query)}" if query else url


def mlflow_ui_url(base_url: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI page of an experiment's runs table, or of one run in it."""
    url = f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{url}/{run_id}" if run_id else url


# --- the environment of a driver process (Tune reads these knobs only from there) -------

TUNE_ENV: dict[str, str] = {
    # Small sweeps: save the experiment state often, so a killed driver resumes close to
    # where it was.
    "TUNE_GLOBAL_CHECKPOINT_S": "2",
    # Trials keep the driver's working directory (every path they get is absolute anyway).
    "RAY_CHDIR_TO_TRIAL_DIR": "0",
    # Per-epoch checkpoints of short trials force frequent state snapshots by design.
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    # Reused actors (reuse_actors=True): Tune waits this long for a stopped trial's thread
    # to end (its run finished, PNGs logged) before handing the actor to the next trial;
    # past it the next trial fails. Tune's default is 2 s, less than PNGs take under load.
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "120",
}

# The environment of a process that starts its own local Ray, set before Ray is imported:
# Ray 2.60's ray.init turns a node IP of 127.0.0.1 into the host's address and binds its gRPC
# servers to every interface, unless cluster mode is off (Ray's switch for macOS and Windows);
# then GCS, raylet, workers and agents listen on loopback only. A value already in the
# environment wins (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 opts out).
LOOPBACK_RAY_ENV: dict[str, str] = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

# --- the progress record ------------------------------------------------------------------

class SweepState(StrEnum):
    """A sweep's state: in the store's ``state`` column, the API's documents and the CLI (the
    values are stored and documented: never rename one)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TrialState(StrEnum):
    """A trial's state in the progress record, the API's trial list and the report."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


# Plain strings (``.value``): the store compares its column with them.
ACTIVE_SWEEP_STATES: tuple[str, ...] = (SweepState.QUEUED.value, SweepState.RUNNING.value)
TERMINAL_SWEEP_STATES: tuple[str, ...] = tuple(
    s.value for s in SweepState if s.value not in ACTIVE_SWEEP_STATES)
COUNTERS: tuple[str, ...] = ("total", "pending", "running", "done", "failed", "stopped")


@dataclass
class SweepStatus:
    """Where a sweep stands. Counters always add up to ``total``.

    ``pending`` counts trials not started yet (including those the searcher has not
    created); ``stopped`` counts trials an early-stopping scheduler ended.
    """

    sweep_id: str
    state: str = "running"  # running | succeeded | failed | cancelled
    total: int = 0
    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    stopped: int = 0
    best_metric: str | None = None
    best_value: float | None = None
    best_trial: str | None = None
    best_config: dict[str, Any] | None = None
    eta_seconds: float | None = None
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    error: str | None = None
    parent_run_id: str | None = None
    experiment_id: str | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)
    """One dict per trial Tune knows of, in creation order: ``trial_id``, ``state``
    (pending | running | done | stopped | failed), ``config`` (alpha, loss_stack, model,
    seed), ``metrics`` (the latest finite metrics named here), ``epochs``,
    ``mlflow_run_id`` and ``error``."""

    @property
    def finished(self) -> int:
        """Trials that ended, whichever way."""
        return self.done + self.failed + self.stopped

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; a non-finite best value becomes None."""
        data = asdict(self)
        if data["best_value"] is not None and not math.isfinite(data["best_value"]):
            data["best_value"] = None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepStatus:
        """The record from :meth:`to_dict`'s output; unknown keys are ignored."""
        known = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in known})


# --- read-outs ----------------------------------------------------------------------------

EXAMPLE_KINDS: tuple[str, ...] = ("prefix", "diffuse", "private")
"""The task's example kinds; an example's kind id is its index here."""
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
    "loss", "recon_uniform", "recon_token_weighted", "recon_cc", "recon_ncc", "kl", "elbo",
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

COMPACT_B_U = "b_u_compact"
"""``{split}/b_u_compact``: b_u with b_t renormalised to the compact support (the ids the
dataset uses), the scale l_t lives on. A learned base is trained there (it equals b_u); a
precomputed column holds only each token's nats, so it is absent (param base.support =
original)."""

ORACLE_ABSENT_REASON = (
    "they need the oracle's h_t (each token's surprisal given the true latent) and the "
    "synthetic task's prefix/private kinds, and a registered dataset has neither")
"""Why a dataset trial has no oracle read-outs (the report says it in these words)."""

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
        out.extend(metric_name(split, name) for name in OVERALL_ONLY_READOUTS + CHANCE_READOUTS)
    return out


def selected_name(name: str) -> str:
    """``selected/{split}/...`` for a per-epoch name ``{split}/...``."""
    return SELECTED_PREFIX + name


# --- cohorts ------------------------------------------------------------------------------

COHORT_TAG = "ksweep.cohort"
"""On a trial run trained in a cohort: the Tune trial id of its cohort (absent for a lone trial)."""
COHORT_MEMBERS_KEY = "cohort_members"
"""Key of a cohort Tune trial's report: its members' progress records as one JSON string."""


def member_trial_id(cohort_trial_id: str, position: int) -> str:
    """The trial id of member ``position`` of the cohort that Tune runs as ``cohort_trial_id``."""
    return f"{cohort_trial_id}-m{position}"
