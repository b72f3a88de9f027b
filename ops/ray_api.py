"""How we talk to one cluster's Ray: the dashboard's HTTP API with the cluster's token.

The dashboard is the window on a remote cluster (jobs, nodes, autoscaler status). A faithful job
backup needs two things the dashboard does not expose (FINDINGS): the entrypoint resources kept in
the JobInfo in the GCS internal KV, and the bytes of `gcs://` working_dir packages. Those come from
the GCS port when this machine can reach it (`cluster.gcs_address`); otherwise the backup says what
it could not keep.
"""

from __future__ import annotations

import base64
import functools
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from ops.errors import BadInput, OpsError
from ops.gcs_reader import SNAPSHOT_PREFIX, read_gcs, read_via_job
from ops.registry import Cluster

HTTP_TIMEOUT_S = 10.0
# Ray's job client, per request (connect, and each wait for bytes): generous, as a submission waits for
# the head's job agent, but bounded.
JOB_CLIENT_TIMEOUT_S = 60.0
PROBE_PREFIX = "clusterbot-probe-"  # readiness probes and snapshot jobs: never shown as jobs
assert SNAPSHOT_PREFIX.startswith(PROBE_PREFIX), "snapshot jobs must be hidden from job lists"


class Reach(StrEnum):
    """What one look at the dashboard saw. Only OK means the head answered us; REFUSED means a head is
    there but rejects our token; UNREACHABLE (timeout, refused connection, 5xx) says nothing about
    whether the head exists: never read it as "dead" (ask the driver, `Driver.head_exists`)."""

    OK = "ok"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"


class TokenRefused(BadInput):
    """The dashboard answered 401/403: a head is running and our token is wrong or missing."""


class DashboardAnswered(OpsError):
    """The dashboard answered with an HTTP error other than 401/403: `http_code` says which."""

    def __init__(self, reason: str, http_code: int) -> None:
        super().__init__(reason)
        self.http_code = http_code


