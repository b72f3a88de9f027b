"""The operations the bot runs, one module each (`restart.py`), registered here by kind.

An operation is one `bot.protocol.model.Spec`: its parameters (a pydantic model extending `Params`, or
`ClusterParams` when it acts on a cluster; admin-only ones marked `Annotated[..., AdminOnly(why)]`), its
ceremony ("full": consent and grace; "announce": announced and run at once), its lease, whether it
needs a cluster, how it looks before acting (`look`), how it runs (`execute`), and how it reads
(`Texts`: title, announcement lines, failure, the report's line to owners, an extra owners' answer).
Adding one changes no line of the engine, the rules or an adapter beyond declaring its command:

1. `bot/operations/<kind>.py` builds its `Spec` (see `restart.py`); add it to `registered()` below.
2. Discord: one line in a cog's class body (`bot/adapters/cogs/operations.py`, or a cog of its own
   family): `add_worker = operation_command(registered()["add-worker"])`. The options come from the
   spec's model (names, types, defaults, `Field(description=...)`), the cluster option (autocompleted)
   when `needs_cluster`, the description from `summary`.
3. Terminal: nothing to declare. The terminal reads `engine.specs` and offers, for each kind,
   `/<kind> [CLUSTER] key=value ...` (CLUSTER when `spec.needs_cluster`; keys and defaults from
   `spec.params.model_fields`), and passes the words to `engine.request(user, kind, cluster, params)`,
   which validates them against the model (bad input lists the parameters).
"""

from __future__ import annotations

from bot.operations import add_worker, build_image, clean_preempted, restart, rotate_token
from bot.protocol.model import Spec
from ops.restart import Settings as RestartSettings
from ops.workers import Settings as WorkerSettings


def registered(
    restart_settings: RestartSettings | None = None, worker_settings: WorkerSettings | None = None
) -> dict[str, Spec]:
    """Every operation the bot offers, by kind (its command's name); tests pass shorter timings."""
    specs = [
        restart.spec(restart_settings),
        rotate_token.spec(restart_settings),
        add_worker.spec(worker_settings),
        clean_preempted.spec(worker_settings),
        build_image.spec(),
    ]
    return {s.kind: s for s in specs}
