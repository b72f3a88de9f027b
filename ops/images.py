"""The cluster image: built through Cloud Build, pushed to the Artifact Registry of every region the
registry uses, pinned in the store, and kept there by cleanup policies that spare what clusters run.

- `build_image`: one Cloud Build per project from the Dockerfile the registry names (`dockerfile`),
  every region's repository created if absent, tagged `latest`, the git short hash, the UTC date and
  one tag no other build has (`<hash>-<date>-<time>`, the pin). It restarts
  nothing: its result lists the clusters whose next start takes the new image. Its tags and build ids
  are kept per operation (`images/ops/<op>.json`): run again (the bot resuming after its own restart),
  it follows the build it started instead of starting another.
- The pin: `images/pin.json` in the store, per project and region ({tag, digest, who, when, op}), so the
  bot records it without a git checkout. `render_for_start` renders a cluster's config from the
  registry plus that pin (`<image>:<pin tag>@<digest>`: exact even if someone re-pushes the tag) and
  records what the cluster runs from then on (`images/started/<cluster>.json`). The committed
  `infra/<cluster>.yaml` stay rendered from the registry alone, so `update-configs --check` compares
  what it always did (README, "The cluster image and its pin").
- `set_registry_cleanup`: Artifact Registry cleanup policies (GCP_API_FACTS 5.2) per repository: keep
  every pinned or running tag, keep the newest `keep_count` versions, delete what is older than
  `keep_days`; a keep wins over a delete. Our three policies replace only themselves; a team's other
  policies stay. build_image refreshes them after pinning wherever they are set.

The git short hash comes from `CLUSTERBOT_GIT_SHA` (the bot's image bakes it in at its own build: it
has no checkout), else from `git` in the build context, marked `-dirty` when the context has changes.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from ops.context import Context
from ops.errors import BadInput, OpsError
from ops.gcp.artifacts import CleanupRule
from ops.registry import REPO_ROOT, Cluster, Registry
from ops.store import Conflict, dump, read_model

REVISION_ENV = "CLUSTERBOT_GIT_SHA"
PIN_KEY = "images/pin.json"
STARTED_PREFIX = "images/started/"
ATTEMPTS_PREFIX = "images/ops/"  # each build-image operation's tags and builds, for a resume
# Our cleanup policies' ids: set_registry_cleanup replaces these and leaves any other policy alone.
KEEP_PINNED = "clusterbot-keep-pinned"
KEEP_NEWEST = "clusterbot-keep-newest"
DELETE_OLD = "clusterbot-delete-old"
OURS = (KEEP_PINNED, KEEP_NEWEST, DELETE_OLD)
MAX_POLICIES = 10  # Artifact Registry's limit per repository (GCP_API_FACTS 5.2)
_REVISION = re.compile(r"^[0-9a-f]{7,40}(-dirty)?$")

Progress = Callable[[str], None]


def _quiet(line: str) -> None:
    pass


class Settings(BaseModel):
    """How images are built and kept; tests pass a small source tree and short timings."""

    context: Path = REPO_ROOT  # the build context: packed and uploaded as Cloud Build's source
    dockerfile: str | None = None  # relative to `context`; None: the registry's `dockerfile`
    timeout_s: int = Field(default=3600, gt=0)  # Cloud Build's own timeout for the build
    keep_days: int = Field(default=30, gt=0)  # versions older than this are deleted...
    keep_count: int = Field(default=16, gt=0)  # ...except the newest this many and every pinned one


# -- where images go -----------------------------------------------------------------------------------
class Target(BaseModel):
    """One regional repository the image is pushed to, and the clusters that pull from it."""

    project: str
    region: str
    repository: str  # the Artifact Registry repository id
    image: str  # <region>-docker.pkg.dev/<project>/<repository>/<image name>, no tag
    clusters: list[str]

    @property
    def key(self) -> str:
        return f"{self.project}/{self.region}"


def targets(registry: Registry, regions: list[str] | None = None) -> list[Target]:
    """The repositories of `regions` (default: every region a GCP cluster is in; the local cluster's only
    when named, or when the registry has no GCP cluster). BadInput names the valid regions."""
    clusters = list(registry.clusters.values())
    known = sorted({c.region for c in clusters})
    if regions:
        wanted = {r.strip() for r in regions if r.strip()}
        unknown = sorted(wanted - set(known))
        if unknown:
            raise BadInput(
                f"no cluster is in region {', '.join(unknown)}", f"valid regions: {', '.join(known)}"
            )
        chosen = [c for c in clusters if c.region in wanted]
    else:
        chosen = [c for c in clusters if c.driver == "gcp"] or clusters
    out: dict[tuple[str, str], Target] = {}
    for c in chosen:
        t = out.setdefault(
            (c.project, c.region),
            Target(project=c.project, region=c.region, repository=registry.image_repository,
                   image=registry.image(c), clusters=[]),
        )  # fmt: skip
        t.clusters.append(c.name)
    return [out[k] for k in sorted(out)]


def _cloud_of(registry: Registry, target: Target) -> Cluster:
    """A cluster through whose context entry the target's project is reached (Google or a simulator)."""
    return registry.clusters[target.clusters[0]]