class RayApi:
    def __init__(
        self, cluster: Cluster, url: str | None = None, token: Callable[[], str | None] | None = None
    ) -> None:
        """`url`: where this machine reaches the dashboard now (the driver knows: `Driver.dashboard_url`);
        the registry's `dashboard_url` by default. `token`: how to get the cluster's Ray token, called
        on first use (`Context.ray` passes Secret Manager at the cluster's pinned version); without
        it, this machine's copy (the registry's `token`, what `ops token` writes)."""
        self.cluster = cluster
        self.url = (url or cluster.dashboard_url).rstrip("/")
        self._read_token = token or cluster.read_token
        self._from_secret = token is not None and cluster.token_secret is not None
        self._token_read = False
        self._token_value: str | None = None
        self._jobs = None

    @property
    def _token(self) -> str | None:
        if not self._token_read:
            self._token_value = self._read_token()
            self._token_read = True
        return self._token_value

    @property
    def headers(self) -> dict[str, str]:
        token = self._token
        return {"Authorization": f"Bearer {token}"} if token else {}

    # -- plain HTTP -----------------------------------------------------------------------------
    def _get(self, path: str, timeout: float = HTTP_TIMEOUT_S) -> Any:
        req = urllib.request.Request(self.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise self._http_error(e.code, path) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise self._unreachable(e) from None

    def _http_error(self, code: int, path: str) -> OpsError:
        if code in (401, 403):
            return self.token_refused(code)
        return DashboardAnswered(f"the {self.cluster.name} dashboard answered HTTP {code} to {path}", code)

    def token_refused(self, code: int) -> TokenRefused:
        source = self.cluster.token
        if self._from_secret:
            where = f"Secret Manager, secret {self.cluster.token_secret} at the cluster's pinned version"
            hint = (
                f"was the token rotated by hand? `python -m ops rotate-token --cluster {self.cluster.name}`"
            )
        else:
            where = (
                "no token source in the registry"
                if source is None
                else f"the token file {source.path()}"
                if source.file
                else f"the environment variable {source.env}"
            )
            hint = f"refresh this machine's copy: `python -m ops token --cluster {self.cluster.name}`"
        sent = "our token" if self._token else "no token (none found on this machine)"
        return TokenRefused(
            f"the {self.cluster.name} dashboard refused {sent} (HTTP {code}); token read from {where}", hint
        )

    def _unreachable(self, e: BaseException) -> OpsError:
        reason = getattr(e, "reason", e)
        return OpsError(
            f"cannot reach the {self.cluster.name} dashboard at {self.url}: {reason}",
            "is the head up? `python -m ops status --cluster " + self.cluster.name + "`",
        )

    def probe(self, timeout: float = 2.0) -> tuple[Reach, int | None]:
        """One look at the dashboard: (what it saw, the HTTP status when there was one). A token that
        cannot be read (Secret Manager out of reach) is UNREACHABLE too: nothing could be read."""
        try:
            headers = self.headers
        except OpsError:
            return Reach.UNREACHABLE, None
        req = urllib.request.Request(self.url + "/api/version", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return Reach.OK, resp.status
        except urllib.error.HTTPError as e:
            return (Reach.REFUSED if e.code in (401, 403) else Reach.UNREACHABLE), e.code
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
            return Reach.UNREACHABLE, None

    def reachable(self, timeout: float = 2.0) -> bool:
        """Whether the dashboard answers (and accepts our token) right now. Read-only views only: an
        operation that may stop something asks `wait_reachable`, which tells a refusal from a timeout."""
        return self.probe(timeout)[0] == Reach.OK

    def wait_reachable(self, deadline_s: float, probe_timeout: float = 2.0) -> bool:
        """Probe with backoff until the dashboard answers (True) or `deadline_s` passed (False).

        A 401/403 raises TokenRefused at once: retrying will not change our token."""
        end = time.monotonic() + deadline_s
        pause = 0.5
        while True:
            reach, code = self.probe(probe_timeout)
            if reach == Reach.OK:
                return True
            if reach == Reach.REFUSED:
                raise self.token_refused(code or 401)
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 5.0)

    def nodes(self, timeout: float = HTTP_TIMEOUT_S) -> list[dict[str, Any]]:
        """Alive and dead nodes from the state API."""
        return self.state("nodes", limit=10000, detail=True, timeout=timeout)

    def state(
        self,
        resource: str,
        *filters: tuple[str, str, str],
        limit: int = 100,
        detail: bool = False,
        timeout: float = HTTP_TIMEOUT_S,
    ) -> list[dict[str, Any]]:
        """A list from Ray's state API (`nodes`, `tasks`, `actors`...), filtered by (key, "=" or "!=",
        value) triples, e.g. `state("tasks", ("node_id", "=", nid), ("state", "=", "RUNNING"))`."""
        query = [("limit", str(limit)), ("detail", "1" if detail else "0")]
        for key, predicate, value in filters:
            query += [("filter_keys", key), ("filter_predicates", predicate), ("filter_values", value)]
        got = self._get(f"/api/v0/{resource}?{urllib.parse.urlencode(query)}", timeout)
        return (got or {}).get("data", {}).get("result", {}).get("result", [])

    def cluster_status(self, timeout: float = HTTP_TIMEOUT_S) -> dict[str, Any]:
        """The autoscaler's last report (`/api/cluster_status`): with Ray's v1 autoscaler a structured
        `clusterStatus` (autoscalerReport, loadMetricsReport; the dashboard camel-cases keys); with v2,
        which writes no structured report, `autoscalingStatus` text. {} when neither is there."""
        got = (self._get("/api/cluster_status", timeout) or {}).get("data") or {}
        if got.get("clusterStatus"):
            return got
        text = (self._get("/api/cluster_status?format=1", timeout) or {}).get("data") or {}
        return {"autoscalingStatus": text.get("clusterStatus")} if text.get("clusterStatus") else {}

    def job_details(self, timeout: float = HTTP_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every job as the dashboard lists it (`/api/jobs/`), bounded by `timeout`: for reads that must
        not hang (health), where the job client has no timeout of its own."""
        got = self._get("/api/jobs/", timeout)
        if not isinstance(got, list):  # an empty or odd 200 (a proxy's page): not "no jobs"
            raise OpsError(f"the {self.cluster.name} dashboard's job list is not one: {str(got)[:80]}")
        return got

    # -- jobs -------------------------------------------------------------------------------------
    @property
    def jobs(self):  # noqa: ANN201 - ray.job_submission.JobSubmissionClient
        """Ray's job client, every request of it bounded by JOB_CLIENT_TIMEOUT_S (Ray's has no timeout:
        a stalled dashboard would hold a restart, and its lock, for ever)."""
        if self._jobs is None:
            try:
                self._jobs = _bounded_job_client()(self.url, headers=self.headers)
            except Exception as e:  # ConnectionError, or Ray's own on 401/403
                raise self._unreachable(e) from None
        return self._jobs

    def list_jobs(self) -> list[Any]:
        try:
            return self.jobs.list_jobs()
        except OpsError:
            raise
        except Exception as e:
            raise OpsError(f"cannot list jobs on {self.cluster.name}: {_short(e)}") from None

    def submit(self, **kwargs: Any) -> str:
        return self.jobs.submit_job(**kwargs)

    def stop(self, submission_id: str) -> bool:
        return self.jobs.stop_job(submission_id)

    def status(self, submission_id: str, timeout: float = HTTP_TIMEOUT_S) -> str | None:
        """The job's status (RUNNING, FAILED...); None only when the dashboard answered that it knows
        no such job (HTTP 404). A dashboard that does not answer raises OpsError: it has not said the
        job is gone, and a restart must never read it as gone."""
        try:
            got = self._get(f"/api/jobs/{urllib.parse.quote(submission_id, safe='')}", timeout)
        except DashboardAnswered as e:
            if e.http_code == 404:
                return None
            raise
        status = (got or {}).get("status")
        if not status:
            raise OpsError(f"the {self.cluster.name} dashboard gave no status for job {submission_id}")
        return str(status)

    def upload_package(self, uri: str, data: bytes) -> None:
        """Put a working_dir package back into the cluster's GCS through the dashboard."""
        protocol, _, name = uri.partition("://")
        r = self.jobs._do_request("PUT", f"/api/packages/{protocol}/{name}", data=data)
        if r.status_code != 200:
            raise OpsError(f"uploading package {uri} to {self.cluster.name} failed: HTTP {r.status_code}")

    def wait_accepting(self, timeout: float) -> None:
        """Wait until the job agent accepts submissions (the dashboard answers before it does).

        The probe job it submits is deleted later by `delete_finished_probes`, not waited for here."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.submit(entrypoint="true", submission_id=f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}")
                return
            except Exception as e:
                last = e
                self._jobs = None
                time.sleep(1.0)
        raise OpsError(
            f"{self.cluster.name} did not accept a job submission within {timeout:.0f}s: {_short(last)}"
        )

    def delete_finished_probes(self) -> None:
        """Best effort: remove readiness probes that have finished, so job lists stay clean."""
        try:
            for d in self.list_jobs():
                status = str(getattr(d.status, "value", d.status))
                if (d.submission_id or "").startswith(PROBE_PREFIX) and status in (
                    "SUCCEEDED",
                    "FAILED",
                    "STOPPED",
                ):
                    self.jobs.delete_job(d.submission_id)
        except Exception:
            pass

    # -- what only the GCS has ----------------------------------------------------------------------
    def snapshot(self, via_job: bool | None = None) -> dict[str, Any]:
        """JobInfo of every job (entrypoint resources) and the bytes of the `gcs://` packages that
        unfinished jobs use: from the GCS port when this machine reaches it, else through a job on
        the cluster (ops/gcs_reader.py). OpsError when it cannot be read."""
        if via_job is None:
            via_job = self.cluster.gcs_address is None
        got = read_via_job(self) if via_job else read_gcs(self.cluster.gcs_address or "", self._token)
        got["packages"] = {u: None if b is None else base64.b64decode(b) for u, b in got["packages"].items()}
        return got


def _short(e: BaseException | None) -> str:
    text = str(e or "unknown error").strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


@functools.cache
def _bounded_job_client() -> type:
    """JobSubmissionClient with a timeout on every request it makes (it passes `**kwargs` of its one
    `_do_request` to `requests.request`). Made on first use: importing Ray's client costs 0.3 s."""
    from ray.job_submission import JobSubmissionClient

    class BoundedJobSubmissionClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", JOB_CLIENT_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kwargs)

    return BoundedJobSubmissionClient
