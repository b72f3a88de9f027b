"""Time in the terminal chat: /wait and /wait-state (bounded, Ctrl-C ends them), and the end of a
script, where the clock keeps running until operations counting down or executing reach their report
(bounded); operations still waiting for someone's answer stay persisted for the next start."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from bot.adapters.terminal.chat import TerminalChat
from bot.protocol.engine import Engine
from bot.protocol.model import State

if TYPE_CHECKING:
    from bot.adapters.terminal.commands import Terminal

MAX_WAIT_S = 3600.0  # /wait and /wait-state are bounded
WAIT_STATE_DEFAULT_S = 900.0
END_WAIT_S = 900.0  # end of a script: how long operations counting down or executing are waited for
MOVING = (State.GRACE, State.EXECUTING)  # states that end on their own, without anyone's answer


async def pause(term: Terminal, seconds: float) -> bool:
    """Sleep, unless interrupted first (then False)."""
    try:
        await asyncio.wait_for(term.interrupted.wait(), timeout=seconds)
    except TimeoutError:
        return True
    return False


async def cmd_wait(term: Terminal, args: list[str]) -> None:
    try:
        seconds = float(args[0]) if len(args) == 1 else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_WAIT_S:
        term.reply(f"usage: /wait SECONDS (0 to {MAX_WAIT_S:.0f})", ok=False)
        return
    term.interrupted.clear()
    term.waiting = True
    try:
        if not await pause(term, seconds):
            term.note("wait interrupted")
    finally:
        term.waiting = False


async def cmd_wait_state(term: Terminal, args: list[str]) -> None:
    states = [s.value for s in State]
    usage = f"usage: /wait-state OP|newest STATE [TIMEOUT_S]; states: {', '.join(states)}"
    if len(args) not in (2, 3) or args[1] not in states:
        term.reply(usage, ok=False)
        return
    try:
        timeout = float(args[2]) if len(args) == 3 else WAIT_STATE_DEFAULT_S
    except ValueError:
        timeout = -1.0
    if not 0 <= timeout <= MAX_WAIT_S:
        term.reply(f"{usage} (TIMEOUT_S at most {MAX_WAIT_S:.0f})", ok=False)
        return
    op_id = term.resolve(args[0])
    if op_id is None:
        return
    term.interrupted.clear()
    term.waiting = True
    try:
        term.note(await _wait_state(term, op_id, State(args[1]), timeout))
    finally:
        term.waiting = False


async def _wait_state(term: Terminal, op_id: str, want: State, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        op = term.engine.ops[op_id]
        if op.state == want:
            return f"{op_id} is {want.value}"
        if not op.open:
            return f"{op_id} ended {op.state.value}, not {want.value}"
        if time.monotonic() > deadline:
            return f"timed out after {timeout:g}s: {op_id} is {op.state.value}, not {want.value}"
        if not await pause(term, 0.1):
            return f"wait interrupted: {op_id} is {op.state.value}"


async def while_moving(engine: Engine, chat: TerminalChat, deadline: float) -> None:
    """Keep the engine's clock running until no operation counts down or executes, or the deadline.
    Each step of an operation shows in the chat, so each post or edit is a moment to look again."""
    loop = asyncio.get_running_loop()
    while any(o.state in MOVING for o in engine.ops.values()):
        left = deadline - loop.time()
        if left <= 0:
            return
        chat.changed.clear()
        try:  # bounded: a state change that shows nothing is still seen within a second
            await asyncio.wait_for(chat.changed.wait(), min(left, 1.0))
        except TimeoutError:
            pass


async def leave(term: Terminal, chat: TerminalChat, interactive: bool) -> int:
    """After the last line: follow a script's operations through (its last word, say `confirm`, is
    followed up to the report), stop the clock, wait for what executes; 1 when something still runs."""
    engine = term.engine
    loop = asyncio.get_running_loop()
    deadline = loop.time() + END_WAIT_S
    if not interactive:
        moving = [o.op_id for o in engine.ops.values() if o.state in MOVING]
        if moving:
            term.note(f"end of script: waiting (at most {END_WAIT_S / 60:.0f} min) for {', '.join(moving)}")
        await while_moving(engine, chat, deadline)
    # The clock stops, so nothing more starts executing while we leave; what executes already goes on
    # (its lease renews itself) and is waited for, up to its report.
    await engine.close()
    executing = [o.op_id for o in engine.ops.values() if o.state == State.EXECUTING]
    if executing and interactive:
        term.note(f"waiting (at most {END_WAIT_S / 60:.0f} min) for {', '.join(executing)} to finish")
    code = 0
    try:
        await engine.wait_executing(max(deadline - loop.time(), 0.0))
    except TimeoutError:
        term.note("still executing; the next start resumes it")
        code = 1
    left = [o for o in engine.ops.values() if o.open and o.state != State.EXECUTING]
    if left:
        term.note(
            "left pending (persisted; the next start picks them up): "
            + ", ".join(f"{o.op_id} ({o.state.value})" for o in left)
        )
    return code