# -- the source's revision -----------------------------------------------------------------------------
def git_revision(context: Path) -> str:
    """The short hash the image is tagged with: `CLUSTERBOT_GIT_SHA` (baked into the bot's image), else
    `git` in `context` (with `-dirty` when the context has uncommitted changes). OpsError when neither."""
    baked = os.environ.get(REVISION_ENV, "").strip().lower()
    if baked:
        if not _REVISION.match(baked):
            raise BadInput(
                f"{REVISION_ENV}={baked!r} is not a git short hash", "set it to `git rev-parse --short HEAD`"
            )
        return baked
    try:
        sha = _git(context, "rev-parse", "--short", "HEAD")
        dirty = _git(context, "status", "--porcelain", "--", ".")
    except (OSError, subprocess.SubprocessError):
        raise OpsError(
            f"the git revision of {context} is unknown: no git checkout there, and {REVISION_ENV} is unset",
            "the bot's image is built with --build-arg GIT_SHA=$(git rev-parse --short HEAD) "
            "(docker/bot/Dockerfile); elsewhere, build from a git checkout",
        ) from None
    return f"{sha}-dirty" if dirty else sha


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    return done.stdout.strip()


# -- the pin -------------------------------------------------------------------------------------------
class Pin(BaseModel):
    """The image a region's clusters start with: one build's unique tag and its digest."""

    image: str  # the repository path, no tag
    tag: str  # the build's own tag (<hash>-<date>-<time>): no other build has it
    digest: str  # sha256:...
    tags: list[str]  # every tag the build pushed (latest, hash, date, the pin tag)
    built_at: datetime
    by: str
    op: str  # the operation that built it (a chat op id, or the CLI's)
    build_id: str

    @property
    def ref(self) -> str:
        """What `docker pull` gets: the tag for people, the digest for Docker (it ignores the tag)."""
        return f"{self.image}:{self.tag}@{self.digest}"


class Pins(BaseModel):
    regions: dict[str, Pin] = Field(default_factory=dict)  # "<project>/<region>" -> pin


class Started(BaseModel):
    """What a cluster's last start ran (recorded by `render_for_start`): cleanup keeps its tag."""

    cluster: str
    image: str  # the full reference the config named
    tag: str
    digest: str  # "" when started from the registry's tag, before any pin
    started_at: datetime


def pins(ctx: Context) -> Pins:
    got = read_model(ctx.store, PIN_KEY, Pins)
    return Pins() if got is None else got[0]


def _record_pins(ctx: Context, new: dict[str, Pin]) -> Pins:
    """Merge `new` into the store's pins by compare-and-set (another build may pin other regions)."""
    for _ in range(20):
        got = read_model(ctx.store, PIN_KEY, Pins)
        current = Pins() if got is None else got[0]
        current.regions.update(new)
        try:
            if got is None:
                ctx.store.create(PIN_KEY, dump(current))
            else:
                ctx.store.replace(PIN_KEY, dump(current), got[1])
            return current
        except Conflict:
            continue
    raise OpsError("the image pin kept changing under us: it was not recorded", "run build-image again")


def started(ctx: Context, cluster: str) -> Started | None:
    got = read_model(ctx.store, f"{STARTED_PREFIX}{cluster}.json", Started)
    return None if got is None else got[0]


def image_for_start(ctx: Context, cluster: Cluster) -> tuple[str, Pin | None]:
    """The image reference the cluster's next start runs: its region's pin, else the registry's tag."""
    pin = pins(ctx).regions.get(f"{cluster.project}/{cluster.region}")
    if pin is not None and pin.image == ctx.registry.image(cluster):
        return pin.ref, pin
    return f"{ctx.registry.image(cluster)}:{cluster.image_tag}", None


