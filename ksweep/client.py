"""The Python client of the kappa-sweep service: typed returns, exceptions, DataFrames.

Light by construction: importing it loads httpx and pydantic (and the spec models), never
torch, Ray, MLflow or pandas; pandas is imported when a frame is asked for.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import httpx
from pydantic import BaseModel, ValidationError

from ksweep.errors import ServiceUnreachable, SpecError, WaitTimeout, error_for
from ksweep.progress import WaitBar
from service.api.schemas import (
    Extension,
    ExtensionPlan,
    ExtensionResult,
    FieldProblem,
    History,
    Problem,
    Report,
    Sweep,
    SweepPage,
    Trial,
    TrialPage,
)
from service.lifecycle import TERMINAL_SWEEP_STATES

if TYPE_CHECKING:
    import pandas as pd

    from ksweep.tables import Frames
    from sweeps.spec import SweepSpec

SpecLike: TypeAlias = "SweepSpec | Mapping[str, Any] | str | Path"
TABLES = ("trials", "cells", "contrasts", "history")


def spec_body(spec: SpecLike) -> dict[str, Any]:
    """The JSON body of a spec given as a model, a mapping (sent as is: the service checks it)
    or a YAML/JSON file path (checked here first, as strictly as the API does).

    Raises:
        SpecError: the file is missing, unreadable, too large or invalid (every field named).
    """
    if isinstance(spec, BaseModel):
        return dict(spec.model_dump(mode="json"))
    if isinstance(spec, Mapping):
        return dict(spec)
    # The spec models import numpy and the plan's tables: loaded only to check a file.
    from sweeps.spec import SweepSpec
    from workers.yaml_loader import read_spec_file

    path = Path(spec)
    try:
        return SweepSpec.model_validate(read_spec_file(path), strict=True).model_dump(mode="json")
    except ValidationError as error:
        problems = [FieldProblem(field=".".join(str(p) for p in e["loc"]) or "(top level)",
                                 message=e["msg"]) for e in error.errors()]
        raise SpecError(str(path), f"invalid sweep spec, {len(problems)} problem(s)",
                        problems) from None
    except (ValueError, OSError) as error:
        raise SpecError(str(path), str(error)) from None


class Client:
    """A sync client of ``/api/v1``.

    Args:
        url: the service, default ``KSWEEP_URL`` (``http://127.0.0.1:8000``).
        token: the bearer token, default ``KSWEEP_TOKEN``, else the token a local
            ``ksweep serve`` wrote under ``KSWEEP_SWEEP_ROOT`` (none: anonymous reads).
        timeout: seconds per HTTP request.

    Every method raises :class:`ksweep.errors.ApiError` (a subclass per status) for an error
    answer and :class:`ksweep.errors.ServiceUnreachable` when the service does not answer.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float = 60.0) -> None:
        from ksweep.settings import ClientSettings

        settings = ClientSettings()
        token = token or settings.bearer_token()
        self.url = (url or settings.url).rstrip("/")
        self.base = self.url + "/api/v1"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections."""
        self.http.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # --- the wire ----------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One API call (``path`` under ``/api/v1``); error answers become exceptions."""
        try:
            response = self.http.request(method, self.base + path, **kwargs)
        except httpx.TransportError as error:
            raise ServiceUnreachable(
                f"cannot reach the service at {self.base}: {error} (is `ksweep serve` running? "
                "set KSWEEP_URL or Client(url=...))") from None
        if response.status_code >= 400:
            raise error_for(_problem_of(response), _retry_after(response))
        return response

    # --- sweeps ------------------------------------------------------------------------

    def submit(self, spec: SpecLike, idempotency_key: str | None = None) -> Sweep:
        """Submit a sweep (a :class:`SweepSpec`, a dict or a spec file path); returns it
        queued. The same ``idempotency_key`` and spec returns the same sweep again."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self.request("POST", "/sweeps", json=spec_body(spec), headers=headers)
        return Sweep.model_validate_json(response.content)

    def validate(self, spec: SpecLike, pilot: str | None = None) -> dict[str, Any]:
        """The service's dry run of a spec: its trial plan (count, dedup, epoch budget); with a
        ``pilot`` sweep's id, also ``power``: the effect the spec's seeds detect and the seeds
        ``analysis.min_effect`` needs, from the pilot's paired SDs."""
        params = {"pilot": pilot} if pilot is not None else None
        plan: dict[str, Any] = self.request("POST", "/sweeps:validate", json=spec_body(spec),
                                            params=params).json()
        return plan

    def get(self, sweep_id: str) -> Sweep:
        """A sweep: state, counters, best so far, ETA, MLflow links."""
        return Sweep.model_validate_json(self.request("GET", f"/sweeps/{sweep_id}").content)

    def list(self, state: str | None = None, owner: str | None = None, limit: int = 50,
             offset: int = 0) -> SweepPage:
        """A page of sweeps, newest first (``.items``, ``.total``)."""
        params = {k: v for k, v in {"state": state, "owner": owner, "limit": limit,
                                    "offset": offset}.items() if v is not None}
        return SweepPage.model_validate_json(self.request("GET", "/sweeps", params=params).content)

    def cancel(self, sweep_id: str) -> Sweep:
        """Cancel a sweep (idempotent: an ended sweep is returned as it is)."""
        return Sweep.model_validate_json(self.request("POST", f"/sweeps/{sweep_id}/cancel").content)

    def wait(self, sweep_id: str, progress: bool = True, interval: float = 2.0,
             timeout: float | None = None) -> Sweep:
        """Poll until the sweep ends and return it (whatever the outcome: check ``.state``).

        Args:
            progress: draw a tqdm bar (trials finished of total, state, best, the API's ETA).
            interval: seconds between polls.
            timeout: give up after this many seconds (:class:`WaitTimeout`); None waits on.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = WaitBar(sweep_id) if progress else None
        try:
            while True:
                sweep = self.get(sweep_id)
                if bar is not None:
                    bar.update(sweep)
                if sweep.state in TERMINAL_SWEEP_STATES:
                    return sweep
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"sweep {sweep_id} is still {sweep.state} after "
                                      f"{timeout:g} s")
                time.sleep(interval)
        finally:
            if bar is not None:
                bar.close()

    def trials(self, sweep_id: str, state: str | None = None) -> builtins.list[Trial]:
        """Every trial of the sweep (all pages): config, state, latest metrics, run id."""
        items: builtins.list[Trial] = []
        while True:
            params: dict[str, Any] = {"limit": 500, "offset": len(items)}
            if state:
                params["state"] = state
            page = TrialPage.model_validate_json(
                self.request("GET", f"/sweeps/{sweep_id}/trials", params=params).content)
            items.extend(page.items)
            if not page.items or len(items) >= page.total:
                return items

    def report(self, sweep_id: str) -> Report:
        """The report of an ended sweep (:class:`ReportNotReady` before it is written)."""
        return Report.model_validate_json(self.request("GET", f"/sweeps/{sweep_id}/report").content)

    def report_json(self, sweep_id: str) -> dict[str, Any]:
        """The report exactly as stored (report.json), for renderers that take a dict."""
        report: dict[str, Any] = self.request("GET", f"/sweeps/{sweep_id}/report").json()
        return report

    def history(self, sweep_id: str, metrics: Sequence[str] | None = None) -> History:
        """Per-epoch curves of every trial (from MLflow, through the service); ``metrics``
        default to the report's curves (workers.contract.HISTORY_METRICS)."""
        params = {"metrics": ",".join(metrics)} if metrics else {}
        return History.model_validate_json(
            self.request("GET", f"/sweeps/{sweep_id}/history", params=params).content)

    # --- growth and comparison -------------------------------------------------------------

    def extend(self, sweep_id: str, *, seeds: Sequence[int] | None = None,
               alpha: Sequence[float] | None = None,
               loss_stacks: Sequence[str | Mapping[str, Any]] | None = None,
               models: Sequence[str] | None = None, beta: Sequence[float] | None = None,
               free_bits: Sequence[float] | None = None, primary: bool = False,
               allow_cancelled: bool = False, idempotency_key: str | None = None) -> ExtensionResult:
        """Add values to a sweep's axes (the owner's or an admin's); only the new trials run.

        ``primary`` declares the contrasts the extension adds primary before they run;
        ``allow_cancelled`` extends a cancelled sweep. Returns the sweep (queued again when
        it had ended), the extension's record, when its trials run and what it adds.
        """
        body = _extension_body(seeds, alpha, loss_stacks, models, beta, free_bits, primary,
                               allow_cancelled)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self.request("POST", f"/sweeps/{sweep_id}/extend", json=body, headers=headers)
        return ExtensionResult.model_validate_json(response.content)

    def validate_extension(self, sweep_id: str, *, seeds: Sequence[int] | None = None,
                           alpha: Sequence[float] | None = None,
                           loss_stacks: Sequence[str | Mapping[str, Any]] | None = None,
                           models: Sequence[str] | None = None,
                           beta: Sequence[float] | None = None,
                           free_bits: Sequence[float] | None = None) -> ExtensionPlan:
        """The dry run of :meth:`extend`: which rows are new, which trials exist (runs nothing)."""
        body = _extension_body(seeds, alpha, loss_stacks, models, beta, free_bits, False, False)
        response = self.request("POST", f"/sweeps/{sweep_id}/extend:validate", json=body)
        return ExtensionPlan.model_validate_json(response.content)

    def extensions(self, sweep_id: str) -> builtins.list[Extension]:
        """The sweep's extensions, oldest first."""
        response = self.request("GET", f"/sweeps/{sweep_id}/extensions")
        return [Extension.model_validate(item) for item in response.json()]

    def compare(self, sweep_ids: Sequence[str]) -> dict[str, Any]:
        """One report over several ended, compatible sweeps (report.json's shape, with
        ``compared`` listing them); :class:`ksweep.errors.Conflict` names the differing fields
        of sweeps that are not compatible."""
        report: dict[str, Any] = self.request(
            "GET", "/sweeps:compare", params={"ids": ",".join(sweep_ids)}).json()
        return report

    def compare_frames(self, sweep_ids: Sequence[str], metrics: Sequence[str] | None = None
                       ) -> Frames:
        """:meth:`frames` of :meth:`compare`'s report: the trials of every sweep (a
        ``sweep_id`` column says whose), the joined cells and contrasts, every curve."""
        from ksweep.tables import build_frames

        report = Report.model_validate(self.compare(sweep_ids))
        runs: builtins.list[dict[str, Any]] = []
        points: builtins.list[dict[str, Any]] = []
        for sweep_id in sweep_ids:
            history = self.history(sweep_id, metrics)
            runs += [run.model_dump() for run in history.runs]
            points += [point.model_dump() for point in history.points]
        return build_frames(report, runs, points)

    # --- DataFrames (pandas imported here, not at import) --------------------------------

    def frames(self, sweep_id: str, metrics: Sequence[str] | None = None) -> Frames:
        """``trials``, ``cells``, ``contrasts`` and ``history`` of an ended sweep as DataFrames
        (:mod:`ksweep.tables` says what each holds)."""
        from ksweep.tables import build_frames

        report = self.report(sweep_id)  # first: a sweep without a report fails fast
        history = self.history(sweep_id, metrics)
        return build_frames(report, [run.model_dump() for run in history.runs],
                            [point.model_dump() for point in history.points])

    def frame(self, sweep_id: str, table: str, metrics: Sequence[str] | None = None
              ) -> pd.DataFrame:
        """One table of :meth:`frames` by name (``trials|cells|contrasts|history``)."""
        if table not in TABLES:
            raise ValueError(f"table {table!r}: use one of {', '.join(TABLES)}")
        frame: pd.DataFrame = getattr(self.frames(sweep_id, metrics), table)
        return frame


def _extension_body(seeds: Sequence[int] | None, alpha: Sequence[float] | None,
                    loss_stacks: Sequence[str | Mapping[str, Any]] | None,
                    models: Sequence[str] | None, beta: Sequence[float] | None,
                    free_bits: Sequence[float] | None, primary: bool,
                    allow_cancelled: bool) -> dict[str, Any]:
    axes: dict[str, Any] = {"seeds": seeds, "alpha": alpha, "loss_stacks": loss_stacks,
                            "models": models, "beta": beta, "free_bits": free_bits}
    body: dict[str, Any] = {key: list(value) for key, value in axes.items() if value is not None}
    if primary:
        body["primary"] = True
    if allow_cancelled:
        body["allow_cancelled"] = True
    return body


def _problem_of(response: httpx.Response) -> Problem:
    try:
        return Problem.model_validate(response.json())
    except (ValueError, ValidationError):
        return Problem(title=response.reason_phrase or "error", status=response.status_code,
                       detail=response.text[:500] or None)


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None

