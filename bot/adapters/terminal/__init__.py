"""The terminal chat: the same engine as Discord, in a terminal, against the local Ray cluster.

The local default (`python -m bot` with no DISCORD_TOKEN): the local cluster is brought up if it is
down (ops.local.boot, as `ops local up` does), users are plain names (`/as NAME` switches who is
typing), a Ray job owner "bob" is chat user "bob" (a user's id is their name, so a bot config for the
terminal names its admins), and the buttons of an announcement become words (`confirm`, `ok`,
`delay 10`, `object`, `skip`, `cancel`, `override`) that act on the newest operation the user can act
on, or on an operation id given after the word. A `#` starts a comment, on its own line or after a
command. Every bot message is printed with a prefix: `[#infra 3]` for a channel post (message 3),
`[#infra edit 3]` for an edit of it (only the lines that changed), `[to alice]` for a reply to alice,
`[clusterbot]` for the terminal's own notes.

Interactive when standard input is a terminal (a prompt naming the acting user, the engine's timers
running meanwhile); otherwise a script, read line by line, each line handled before the next and
echoed after the prompt. At the end of a script the clock keeps running and operations counting down
or executing are waited for (bounded), up to their report; operations still waiting for consent stay
persisted in the store, and the next start picks them up.

By concern: console (tty and line I/O), chat (the engine's Chat), commands (what a line means),
words (buttons as words), help, script (waits and the end of a script), app (running it).
"""

from bot.adapters.terminal.app import main, run
from bot.adapters.terminal.chat import TerminalChat
from bot.adapters.terminal.console import Console

__all__ = ["Console", "TerminalChat", "main", "run"]