def render_for_start(ctx: Context, cluster: Cluster) -> str | None:
    """The config a start of `cluster` must use: the registry and the template, with the store's pinned
    image (None for a cluster with no generated config: the local one). Records it as what the cluster
    runs from now on, so cleanup keeps it. Call it right before the driver starts the cluster."""
    from ops.configs import render_cluster

    ref, pin = image_for_start(ctx, cluster)
    text = render_cluster(ctx.registry, cluster, image=ref) if cluster.driver == "gcp" else None
    record = Started(
        cluster=cluster.name,
        image=ref,
        tag=pin.tag if pin else cluster.image_tag,
        digest=pin.digest if pin else "",
        started_at=datetime.now(UTC),
    )
    ctx.store.put(f"{STARTED_PREFIX}{cluster.name}.json", dump(record))
    return text


def behind(ctx: Context, cluster_names: list[str]) -> list[str]:
    """Of `cluster_names`, those whose next start takes another image than their last one did."""
    out = []
    for name in cluster_names:
        cluster = ctx.registry.clusters[name]
        ref, _ = image_for_start(ctx, cluster)
        last = started(ctx, name)
        if last is None or last.image != ref:
            out.append(name)
    return out


# -- build ---------------------------------------------------------------------------------------------
class ImageBuild(BaseModel):
    """What build-image did: the pin per region, the builds, and who takes the image at their restart."""

    by: str
    op: str
    revision: str
    tags: list[str]
    pins: dict[str, Pin]  # "<project>/<region>" -> the new pin
    builds: list[str]  # Cloud Build ids, one per project
    log_urls: list[str]
    duration_s: float
    to_restart: list[str]  # clusters whose next restart takes the new image
    cleanup_refreshed: list[str] = Field(default_factory=list)  # repositories whose keep list was updated
    warnings: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        pin = next(iter(self.pins.values()))
        regions = ", ".join(k.split("/", 1)[1] for k in self.pins)
        lines = [
            f"built {pin.tag} ({pin.digest[:19]}) from {self.revision} in {self.duration_s:.0f} s, pushed to "
            f"{regions} as {', '.join(self.tags)}",
            "pinned: new starts of these regions' clusters run it; nothing was restarted",
        ]
        if self.to_restart:
            lines.append(
                "takes it at its next restart: " + ", ".join(f"{c} (/restart {c})" for c in self.to_restart)
            )
        else:
            lines.append("every cluster of these regions already runs it")
        if self.cleanup_refreshed:
            lines.append(f"cleanup now also keeps it in {', '.join(self.cleanup_refreshed)}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def build_image(
    ctx: Context,
    by: str,
    regions: list[str] | None = None,
    op: str = "",
    progress: Progress = _quiet,
    settings: Settings | None = None,
    now: datetime | None = None,
) -> ImageBuild:
    """Build the cluster image once per project, push it to every target region under its tags, verify
    each region holds it, pin it, refresh the cleanup keep lists. BuildFailed (an OpsError) carries the
    log's tail; nothing is pinned unless every region of the build holds the image."""
    settings = settings or Settings()
    if settings.dockerfile is None:
        settings = settings.model_copy(update={"dockerfile": ctx.registry.dockerfile})
    started_at = time.monotonic()
    chosen = targets(ctx.registry, regions)
    attempt = _attempt(ctx, op, settings, now)
    revision, tags, now = attempt.revision, attempt.tags, attempt.at
    pin_tag = tags[-1]
    op = attempt.op
    by_project: dict[str, list[Target]] = {}
    for t in chosen:
        by_project.setdefault(t.project, []).append(t)
    new: dict[str, Pin] = {}
    build_ids, log_urls = [], []
    for group in by_project.values():
        pins_of, build_id, log_url = _build_in_project(ctx, attempt, group, progress, settings)
        for t in group:
            new[t.key] = Pin(image=t.image, tag=pin_tag, digest=pins_of[t.key], tags=tags, built_at=now,
                             by=by, op=op, build_id=build_id)  # fmt: skip
        build_ids.append(build_id)
        log_urls.append(log_url)
    _record_pins(ctx, new)
    progress(f"pinned {pin_tag} for {', '.join(t.region for t in chosen)}")
    warnings: list[str] = []
    refreshed: list[str] = []
    try:
        refreshed = _refresh_cleanup(ctx, chosen, settings, progress)
    except OpsError as e:  # the new image is the newest: keep-newest holds it meanwhile
        warnings.append(
            f"the cleanup keep lists were not refreshed ({e}); run `python -m ops set-registry-cleanup`"
        )
    names = [c for t in chosen for c in t.clusters]
    return ImageBuild(
        by=by, op=op, revision=revision, tags=tags, pins=new, builds=build_ids, log_urls=log_urls,
        duration_s=time.monotonic() - started_at, to_restart=behind(ctx, names),
        cleanup_refreshed=refreshed, warnings=warnings,
    )  # fmt: skip


