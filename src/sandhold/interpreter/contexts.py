"""Execution contexts: one stateful interpreter each (a Jupyter kernel, a node or a bash process).

A context runs one execution at a time (its lock); executions of different contexts run
concurrently. An execution whose client went away is *abandoned*: the context interrupts the
running code, escalates to a restart when the interrupt is not obeyed, and only then takes the
next execution, so a timed-out request never leaves a context wedged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandhold.interpreter import outputs
from sandhold.interpreter.outputs import Event

log = logging.getLogger(__name__)

LANGUAGES = ("python", "javascript", "typescript", "bash", "r", "java")
ALIASES = {
    "js": "javascript",
    "ts": "typescript",
    "sh": "bash",
    "py": "python",
    "python3": "python",
}
# How long interrupted code may take to stop before its interpreter is restarted.
INTERRUPT_GRACE_S = 5.0


class ContextError(Exception):
    status = 400


class ContextNotFound(ContextError):
    status = 404


def normalize_language(language: str | None) -> str:
    if language is None:
        return "python"
    lang = language.strip().lower()
    lang = ALIASES.get(lang, lang)
    if lang not in LANGUAGES:
        raise ContextError(
            f"language {language!r} is not available in this sandbox "
            f"(available: {', '.join(LANGUAGES)})"
        )
    return lang


@dataclass
class Job:
    """One execution request as the context sees it."""

    code: str
    env_vars: dict[str, str]
    emit: Callable[[Event], None]
    abandoned: asyncio.Event = field(default_factory=asyncio.Event)


class Context(ABC):
    language: str = ""

    def __init__(self, context_id: str, cwd: str, env: dict[str, str]) -> None:
        self.id = context_id
        self.cwd = cwd
        self.env = env
        self.pending_env: dict[str, str] = {}
        self.lock = asyncio.Lock()
        self._ready: asyncio.Task[None] | None = None
        # Bumped whenever the interpreter is replaced; a job watching an older generation knows
        # its interpreter is gone on purpose.
        self.generation = 0

    def set_env(self, env: dict[str, str]) -> None:
        """Replace the environment the interpreter starts with; one already running takes what
        changed before its next execution (``pending_env``, for interpreters that can)."""
        self.pending_env.update({k: v for k, v in env.items() if self.env.get(k) != v})
        self.env = dict(env)

    def info(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # -- lifecycle ----------------------------------------------------------------------------
    def start_soon(self) -> asyncio.Task[None]:
        """Start the interpreter in the background (idempotent); executions wait for it."""
        if self._ready is None or (self._ready.done() and self._ready.exception() is not None):
            self._ready = asyncio.create_task(self._start(), name=f"start-{self.id}")
        return self._ready

    async def ensure_started(self) -> None:
        await asyncio.shield(self.start_soon())

    async def restart(self) -> None:
        """A fresh interpreter, now: a running execution ends with an error, queued ones run on
        the new interpreter."""
        self.generation += 1
        await self._stop()
        self._ready = None
        await self.ensure_started()

    async def close(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        await self._stop()

    # -- execution ----------------------------------------------------------------------------
    async def run(self, job: Job) -> None:
        """Run one job to completion; called with ``self.lock`` held."""
        try:
            await self.ensure_started()
        except Exception as e:
            log.exception("context %s failed to start", self.id)
            job.emit(outputs.error("ContextStartError", f"{self.language} context: {e}"))
            return
        await self._run(job)

    async def wait_finished(self, done: asyncio.Event, job: Job) -> bool:
        """Wait for the running code to finish; interrupt it when the job is abandoned and
        restart the interpreter when it dies or ignores the interrupt. True when it finished."""
        generation = self.generation
        interrupted_at: float | None = None
        abandoned = asyncio.ensure_future(job.abandoned.wait())
        try:
            while True:
                finished = asyncio.ensure_future(done.wait())
                waits: set[asyncio.Future[object]] = {finished}  # type: ignore[arg-type]
                if interrupted_at is None:
                    waits.add(abandoned)  # type: ignore[arg-type]
                await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                finished.cancel()
                if self.generation != generation:
                    job.emit(outputs.error("ContextRestarted", "the context was restarted"))
                    return False
                if done.is_set():
                    return True
                if not self._alive():
                    job.emit(
                        outputs.error(
                            "UnexpectedEndOfExecution",
                            f"the {self.language} interpreter exited while running this code; "
                            "it has been restarted and its state is lost",
                        )
                    )
                    await self._reset()
                    return False
                if job.abandoned.is_set():
                    if interrupted_at is None:
                        interrupted_at = time.monotonic()
                        await self._interrupt()
                    elif time.monotonic() - interrupted_at > INTERRUPT_GRACE_S:
                        log.warning("context %s ignored the interrupt; restarting it", self.id)
                        await self._reset()
                        return False
        finally:
            abandoned.cancel()

    async def _reset(self) -> None:
        self.generation += 1
        await self._stop()
        self._ready = None
        self.start_soon()

    # -- per interpreter ----------------------------------------------------------------------
    @abstractmethod
    async def _start(self) -> None: ...

    @abstractmethod
    async def _stop(self) -> None: ...

    @abstractmethod
    async def _run(self, job: Job) -> None: ...

    @abstractmethod
    async def _interrupt(self) -> None: ...

    @abstractmethod
    def _alive(self) -> bool: ...


ENV_PATH = "/sandhold/env"  # where the agent posts the sandbox's env after a warm start
READY_PATH = "/sandhold/ready"  # answers once the default kernel runs

# The directory holding our own `sandhold` package (/opt/sandhold/interpreter in a sandbox).
CODE_ROOT = str(Path(__file__).resolve().parents[2])


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of interpreters: ours, minus the server's own code on PYTHONPATH (user
    code must not import, or shadow, the server's copy of `sandhold`)."""
    env = dict(os.environ if base is None else base)
    if "PYTHONPATH" in env:
        parts = [p for p in env["PYTHONPATH"].split(":") if p and p.rstrip("/") != CODE_ROOT]
        if parts:
            env["PYTHONPATH"] = ":".join(parts)
        else:
            del env["PYTHONPATH"]
    return env


