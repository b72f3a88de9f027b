"""What /help prints: the commands, the button words, who is an admin and the protocol's windows."""

from __future__ import annotations

from bot.adapters.terminal.operations import describe
from bot.config import Settings
from bot.protocol.engine import Engine
from bot.protocol.model import State, User

HELP = """\
operations (you act as {user}{admin}; clusters: {clusters}); any parameter may also be name=value:
{operations}
commands:
  /status [CLUSTER]          head, workers, jobs by owner, operation in progress
  /jobs CLUSTER              running and pending jobs and their owners
  /health [CLUSTER]          verdict, evidence and what to do (what the scheduled alerts judge)
  /check                     run the scheduled health check now (alerts fire after their streak)
  /unlock CLUSTER            admin: force-unlock a cluster (its open operation is cancelled)
  /cancel [OP]               cancel your newest open operation, or OP
  /link RAY_USER             link a Ray job owner name to you (you are asked before it is stopped)
  /unlink RAY_USER           admin: remove a Ray job owner name's link
  /as NAME                   act as NAME from now on (play the other job owners)
  /submit ENTRYPOINT...      start a job on the local cluster owned by you, e.g. /submit sleep 600
  /ops                       operations, newest first (their ids, for the words below)
  /show [OP]                 an operation's announcement as it reads now (edits print only what changed)
  /wait SECONDS              let time pass (scripts), at most {max_wait:.0f}
  /wait-state OP|newest STATE [TIMEOUT]   wait until an operation reaches STATE ({states})
  /help, /quit
the buttons of an announcement are words; each acts on the newest operation you can act on, or on OP:
  confirm [OP]               the requester goes ahead
  ok [OP], object [OP]       an affected job owner agrees / objects (ok again withdraws an objection)
  delay MINUTES [OP]         an affected owner asks for time to checkpoint ({delays})
  skip [OP]                  an affected owner: don't resubmit my jobs (backed up, not resubmitted)
  cancel [OP]                the requester or an admin drops it (also during the countdown)
  override [OP]              an admin passes the consent (and protection, with --override)
an alert's buttons are words too, on the newest firing alert or on CLUSTER's (Restart is /restart):
  silence HOURSh [CLUSTER]   hold the cluster's alerts (1h, 4h or 24h); they end by themselves
  clean [CLUSTER]            /clean-preempted of the alert's cluster
{admins}
windows: confirm {confirm}, consent {consent}, grace {grace} (from {config})"""


def duration(seconds: float) -> str:
    """`15 min` for whole minutes, else seconds: `1.5s`."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:g}s"


def help_text(engine: Engine, settings: Settings, user: User, admin_note: str, max_wait_s: float) -> str:
    w = engine.windows
    return HELP.format(
        user=user.name,
        operations="\n".join(describe(spec) for spec in engine.specs.values()),
        admin=", an admin" if engine.is_admin(user) else "",
        clusters=", ".join(engine.registry.clusters),
        max_wait=max_wait_s,
        states="|".join(s.value for s in State),
        delays=" or ".join(str(m) for m in w.delay_choices_min),
        admins=admin_note,
        confirm=duration(w.confirm_s),
        consent=duration(w.consent_s),
        grace=duration(w.grace_s),
        config=settings.config_path or "the defaults: no bot config file",
    )