class _Attempt(BaseModel):
    """One build-image operation's choices, kept so that running it again (the bot resuming an operation
    after its own restart) follows the same builds under the same tags instead of starting new ones."""

    op: str
    revision: str
    tags: list[str]  # latest, hash, date, the pin tag (last)
    at: datetime
    builds: dict[str, str] = Field(default_factory=dict)  # project -> Cloud Build id, once started


def _attempt(ctx: Context, op: str, settings: Settings, now: datetime | None) -> _Attempt:
    """The operation's attempt: the one recorded for `op`, else a new one (recorded)."""
    if op:
        got = read_model(ctx.store, f"{ATTEMPTS_PREFIX}{op}.json", _Attempt)
        if got is not None:
            return got[0]
    revision = git_revision(settings.context)
    now = now or datetime.now(UTC)
    pin_tag = f"{revision}-{now:%Y%m%d-%H%M%S}"
    attempt = _Attempt(op=op or f"cli-{pin_tag}", revision=revision, at=now,
                       tags=["latest", revision, f"{now:%Y%m%d}", pin_tag])  # fmt: skip
    ctx.store.put(f"{ATTEMPTS_PREFIX}{attempt.op}.json", dump(attempt))
    return attempt


def _build_in_project(
    ctx: Context, attempt: _Attempt, group: list[Target], progress: Progress, settings: Settings
) -> tuple[dict[str, str], str, str]:
    """One build pushing to every region of one project: ({target key: digest}, build id, log URL)."""
    cloud = _cloud_of(ctx.registry, group[0])
    project = group[0].project
    artifacts, builds = ctx.artifacts(cloud), ctx.builds(cloud)
    pin_tag = attempt.tags[-1]
    build_id = attempt.builds.get(project)
    if build_id is None:
        build_id = _start_build(ctx, attempt, group, progress, settings)
    else:
        progress(f"following build {build_id}, started before")
    done = builds.wait(
        build_id,
        timeout_s=settings.timeout_s + 600,  # Cloud Build times the build out itself; queueing comes on top
        progress=lambda b: progress(f"build {b.id} {b.status}"),
    )
    pushed = {i.name: i.digest for i in done.images}
    digests: dict[str, str] = {}
    for t in group:
        ref = f"{t.image}:{pin_tag}"
        digest = pushed.get(ref)
        image_name = t.image.rsplit("/", 1)[1]
        held = artifacts.tags(t.region, t.repository, image_name).get(pin_tag)
        if not digest or held != digest:
            raise OpsError(
                f"build {done.id} succeeded but {t.region}'s registry does not hold {ref} "
                f"(pushed: {digest or 'nothing'}, registry: {held or 'nothing'}); nothing was pinned",
                f"see {done.log_url}",
            )
        digests[t.key] = digest
    progress(f"pushed {digests[group[0].key][:19]} to {', '.join(t.region for t in group)}")
    return digests, done.id, done.log_url


def _start_build(
    ctx: Context, attempt: _Attempt, group: list[Target], progress: Progress, settings: Settings
) -> str:
    """Create the repositories, upload the source, start the build, record its id; the build's id."""
    cloud = _cloud_of(ctx.registry, group[0])
    project = group[0].project
    artifacts, builds = ctx.artifacts(cloud), ctx.builds(cloud)
    for t in group:
        artifacts.ensure_repository(t.region, t.repository, "the cluster image (clusterbot build-image)")
    progress(f"repositories ready in {', '.join(t.region for t in group)}")
    bucket = f"{project}_cloudbuild"  # where `gcloud builds submit` puts sources too
    try:
        source = builds.upload_source(settings.context, bucket, prefix="clusterbot/source")
    except Exception as e:
        raise OpsError(
            f"could not upload the build's source to gs://{bucket}: {type(e).__name__}: {e}",
            f"create the bucket (gcloud storage buckets create gs://{bucket} --project={project}) and let "
            "the bot's service account write to it",
        ) from None
    progress(f"source uploaded ({settings.dockerfile})")
    images = [f"{t.image}:{tag}" for t in group for tag in attempt.tags]
    build = builds.docker_build(
        bucket, source, images, dockerfile=settings.dockerfile, timeout_s=settings.timeout_s
    )
    attempt.builds[project] = build.id
    ctx.store.put(f"{ATTEMPTS_PREFIX}{attempt.op}.json", dump(attempt))
    progress(f"build {build.id} {build.status} in {project}")
    return build.id


