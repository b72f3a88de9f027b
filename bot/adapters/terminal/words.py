"""The buttons of an announcement as words: `confirm`, `ok`, `delay 10`, `object`, `skip`, `cancel`,
`override`. Each acts on the newest operation the user can act on, or on an operation id given after
the word. An alert's buttons too: `silence 4h` and `clean`, on the newest firing alert or on a cluster's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.alerts.model import TARGET
from bot.protocol.model import Reply

if TYPE_CHECKING:
    from bot.adapters.terminal.commands import Terminal

WORDS = ("confirm", "ok", "delay", "object", "skip", "cancel", "override", "silence", "clean")
ALERT_WORDS = ("silence", "clean")


async def press_alert(term: Terminal, action: str, args: list[str]) -> None:
    """`silence HOURSh [CLUSTER]`, `clean [CLUSTER]`: the alert's button, as the acting user."""
    arg = ""
    if action == "silence":
        if not args:
            term.reply("silence needs hours, e.g. silence 4h", ok=False)
            return
        arg, args = args[0] if args[0].endswith("h") else args[0] + "h", args[1:]
    firing = list(term.monitor.book.firing.values()) if term.monitor else []
    if args:
        firing = [a for a in firing if a.cluster == args[0]]
    if len(args) > 1 or not firing:
        term.reply(f"usage: {action}{' HOURS' if arg else ''} [CLUSTER], on a firing alert (none)", ok=False)
        return
    alert = max(firing, key=lambda a: a.fired_at)
    term.show(await term.engine.act(term.user, f"{TARGET}:{alert.key}", action, arg))


async def press(term: Terminal, action: str, args: list[str]) -> None:
    """Press the button `action` (with `delay`'s minutes first in `args`) as the acting user."""
    if action in ALERT_WORDS:
        await press_alert(term, action, args)
        return
    arg = ""
    if action == "delay":
        choices = term.engine.windows.delay_choices_min
        if not args or not args[0].isdigit():
            term.reply(f"delay needs minutes: {' or '.join(f'delay {m}' for m in choices)}", ok=False)
            return
        arg, args = args[0], args[1:]
    if len(args) > 1:
        term.reply(f"usage: {action}{' MINUTES' if arg else ''} [OP]", ok=False)
        return
    if args:
        op_id = term.resolve(args[0])
        if op_id is None:
            return
    else:
        op = term.engine.newest_for(term.user, action)
        if op is None:  # nothing this user may do: let the engine say why on the newest open one
            open_ops = [o for o in term.engine.ops.values() if o.open]
            if not open_ops:
                term.reply(f"there is no open operation to {action}", ok=False)
                return
            op = max(open_ops, key=lambda o: o.created_at)
        op_id = op.op_id
    r = await term.engine.act(term.user, op_id, action, arg)
    term.show(Reply(r.text if op_id in r.text else f"{r.text} ({op_id})", r.ephemeral, r.ok))