class ContextManager:
    def __init__(self, default_cwd: str, factories: dict[str, Callable[..., Context]]) -> None:
        self.default_cwd = default_cwd
        self.factories = factories
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}  # language -> id of its default context

    def _new(self, language: str, cwd: str) -> Context:
        ctx = self.factories[language](str(uuid.uuid4()), cwd, child_env())
        self.contexts[ctx.id] = ctx
        return ctx

    def set_env(self, env: dict[str, str]) -> None:
        """The sandbox's env changed (a warm start): contexts made from now on get it, and so
        do the ones already made, their running interpreter before its next execution."""
        os.environ.update(env)
        fresh = child_env()
        for ctx in self.contexts.values():
            ctx.set_env(fresh)

    def start_defaults(self, eager: tuple[str, ...] = ("python",)) -> None:
        """Default Python and JavaScript contexts exist from the start; the ones in ``eager``
        also start their interpreter now, so the first execution finds it warm."""
        for language in ("python", "javascript"):
            ctx = self.default_for(language)
            if language in eager:
                ctx.start_soon()

    def default_for(self, language: str) -> Context:
        ctx_id = self.defaults.get(language)
        if ctx_id is None or ctx_id not in self.contexts:
            ctx = self._new(language, self.default_cwd)
            self.defaults[language] = ctx.id
            return ctx
        return self.contexts[ctx_id]

    async def create(self, language: str | None, cwd: str | None) -> Context:
        lang = normalize_language(language)
        path = cwd or self.default_cwd
        if not path.startswith("/"):
            raise ContextError(f"cwd {path!r} must be an absolute path")
        if not os.path.isdir(path):
            raise ContextError(f"cwd {path!r} is not an existing directory")
        ctx = self._new(lang, path)
        try:
            await ctx.ensure_started()
        except Exception as e:
            self.contexts.pop(ctx.id, None)
            await ctx.close()
            raise ContextError(f"the {lang} context failed to start: {e}") from e
        return ctx

    def get(self, context_id: str) -> Context:
        ctx = self.contexts.get(context_id)
        if ctx is None:
            raise ContextNotFound(f"context {context_id!r} does not exist")
        return ctx

    def list(self) -> list[Context]:
        return list(self.contexts.values())

    async def remove(self, context_id: str) -> None:
        ctx = self.get(context_id)
        del self.contexts[context_id]
        for lang, default_id in list(self.defaults.items()):
            if default_id == context_id:
                del self.defaults[lang]
        await ctx.close()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.contexts.values()), return_exceptions=True)
        self.contexts.clear()
