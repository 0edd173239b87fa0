"""The terminal as a channel: ``nanobot agent`` runs a gateway with this one channel.

Lines typed are handed to an intake (the gateway's); messages for the chat are printed. The
person at the terminal owns the bot, so no access gate applies.

On a terminal, input is read with prompt_toolkit: line editing, arrows, and a history kept
in ``$NANOBOT_HOME/cli_history``; printing goes above the prompt line, replies rendered as
Markdown (rich). Ctrl-C during a turn cancels it (as ``/stop`` does), Ctrl-C at an idle
prompt or Ctrl-D leaves. From a pipe (or with one message, ``-m``), lines are read by a daemon
thread, so an interrupt or the end of the program never waits on it, and replies are printed
as written. At the end of input, what was asked is answered before the channel is done.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

from nanobot.api.channel import keep_sent
from nanobot.channel_plugin import BaseChannel, Intake
from nanobot.bus import InboundMessage, OutboundMessage
from nanobot.chat_commands import COMMANDS
from nanobot.logs import terminal_line
from nanobot.terminal_client import PIPED, aside_text
from nanobot.eventloop import Background
from nanobot.utf8 import for_terminal

PROMPT = "you> "
PARTIAL_LINES = 12  # the most of a block being written that the prompt area shows


def render_markdown(text: str) -> str:
    """Markdown as a terminal shows it (rich): bold, lists, highlighted code, line breaks kept, no
    trailing padding."""
    import io
    import shutil

    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(file=io.StringIO(), force_terminal=True, width=shutil.get_terminal_size().columns)
    # A link as its words and then its target: a terminal hyperlink (OSC 8) would show only the
    # words, which a steered reply can make look like another address.
    markdown = Markdown(text, hyperlinks=False)
    for block in markdown.parsed:  # a line break is one, as in chat apps and on the page (markdown-it's breaks)
        for token in block.children or ():
            if token.type == "softbreak":
                token.type = "hardbreak"
    console.print(markdown)
    lines = [line.rstrip(" ") for line in console.file.getvalue().split("\n")]  # type: ignore[attr-defined]
    return "\n".join(lines).strip("\n") + "\n"


def complete_blocks(text: str) -> int:
    """Where the Markdown blocks that are surely whole end: after the last blank line outside a
    code fence (the block after it may still grow)."""
    end = pos = 0
    fenced = False
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith("\n"):
            break
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and not line.strip():
            end = pos
    return end


class TerminalStream:
    """A reply printed as it is written, then finished by the final text.

    Without ``render`` (a pipe), text goes out raw, word by word. Under an input prompt it goes
    out as Markdown blocks, each rendered by ``render`` once whole and printed above the
    prompt, while the block being written stays in the prompt area (``partial``):
    prompt_toolkit redraws its prompt after every write, so a partial line printed above it
    would be cut in two, and Markdown cannot be rendered before its block ends.
    """

    def __init__(self, write: Callable[[str], None], *, render: Callable[[str], str] | None = None) -> None:
        self.write = write
        self.render = render
        self.printed = ""  # the reply's text printed so far (as written, before rendering)
        self.partial = ""  # under a prompt: the block being written, not yet printed

    def feed(self, text: str) -> None:
        """The visible reply so far; only what extends what is printed is written."""
        shown = self.printed + self.partial
        if not text.startswith(shown) or len(text) == len(shown):
            return  # a new model call rewrote the text: the final reply shows it
        if self.render is None:
            self.write(text[len(self.printed):])
            self.printed = text
            return
        done = text[:complete_blocks(text)]
        if len(done) > len(self.printed):
            self._print_blocks(done[len(self.printed):])
            self.printed = done
        self.partial = text[len(done):]

    def finish(self, reply: str) -> None:
        """The final reply: the rest of it when it continues what was printed, else all of it."""
        self.partial = ""
        if self.printed and reply.startswith(self.printed):
            rest = reply[len(self.printed):]
        else:
            rest = ("\n" if self.printed and not self.printed.endswith("\n") else "") + reply
        if self.render is not None:
            self._print_blocks(rest)
        else:
            self.write(rest + "\n" if not rest.endswith("\n") else rest)
        self.printed = ""

    def _print_blocks(self, text: str) -> None:
        if self.render is not None and text.strip():
            self.write(("\n" if self.printed else "") + self.render(text))  # a blank line between blocks


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
    if text:
        terminal_line(ended=text.endswith("\n"))  # log lines wait for the end of the reply's line


class CliChannel(BaseChannel):
    name = "cli"
    max_message_len = 1_000_000

    def __init__(self, intake: Intake, session_key: str, *, mode: str | None = None,
                 message: str | None = None, piped: bool = False, history_file: Path | None = None,
                 chat_folder: Callable[[str], Awaitable[Path]] | None = None) -> None:
        # No config section and no gate (BaseChannel's __init__ is not run): the terminal is the owner's.
        self.receiving = Background()  # the reader of the lines typed
        self.intake = intake  # the gateway's (nanobot agent), or the running gateway's socket (remote_chat)
        self.channel, _, self.chat_id = session_key.partition(":")
        # In process, ``--session telegram:123`` runs that chat here: its replies are the terminal's
        # (the gateway routes a chat's messages by its channel's name; no Telegram runs here).
        self.name = self.channel  # type: ignore[misc]  (a ClassVar elsewhere: as ApiChannel's)
        self.mode = mode  # the execution mode the lines typed ask for (``nanobot agent --mode``)
        self.message = message  # ``-m``: this one message instead of reading lines
        self.piped = piped  # ``message`` carries what was piped in: outside content
        self.history_file = history_file
        self.chat_folder = chat_folder  # in process, where the files the chat is sent are kept
        self.answers: list[asyncio.Future[str]] = []  # one per message handed in: its reply
        self._input_ended = asyncio.Event()
        self._tty = message is None and sys.stdin.isatty() and sys.stdout.isatty()
        self._streams: dict[Any, TerminalStream] = {}  # stream_id -> what is printed of it
        self._line_open = False  # what was printed last did not end its line (a reply being written)
        self._prompt: Any = None  # the prompt_toolkit session, to redraw the line being written

    async def start(self) -> None:
        self.receiving.run(self._read(), name="terminal input")

    async def stop(self) -> None:
        await self.receiving.stop()

    async def finished(self) -> list[str]:
        """Once input has ended (EOF, Ctrl-D, Ctrl-C when idle, "exit") and what was asked is
        answered: the replies."""
        await self._input_ended.wait()
        return list(await asyncio.gather(*self.answers))

    def _busy(self) -> bool:
        return any(not answer.done() for answer in self.answers)

    async def send(self, msg: OutboundMessage) -> None:
        if content := for_terminal(msg.content):
            stream = self._streams.pop(msg.stream_id, None)
            if stream is None:  # on a terminal, patch_stdout puts it above the prompt line
                # (from a pipe, a note or file of the turn may come while its reply is being written)
                self._write(render_markdown(content) if self._tty else ("\n" * self._line_open) + content + "\n")
            else:
                stream.finish(content)
                self._redraw()

    async def send_file(self, msg: OutboundMessage) -> None:
        """In process, a file (a spoken reply too) is kept in the chat's ``sent/``, as the
        gateway's terminal socket keeps it, and a line says where (through a gateway, that
        line comes with the answer)."""
        if self.chat_folder is None or msg.file is None:
            return await super().send_file(msg)
        relative = await keep_sent(await self.chat_folder(f"{self.channel}:{self.chat_id}"), msg.file)
        await self.send(OutboundMessage(msg.channel, msg.chat_id,
                                        aside_text({"file": {"path": relative, "caption": msg.content}})))

    async def send_stream(self, msg: OutboundMessage) -> None:
        """The reply as it is written: word by word (under the prompt, in the prompt area)."""
        stream = self._streams.get(msg.stream_id)
        if stream is None:
            stream = self._streams[msg.stream_id] = TerminalStream(self._write,
                                                                     render=render_markdown if self._tty else None)
        stream.feed(for_terminal(msg.content))
        self._redraw()

    def _write(self, text: str) -> None:
        write_stdout(text)
        self._line_open = text[-1:] != "\n" if text else self._line_open

    def _prompt_message(self) -> str:
        partial = next((s.partial for s in self._streams.values() if s.partial), "")
        partial = "\n".join(partial.splitlines()[-PARTIAL_LINES:])  # a long block keeps the prompt in view
        return f"{partial}\n{PROMPT}" if partial else PROMPT

    def _redraw(self) -> None:
        if self._prompt is not None and self._prompt.app.is_running:
            self._prompt.app.invalidate()

    async def send_typing(self, chat_id: str) -> None:
        return None  # the prompt line already shows that the bot is working

    async def _read(self) -> None:
        lines = self._terminal_lines() if self._tty else self._piped_lines()
        try:
            async for line in lines:
                line = line.strip()
                if line in ("exit", "quit"):
                    return
                if line:
                    await self._hand_in(line)
        finally:
            self._input_ended.set()

    async def _hand_in(self, text: str) -> None:
        msg = InboundMessage(self.channel, self.chat_id, "owner", text, mode=self.mode,
                             untrusted=PIPED if self.piped else None)  # with -m, the one message
        msg.reply_future = asyncio.get_running_loop().create_future()  # /stop's too: "Nothing is running."
        self.answers.append(msg.reply_future)
        await self.intake.accept([msg])

    async def _terminal_lines(self):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.completion import WordCompleter
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.patch_stdout import patch_stdout

        history = FileHistory(str(self.history_file)) if self.history_file else InMemoryHistory()
        # "/" at the start of a line lists the chat commands, as Telegram's and Discord's menus do.
        commands = WordCompleter([f"/{name}" for name, _, _ in COMMANDS], sentence=True,
                                 meta_dict={f"/{name}": what for name, _, what in COMMANDS})
        session: PromptSession[str] = PromptSession(history=history, completer=commands,
                                                    complete_while_typing=True)
        self._prompt = session
        with patch_stdout(raw=True):
            while True:
                try:
                    yield await session.prompt_async(self._prompt_message)
                except KeyboardInterrupt:  # cancels the running turn, or leaves when none runs
                    if not self._busy():
                        return
                    await self._hand_in("/stop")
                except EOFError:
                    return

    async def _piped_lines(self):
        if self.message is not None:
            yield self.message
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        def pump() -> None:  # a daemon thread: never joined, so it cannot hold up the exit
            sys.stdin.reconfigure(errors="replace")  # invalid bytes must not end the chat
            for line in sys.stdin:
                loop.call_soon_threadsafe(queue.put_nowait, line)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=pump, name="stdin", daemon=True).start()
        while (line := await queue.get()) is not None:
            yield line
