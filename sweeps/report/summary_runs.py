"""What the MLflow UI compares: summary runs (metric against alpha) and a saved runs view.

One *summary run* per (loss stack, model, beta, free bits), nested under the sweep's parent
run and tagged ``ksweep.run_kind = summary``, logs at step i, for the i-th alpha of the
sweep: ``alpha`` itself and the report split's cell means (``test/latent_nmi``,
``test/prefix/latent_nmi``, ... and ``..._ci_low`` / ``..._ci_high``). In the chart view a
line chart with x axis "metric: alpha" then draws the read-out against alpha, one line per
stack. The saved view (MLflow >= 3.15 reads the experiment tag
``mlflow.sharedViewState.<key>`` when the runs page is opened with ``?viewStateShareKey=<key>``)
filters the table to the summary runs and opens those line charts; its link is printed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from mlflow.tracking import MlflowClient

from workers.contract import (
    ELBO_BETA_PARAM,
    RUN_KIND_TAG,
    RUN_KIND_TRIAL,
    SHARED_BY_TAG,
    SWEEP_ID_TAG,
    TOTAL_STEPS_PARAM,
    mlflow_ui_url,
)
from workers.tracking.runs import RunLogger

__all__ = ["RUN_KIND_SUMMARY", "log_summary_runs", "publish_summary", "reused_view_state",
           "runs_page_url", "save_view", "trials_view_state", "view_state"]

RUN_KIND_SUMMARY = "summary"  # the run_kind tag of a summary run
SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
"""MLflow >= 3.15 keeps a shared runs-page view as the experiment tag ``<prefix><key>``."""
VIEW_STATE_QUERY = "viewStateShareKey"

TRIAL_COLUMNS = ("alpha", "loss_stack", "model", "seed", "c_base", ELBO_BETA_PARAM, TOTAL_STEPS_PARAM)


def runs_page_url(base_url: str, experiment_id: str, share_key: str | None = None,
                  charts: bool = False) -> str:
    """The runs page of an experiment, opened on a shared view when a key is given, and in
    its chart mode (``compareRunsMode=CHART``) with ``charts``."""
    url = mlflow_ui_url(base_url, experiment_id)
    query = [f"{VIEW_STATE_QUERY}={share_key}"] if share_key is not None else []
    query += ["compareRunsMode=CHART"] if charts else []
    return f"{url}?{'&'.join(query)}" if query else url


def _series(report: Mapping[str, Any]) -> dict[tuple, dict[float, dict[str, float]]]:
    """(stack, model, beta, free_bits, target_rate) -> alpha -> metric key -> value (report
    split only)."""
    split = report["split"]
    series: dict[tuple, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for cell in report["cells"]:
        if cell["split"] != split or cell["mean"] is None:
            continue
        key = (cell["loss_stack"], cell["model"], cell["beta"], cell["free_bits"],
               cell.get("target_rate"))
        path = "" if cell["kind"] == "all" else f"{cell['kind']}/"
        name = f"{split}/{path}{cell['metric']}"
        values = series[key][cell["alpha"]]
        values[name] = cell["mean"]
        for bound in ("ci_low", "ci_high"):
            if cell[bound] is not None:
                values[f"{name}_{bound}"] = cell[bound]
    return series


def _delete_old(client: MlflowClient, experiment_id: str, sweep_id: str) -> None:
    # A resumed driver writes the report again: its summary runs replace the old ones.
    old = client.search_runs([experiment_id], filter_string=(
        f"tags.`{SWEEP_ID_TAG}` = '{sweep_id}' and tags.`{RUN_KIND_TAG}` = '{RUN_KIND_SUMMARY}'"))
    for run in old:
        client.delete_run(run.info.run_id)


def log_summary_runs(tracking_uri: str, experiment_name: str, parent_run_id: str, sweep_id: str,
                     report: Mapping[str, Any]) -> list[str]:
    """One summary run per (stack, model, beta, free bits, target rate); returns their run ids."""
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    _delete_old(client, experiment_id, sweep_id)
    run_ids = []
    for (stack, model, beta, free_bits, rate), by_alpha in sorted(_series(report).items(), key=str):
        beta_text = ("" if beta is None else f"-b{beta:g}") + ("" if rate is None else f"-r{rate:g}")
        logger = RunLogger.start(
            tracking_uri, experiment_name, f"summary-{model}-{stack}{beta_text}",
            tags={SWEEP_ID_TAG: sweep_id, RUN_KIND_TAG: RUN_KIND_SUMMARY},
            parent_run_id=parent_run_id)
        logger.log_params({"loss_stack": stack, "model": model, "beta": beta,
                           "free_bits": free_bits, "target_rate": rate, "summary_of": "alpha",
                           "alphas": [float(a) for a in sorted(by_alpha)]})
        for step, alpha in enumerate(sorted(by_alpha)):
            logger.log_metrics({"alpha": float(alpha), **by_alpha[alpha]}, step=step)
        logger.finish("FINISHED")
        run_ids.append(logger.run_id)
    return run_ids


def _group_by(params: tuple[str, ...]) -> dict[str, Any]:
    return {"aggregateFunction": "average",
            "groupByKeys": [{"mode": "param", "groupByData": name} for name in params]}


def view_state(report: Mapping[str, Any]) -> dict[str, Any]:
    """The runs-page state of the saved view: summary runs only, and one line chart per
    read-out of the primary metric with alpha on the x axis."""
    split, metric = report["split"], report["analysis"]["metric"]
    kinds = sorted({c["kind"] for c in report["cells"] if c["metric"] == metric})
    keys = [f"{split}/{'' if k == 'all' else k + '/'}{metric}" for k in kinds]
    charts = [{
        "uuid": f"ksweep-{index}", "type": "LINE", "runsCountToCompare": 50,
        "metricSectionId": "default", "deleted": False, "isGenerated": False,
        "metricKey": key, "selectedMetricKeys": [key], "lineSmoothness": 0,
        "xAxisScaleType": "linear", "scaleType": "linear", "xAxisKey": "metric",
        "selectedXAxisMetricKey": "alpha", "yAxisKey": "metric", "yAxisExpressions": [],
        "ignoreOutliers": False, "useGlobalXaxisKey": False, "useGlobalLineSmoothing": False,
        "range": {}, "displayName": f"{key} vs alpha",
    } for index, key in enumerate(keys)]
    return {
        "searchFilter": f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND_SUMMARY}' and "
                        f"tags.`{SWEEP_ID_TAG}` = '{report['sweep_id']}'",
        "orderByKey": "attributes.start_time", "orderByAsc": True,
        "selectedColumns": ["params.`loss_stack`", "params.`model`", "params.`beta`"],
        "compareRunCharts": charts,
        "compareRunSections": [{"display": True, "name": "Metric against alpha",
                                "uuid": "default", "isReordered": False}],
        "isAccordionReordered": False, "hideEmptyCharts": False,
        "groupBy": _group_by(("loss_stack", "model", "beta")), "useGroupedValuesInCharts": False,
    }


def trials_view_state(report: Mapping[str, Any]) -> dict[str, Any]:
    """The runs-page state listing the sweep's trial runs with their axes as columns."""
    return {
        "searchFilter": f"tags.`{RUN_KIND_TAG}` = '{RUN_KIND_TRIAL}' and "
                        f"tags.`{SWEEP_ID_TAG}` = '{report['sweep_id']}'",
        "orderByKey": "attributes.start_time", "orderByAsc": True,
        "selectedColumns": [f"params.`{name}`" for name in TRIAL_COLUMNS]
                           + [f"tags.`{SHARED_BY_TAG}`"],
        # Grouped rows list the trial runs themselves; ungrouped, they would stay collapsed
        # under their parent (a shared view does not carry which rows are expanded).
        "groupBy": _group_by(("loss_stack",)),
    }


