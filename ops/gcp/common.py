"""What the Google API clients of ops share: the one retry of transient errors (google-api-core Retry with
a deadline; Cloud TPU's too, without rate limits), the channel to the simulator, and one translation of a
permanent Google API error into an OpsError whose hint says what to do (permission denied names the role).
"""

from __future__ import annotations

import grpc
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type

from ops.errors import BadInput, OpsError, Refused

TRANSIENT = (
    exceptions.ServiceUnavailable,
    exceptions.DeadlineExceeded,
    exceptions.InternalServerError,
    exceptions.Aborted,
)
# A rate limit: RESOURCE_EXHAUSTED (a TooManyRequests) on Secret Manager, Cloud Build, Artifact Registry.
RATE_LIMITED = (exceptions.TooManyRequests,)


def retry(
    deadline_s: float = 60.0, initial_s: float = 0.5, maximum_s: float = 10.0, *, rate_limits: bool = True
) -> Retry:
    """Transient errors retried with exponential backoff until `deadline_s`. `rate_limits=False` for
    Cloud TPU, whose RESOURCE_EXHAUSTED is a quota or a stock-out: permanent, reported, never retried
    (GCP_API_FACTS.md 1.8)."""
    return Retry(
        predicate=if_exception_type(*TRANSIENT, *(RATE_LIMITED if rate_limits else ())),
        initial=initial_s,
        maximum=maximum_s,
        multiplier=2.0,
        timeout=deadline_s,
    )


def channel(endpoint: str) -> grpc.Channel:
    """An insecure channel to the simulator at host:port (no credentials, FINDINGS.md)."""
    return grpc.insecure_channel(endpoint)


def api_error(e: Exception, doing: str, role: str, project: str) -> OpsError:
    """A permanent error (or retries given up) as the OpsError the user sees. `doing` says what we tried
    ("read secret X"), never with a secret's value in it; `role` is the IAM role that allows it."""
    if isinstance(e, exceptions.RetryError):
        return OpsError(f"Google kept failing transiently while we tried to {doing}", "try again in a minute")
    if isinstance(e, exceptions.PermissionDenied):
        return Refused(
            f"no permission to {doing} in project {project}",
            f"grant the bot's service account {role} (gcloud projects add-iam-policy-binding {project} "
            f"--member=serviceAccount:... --role={role})",
        )
    if isinstance(e, exceptions.InvalidArgument):
        return BadInput(f"Google refused to {doing}: {e.message}")
    if isinstance(e, exceptions.GoogleAPICallError):
        return OpsError(f"could not {doing}: {e.message or type(e).__name__}")
    return OpsError(f"could not {doing}: {type(e).__name__}")