# -- cleanup -------------------------------------------------------------------------------------------
class RepositoryCleanup(BaseModel):
    project: str
    region: str
    repository: str
    kept_tags: list[str]  # pinned or running: never deleted
    rules: list[CleanupRule]  # ours, as set
    others: list[str]  # ids of the repository's other policies, left as they were
    dry_run: bool


class CleanupResult(BaseModel):
    repositories: list[RepositoryCleanup]
    keep_days: int
    keep_count: int

    def summary(self) -> str:
        lines = []
        for r in self.repositories:
            kept = ", ".join(r.kept_tags) or "none pinned yet"
            dry = " (dry run: Artifact Registry only reports)" if r.dry_run else ""
            others = f"; other policies kept: {', '.join(r.others)}" if r.others else ""
            lines.append(f"{r.region}/{r.repository}: keeps {kept}{others}{dry}")
        lines.append(
            f"deletes versions older than {self.keep_days} days, except the newest {self.keep_count} "
            "versions (one version per build, whatever its tags) and those tags; Artifact Registry applies "
            "it about daily"
        )
        return "\n".join(lines)


def kept_tags(ctx: Context, target: Target) -> list[str]:
    """The tags cleanup must never delete in `target`: its pin and what its clusters last started with."""
    tags = set()
    pin = pins(ctx).regions.get(target.key)
    if pin is not None:
        tags.add(pin.tag)
    for name in target.clusters:
        last = started(ctx, name)
        if last is not None and last.image.startswith(f"{target.image}:"):
            tags.add(last.tag)
    return sorted(tags)


def cleanup_rules(kept: list[str], settings: Settings) -> list[CleanupRule]:
    """Our policies: a keep wins over a delete, so what is pinned or newest survives the age rule."""
    rules = [
        CleanupRule(id=KEEP_NEWEST, action="KEEP", keep_count=settings.keep_count),
        CleanupRule(id=DELETE_OLD, action="DELETE", tag_state="ANY", older_than_s=settings.keep_days * 86400),
    ]
    if kept:  # tag prefixes: a pin tag is unique, so as a prefix it matches only itself
        rules.insert(0, CleanupRule(id=KEEP_PINNED, action="KEEP", tag_state="TAGGED", tag_prefixes=kept))
    return rules


def set_registry_cleanup(
    ctx: Context,
    regions: list[str] | None = None,
    dry_run: bool = False,
    progress: Progress = _quiet,
    settings: Settings | None = None,
) -> CleanupResult:
    """Set our cleanup policies on every target repository (created if absent), keeping its others."""
    settings = settings or Settings()
    out = [_set_cleanup(ctx, t, dry_run, settings, progress) for t in targets(ctx.registry, regions)]
    return CleanupResult(repositories=out, keep_days=settings.keep_days, keep_count=settings.keep_count)


def _set_cleanup(
    ctx: Context, t: Target, dry_run: bool, settings: Settings, progress: Progress
) -> RepositoryCleanup:
    artifacts = ctx.artifacts(_cloud_of(ctx.registry, t))
    repo = artifacts.ensure_repository(t.region, t.repository, "the cluster image (clusterbot build-image)")
    others = [r for r in repo.cleanup if r.id not in OURS]
    kept = kept_tags(ctx, t)
    ours = cleanup_rules(kept, settings)
    if len(others) + len(ours) > MAX_POLICIES:
        raise BadInput(
            f"{t.region}/{t.repository} has {len(others)} cleanup policies of its own: with our "
            f"{len(ours)} that is over Artifact Registry's {MAX_POLICIES}",
            "remove some of them (gcloud artifacts repositories delete-cleanup-policies)",
        )
    artifacts.set_cleanup(t.region, t.repository, others + ours, dry_run=dry_run)
    progress(f"{t.region}/{t.repository}: cleanup set, keeping {', '.join(kept) or 'the newest only'}")
    return RepositoryCleanup(project=t.project, region=t.region, repository=t.repository, kept_tags=kept,
                             rules=ours, others=[r.id for r in others], dry_run=dry_run)  # fmt: skip


def _refresh_cleanup(ctx: Context, chosen: list[Target], settings: Settings, progress: Progress) -> list[str]:
    """Where our policies are set, set them again so the new pin is kept; elsewhere nothing."""
    refreshed = []
    for t in chosen:
        repo = ctx.artifacts(_cloud_of(ctx.registry, t)).get_repository(t.region, t.repository)
        if repo is None or not any(r.id in OURS for r in repo.cleanup):
            continue
        _set_cleanup(ctx, t, repo.cleanup_dry_run, settings, progress)
        refreshed.append(t.region)
    return refreshed