def reused_view_state(run_ids: list[str]) -> dict[str, Any]:
    """The runs-page state listing trial runs by run id: a sweep's trials reused from other
    sweeps stay in those sweeps' runs (MLflow's filter has no "or", so they get a view of
    their own, in the experiment that holds them)."""
    quoted = ", ".join(f"'{run_id}'" for run_id in run_ids)
    return {
        "searchFilter": f"attributes.run_id IN ({quoted})",
        "orderByKey": "attributes.start_time", "orderByAsc": True,
        "selectedColumns": [f"params.`{name}`" for name in TRIAL_COLUMNS]
                           + [f"tags.`{SWEEP_ID_TAG}`"],
        "groupBy": _group_by(("loss_stack",)),
    }


def _reused_views(tracking_uri: str, report: Mapping[str, Any], key: str,
                  ui_base_url: str) -> dict[str, str]:
    """One saved view per experiment holding reused trials: ``reused`` (``reused-<experiment
    id>`` when they sit in several experiments)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    by_experiment: dict[str, list[str]] = defaultdict(list)
    for entry in report.get("reused") or []:
        run = client.get_run(entry["mlflow_run_id"])
        by_experiment[run.info.experiment_id].append(entry["mlflow_run_id"])
    single = len(by_experiment) == 1
    return {("reused" if single else f"reused-{experiment}"): save_view(
                tracking_uri, experiment, f"{key}-reused", reused_view_state(run_ids), ui_base_url)
            for experiment, run_ids in sorted(by_experiment.items())}


def save_view(tracking_uri: str, experiment_id: str, key: str, state: Mapping[str, Any],
              ui_base_url: str, charts: bool = False) -> str:
    """Store a view as the experiment's shared view state ``key``; returns its runs-page link
    (opening on the charts with ``charts``: a view state does not carry the page's mode)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    client.set_experiment_tag(experiment_id, f"{SHARED_VIEW_TAG_PREFIX}{key}",
                              json.dumps(state, separators=(",", ":")))
    return runs_page_url(ui_base_url, experiment_id, key, charts=charts)


def publish_summary(tracking_uri: str, experiment_name: str, parent_run_id: str,
                    experiment_id: str, report: Mapping[str, Any], ui_base_url: str) -> dict[str, str]:
    """Summary runs and the saved views of a finished sweep; returns their links,
    ``{"summary": ..., "trials": ...}`` and, for trials reused from other sweeps,
    ``"reused"`` (their runs by id), on the MLflow UI at ``ui_base_url`` (the driver's
    caller passes it: the service's ``KSWEEP_MLFLOW_UI_URL`` setting)."""
    log_summary_runs(tracking_uri, experiment_name, parent_run_id, report["sweep_id"], report)
    base = ui_base_url
    key = f"ksweep-{report['sweep_id']}"
    return {
        "summary": save_view(tracking_uri, experiment_id, key, view_state(report), base,
                             charts=True),
        "trials": save_view(tracking_uri, experiment_id, f"{key}-trials",
                            trials_view_state(report), base),
        **_reused_views(tracking_uri, report, key, base),
    }
