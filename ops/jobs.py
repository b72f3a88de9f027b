"""Jobs and their owners: who runs what on a cluster, submitting one with its owner, and a faithful
backup of each job.

Owner, in order: job metadata `user`; else `<user>` of a `ray-run-<user>-...` submission id (as the
operators' `ray_run.py` writes them); else unknown (`raysubmit_*`). The values of `runtime_env`
env_vars are secrets to us: `public_runtime_env` is the only form that may be shown anywhere.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from ops.errors import BadInput, OpsError
from ops.ray_api import PROBE_PREFIX, RayApi

if TYPE_CHECKING:
    from ops.context import Context
    from ops.registry import Cluster

ACTIVE = ("PENDING", "RUNNING")
_RAY_RUN = re.compile(r"^ray-run-([A-Za-z0-9_.]+)-")
REDACTED = "<redacted>"


def owner_of(submission_id: str | None, metadata: dict[str, str] | None) -> tuple[str | None, str]:
    """(owner, how we know): ("alice", "metadata"), ("bob", "submission id") or (None, "unknown")."""
    user = (metadata or {}).get("user")
    if user:
        return user, "metadata"
    m = _RAY_RUN.match(submission_id or "")
    if m:
        return m.group(1), "submission id"
    return None, "unknown"


def public_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The runtime_env with every env_vars value replaced: safe for text, JSON and chat."""
    env = dict(runtime_env or {})
    if isinstance(env.get("env_vars"), dict):
        env["env_vars"] = dict.fromkeys(env["env_vars"], REDACTED)
    return env


class Job(BaseModel):
    """A running or pending job as people see it."""

    submission_id: str
    status: str
    owner: str | None
    owner_source: Literal["metadata", "submission id", "unknown"]
    entrypoint: str
    start_time: float | None = None  # seconds since the epoch
    runtime_env: dict[str, Any] = Field(default_factory=dict)  # always the public form

    @property
    def owner_label(self) -> str:
        return self.owner or "unknown"

    def age_s(self, now: float | None = None) -> float | None:
        return None if self.start_time is None else max(0.0, (now or time.time()) - self.start_time)


def active_jobs(api: RayApi) -> list[Job]:
    """Running and pending submitted jobs, oldest first (probes and finished jobs left out).

    Read as the dashboard's JSON (`/api/jobs/`, what Ray's job client parses into JobDetails), with a
    timeout: a listing costs no Ray import and a tenth of the CPU, which a bot answering a burst of
    /jobs needs (issue 10)."""
    jobs = []
    for d in api.job_details():
        status, sid = str(d.get("status")), d.get("submission_id")
        if sid is None or status not in ACTIVE or sid.startswith(PROBE_PREFIX):
            continue
        owner, source = owner_of(sid, d.get("metadata"))
        start = d.get("start_time")
        jobs.append(
            Job(
                submission_id=sid,
                status=status,
                owner=owner,
                owner_source=source,
                entrypoint=d.get("entrypoint") or "",
                start_time=start / 1000 if start else None,
                runtime_env=public_runtime_env(d.get("runtime_env")),
            )
        )
    return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id))


def submit_job(
    ctx: Context, cluster: Cluster, entrypoint: str | list[str], owner: str, **options: Any
) -> str:
    """Submit a job owned by `owner` (job metadata `user`, as the restart's backup reads it); returns
    its submission id. A list is words as a shell gave them, quoted again (`shlex.join`) so that
    `sh -c 'echo a b'` stays one argument; a string is the command line as typed. `options` are
    JobSubmissionClient.submit_job's (submission_id, runtime_env, entrypoint_num_cpus, ...).
    Blocks on the dashboard: call from a thread in the bot."""
    command = shlex.join(entrypoint) if isinstance(entrypoint, list) else entrypoint.strip()
    if not command:
        raise BadInput("a job needs an entrypoint", "e.g. sleep 600, or python train.py")
    metadata = {**(options.pop("metadata", None) or {}), "user": owner}
    api = ctx.ray(cluster)
    try:
        return api.submit(entrypoint=command, metadata=metadata, **options)
    except OpsError:
        raise
    except Exception as e:  # Ray's: "Request failed with status code 500: <the agent's traceback>\n."
        said = [line.strip() for line in str(e).splitlines() if any(c.isalnum() for c in line)]
        why = said[-1] if said else type(e).__name__  # a traceback's last line says why
        raise OpsError(f"the job was not accepted by {cluster.name}: {why[:300]}") from None


class BackedUpJob(BaseModel):
    """Everything needed to submit a job again, as written to the durable store before any stop.

    `runtime_env` here is the full one (secrets included): it lives only in the store.
    """

    submission_id: str
    status: str
    owner: str | None
    owner_source: str
    entrypoint: str
    metadata: dict[str, str] = Field(default_factory=dict)
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    entrypoint_num_cpus: float | None = None
    entrypoint_num_gpus: float | None = None
    entrypoint_memory: int | None = None
    entrypoint_resources: dict[str, float] | None = None
    packages: dict[str, str] = Field(default_factory=dict)  # gcs:// uri -> store key of its bytes
    not_preserved: list[str] = Field(default_factory=list)  # what this backup could not keep

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"runtime_env"}) | {
            "runtime_env": public_runtime_env(self.runtime_env)
        }

    def submit_kwargs(self, new_id: str, op_id: str) -> dict[str, Any]:
        """Arguments for JobSubmissionClient.submit_job: same job, owner kept, link to the old id."""
        metadata = dict(self.metadata)
        if self.owner:
            metadata["user"] = self.owner
        metadata["clusterbot_resubmitted_from"] = self.submission_id
        metadata["clusterbot_operation"] = op_id
        kwargs: dict[str, Any] = {
            "entrypoint": self.entrypoint,
            "submission_id": new_id,
            "metadata": metadata,
            "runtime_env": self.runtime_env or None,
        }
        for name in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory"):
            value = getattr(self, name)
            if value:
                kwargs[name] = value
        if self.entrypoint_resources:
            kwargs["entrypoint_resources"] = self.entrypoint_resources
        return kwargs


def package_uris(runtime_env: dict[str, Any]) -> list[str]:
    """The `gcs://` packages a runtime_env points at: they live in the cluster's GCS and die with it."""
    uris = [runtime_env.get("working_dir")] + list(runtime_env.get("py_modules") or [])
    return [u for u in uris if isinstance(u, str) and u.startswith("gcs://")]


_RESUBMIT_SUFFIX = re.compile(r"-r[0-9a-f]{6}(-[0-9]+)?$")


def resubmitted_id(old_id: str, op_id: str, attempt: int = 1) -> str:
    """A deterministic new id per (job, operation, attempt): a retried submission is refused as a
    duplicate by Ray instead of running twice; a job whose resubmission failed (it did not keep
    running) gets a new attempt number. The suffix of an earlier restart is replaced, not stacked."""
    return f"{_RESUBMIT_SUFFIX.sub('', old_id)}-r{op_id[-6:]}" + (f"-{attempt}" if attempt > 1 else "")
