"""Permits of a redsem semaphore (the Redis module ``sem``) for redis-py.

Install it with ``pip install clients/python`` (the package redsem-client). It needs Python
3.8 or later and redis-py 5 or later (tested with 8.1). Where the server has the module loaded
it sends the module's commands; where it has not (a managed service), it runs the same
operations as a Lua script (``redsem.lua``, shipped in this package) over the same keys, found
out once per connection pool with ``COMMAND INFO SEM.ACQUIRE``. What only the module can do
(``bound``, sets, wait_empty) raises ModuleRequired there.

    import redis
    from redsem import Semaphore, NotAcquired, PermitLost

    r = redis.Redis()
    with Semaphore(r, "jobs", limit=3, lease=30, wait=10) as permit:
        ...  # at most 3 holders here; call permit.check() in long work to stop early

A permit holds a connection of its own from the client's pool, from the acquire to the release:
``WAIT`` (for a permit, and for replicas with ``durable_replicas``) blocks the connection it is
sent on, ``BOUND`` ties the permit to that connection, and ``WAIT numreplicas`` covers the
writes of the connection that sends it. So a pool needs one connection per permit held or
waited for at once (``redis.BlockingConnectionPool`` blocks when they run out). The reply of a
waiting acquire is read for ``wait`` plus the pool's ``socket_timeout`` (with redis-py before
8, whose default ``socket_timeout`` is None, a ``socket_timeout`` you set must exceed ``wait``,
and without the module 1 s, the longest BLPOP of a wait).

The identifier is made here (a UUID v4) unless ``identifier=`` gives one, so a retried acquire
(redis-py retries on connection errors) renews the same holder rather than taking a second
permit.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import importlib.resources
import inspect
import math
import threading
import time
import uuid
import weakref
from types import TracebackType
from typing import Any, List, Optional, Sequence, Tuple, Type, TypeVar, Union, cast

import redis
import redis.asyncio

__all__ = [
    "Semaphore",
    "AsyncSemaphore",
    "Permit",
    "AsyncPermit",
    "SemaphoreSet",
    "AsyncSemaphoreSet",
    "PermitSet",
    "AsyncPermitSet",
    "acquire_all",
    "acquire_all_async",
    "wait_empty",
    "wait_empty_async",
    "stored_limit",
    "stored_limit_async",
    "set_limit",
    "set_limit_async",
    "clear_limit",
    "clear_limit_async",
    "SemaphoreError",
    "NotAcquired",
    "PermitLost",
    "NotDurable",
    "ModuleRequired",
]

Identifier = Union[str, bytes]
# A command's arguments as redis-py sends them.
Args = List[Union[str, bytes, int, float]]
# A semaphore of a set: (name, limit) for one permit, or (name, limit, count).
SemaphoreSpec = Union[Tuple[Identifier, int], Tuple[Identifier, int, int]]


def _execute(conn: redis.Redis, *args: Union[str, bytes, int, float]) -> Any:
    """conn.execute_command, whose signature some redis-py releases leave untyped."""
    return cast(Any, conn).execute_command(*args)


async def _execute_async(conn: redis.asyncio.Redis, *args: Union[str, bytes, int, float]) -> Any:
    """As _execute, for redis.asyncio."""
    return await cast(Any, conn).execute_command(*args)


class SemaphoreError(Exception):
    """Base class of this module's errors (errors of the server or the connection are redis-py's
    own: ``redis.ResponseError``, ``redis.ConnectionError``, ...)."""


class NotAcquired(SemaphoreError):
    """No permit was granted: the semaphore was full (for ``wait`` seconds, when waiting)."""


class PermitLost(SemaphoreError):
    """The permit ran out before it was given back (its lease ended, or another client removed
    it): from then on another holder may have held it, so the work it guarded may have
    overlapped another holder's."""


class NotDurable(SemaphoreError):
    """Fewer replicas than ``durable_replicas`` acknowledged the grant in time; the permit was
    given back. ``acked`` and ``wanted`` are the numbers of replicas."""

    def __init__(self, message: str, acked: int, wanted: int) -> None:
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted


class ModuleRequired(SemaphoreError):
    """The server has no redsem module loaded, and what was asked needs it (``bound``, a set of
    semaphores, wait_empty): raised before anything is sent. Everything else works without the
    module, through the script."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs the redsem module loaded in the server")
        self.what = what


def _seconds(value: float) -> str:
    """Seconds as the module reads them: digits, and up to 3 decimals (milliseconds)."""
    ms = round(value * 1000)
    if ms == 0 and value > 0:
        ms = 1  # a positive time never rounds down to "no time"
    return f"{ms // 1000}.{ms % 1000:03d}"


def _add_note(exc: BaseException, note: str) -> None:
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(note)


# How long a reply may take on top of the server's own wait when that wait has no limit (the
# module's longest WAIT is a year).
_NO_LIMIT = 31536000.0


def _run_blocking(conn: redis.Redis, args: Args, block: Optional[float]) -> Any:
    """Runs a command that may block ``block`` seconds in the server (None: without limit) on a
    single-connection client. The reply is read for that long plus the connection's
    socket_timeout (redis-py 8 sets 5 s by default, shorter than many waits), and not retried
    (a retried wait would join the end of the line)."""
    connection = conn.connection
    if connection is None:
        raise SemaphoreError("a single-connection client has no connection")
    base = connection.socket_timeout
    if (
        block == 0
        or base is None
        or "timeout" not in inspect.signature(connection.read_response).parameters
    ):
        return _execute(conn, *args)
    cast(Any, connection).send_command(*args)  # untyped in some redis-py releases
    # On a timeout redis-py closes the connection (the server then drops the waiter).
    return connection.read_response(timeout=(_NO_LIMIT if block is None else block) + base)


async def _run_blocking_async(conn: redis.asyncio.Redis, args: Args, block: Optional[float]) -> Any:
    """As _run_blocking, for redis.asyncio."""
    await conn.initialize()
    connection = conn.connection
    if connection is None:
        raise SemaphoreError("a single-connection client has no connection")
    base = connection.socket_timeout
    if block == 0 or base is None:
        return await _execute_async(conn, *args)
    timeout = (_NO_LIMIT if block is None else block) + base
    loop = asyncio.get_running_loop()
    started = loop.time()
    await connection.send_command(*args)
    reply = await connection.read_response(timeout=timeout)
    if reply is None and loop.time() - started >= timeout:
        # redis.asyncio answers None to a read that timed out: its reply may still come, so
        # this connection must not serve another command.
        await connection.disconnect()
        raise redis.TimeoutError(f"no reply to {args[0]!s} within {timeout} s")
    return reply


# --- Without the module: the script ------------------------------------------------------------
#
# A server without the module answers COMMAND INFO SEM.ACQUIRE with [nil]. Each connection pool
# asks once; without the module, SEM.ACQUIRE, ACQUIREFAIR, REFRESH, RELEASE, GET and LIMIT run
# as the script redsem.lua (shipped in this package; its one source is the repository's
# clients/scripts/redsem.lua) over the very keys the module keeps, and a wait is a loop of
# attempts and BLPOPs on <name>:wake, where the script pushes a token for each permit it frees.

# What each pool answered (True: the module is loaded), kept as long as the pool lives.
_backends: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_backends_lock = threading.Lock()

# The longest a waiter without the module blocks on <name>:wake before it tries again: bounds
# the wait for a permit freed without a wake-up token (a lease that ran out, a release by the
# module or by hand).
_RECHECK = 1.0


@functools.lru_cache(maxsize=None)
def _script() -> Tuple[bytes, str]:
    """The script's source, as shipped in the package, and its SHA1 (EVALSHA's name for it)."""
    files = getattr(importlib.resources, "files", None)
    if files is not None:  # Python 3.9+
        source: bytes = files(__name__).joinpath("redsem.lua").read_bytes()
    else:
        source = importlib.resources.read_binary(__name__, "redsem.lua")
    return source, hashlib.sha1(source).hexdigest()


def _pool_of(client: Any) -> Any:
    """What the backend is cached on: the client's connection pool (shared by client())."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


def _known_backend(client: Any) -> Optional[bool]:
    with _backends_lock:
        return _backends.get(_pool_of(client))


def _note_backend(client: Any, reply: Any) -> bool:
    """Caches what COMMAND INFO SEM.ACQUIRE answered: ``[nil]`` without the module."""
    module = isinstance(reply, (list, tuple)) and len(reply) > 0 and reply[0] is not None
    with _backends_lock:
        _backends[_pool_of(client)] = module
    return module


def _has_module(client: redis.Redis) -> bool:
    """Whether the server of ``client``'s pool has the module; asked once per pool."""
    known = _known_backend(client)
    if known is not None:
        return known
    # "COMMAND INFO" as one name: redis-py has no reply callback for it (the one of COMMAND
    # cannot read [nil]), and sends it as two words.
    return _note_backend(client, _execute(client, "COMMAND INFO", "SEM.ACQUIRE"))


async def _has_module_async(client: redis.asyncio.Redis) -> bool:
    """As _has_module, for redis.asyncio."""
    known = _known_backend(client)
    if known is not None:
        return known
    return _note_backend(client, await _execute_async(client, "COMMAND INFO", "SEM.ACQUIRE"))


def _keys(name: Identifier) -> List[Identifier]:
    """The script's 6 keys: the semaphore's, the module's derived keys, and the wake-up list."""
    suffixes = ("", ":owner", ":counter", ":permits", ":limit", ":wake")
    if isinstance(name, bytes):
        return [name + suffix.encode() for suffix in suffixes]
    return [name + suffix for suffix in suffixes]


def _wake_key(name: Identifier) -> Identifier:
    return _keys(name)[5]


def _script_args(args: Args, load: bool) -> Args:
    """``SEM.<OP> name rest...`` as the script's EVALSHA (or EVAL, which also loads it)."""
    op = str(args[0]).upper()
    if not op.startswith("SEM."):
        raise ValueError(f"{op} is not a redsem command")
    source, sha = _script()
    head: Args = ["EVAL", source] if load else ["EVALSHA", sha]
    return [*head, 6, *_keys(cast(Identifier, args[1])), op[4:], *args[2:]]


def _send(conn: redis.Redis, scripts: bool, args: Args) -> Any:
    """Sends a single-semaphore SEM.* command, as itself or (``scripts``) through the script."""
    if not scripts:
        return _execute(conn, *args)
    try:
        return _execute(conn, *_script_args(args, False))
    except redis.exceptions.NoScriptError:  # not loaded yet (or flushed): EVAL loads it
        return _execute(conn, *_script_args(args, True))


async def _send_async(conn: redis.asyncio.Redis, scripts: bool, args: Args) -> Any:
    """As _send, for redis.asyncio."""
    if not scripts:
        return await _execute_async(conn, *args)
    try:
        return await _execute_async(conn, *_script_args(args, False))
    except redis.exceptions.NoScriptError:
        return await _execute_async(conn, *_script_args(args, True))


def _attempt(reply: Any) -> Tuple[Any, float]:
    """The script's ACQUIRE answer ``[reply, retry_ms]``: the module's reply (None: refused),
    and how long until the earliest holder's lease ends (seconds; _RECHECK when unknown)."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 2:
        raise redis.ResponseError(f"unexpected answer of the redsem script: {reply!r}")
    granted, retry_ms = reply
    retry = int(retry_ms) / 1000 if retry_ms else 0.0
    # One millisecond more: the lease ends at its deadline, not before.
    return granted, (retry + 0.001 if retry > 0 else _RECHECK)


def _wait_deadline(wait: Optional[float]) -> float:
    """The monotonic time a script-side wait ends (inf: no limit; now: no wait)."""
    return time.monotonic() + (wait or 0.0)


def _block_for(deadline: float, retry: float) -> Optional[float]:
    """How long the next BLPOP may block, None when the wait is over."""
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    return min(left, retry, _RECHECK)


def _acquire_by_script(
    conn: redis.Redis, options: "_Options", identifier: Identifier
) -> Tuple[Any, float]:
    """Acquires through the script, waiting (``options.wait``) on <name>:wake between attempts,
    on ``conn`` (the permit's own connection). Returns the module's reply (None: not granted)
    and the monotonic time the granting attempt was sent."""
    command = options.acquire_command(identifier, in_server=False)
    deadline = _wait_deadline(options.wait)
    while True:
        sent = time.monotonic()
        granted, retry = _attempt(_send(conn, True, command))
        if granted is not None:
            return granted, sent
        block = _block_for(deadline, retry)
        if block is None:
            return None, sent
        seconds = _seconds(block)
        _run_blocking(conn, ["BLPOP", _wake_key(options.name), seconds], float(seconds))


async def _acquire_by_script_async(
    conn: redis.asyncio.Redis, options: "_Options", identifier: Identifier
) -> Tuple[Any, float]:
    """As _acquire_by_script, for redis.asyncio."""
    command = options.acquire_command(identifier, in_server=False)
    deadline = _wait_deadline(options.wait)
    while True:
        sent = time.monotonic()
        granted, retry = _attempt(await _send_async(conn, True, command))
        if granted is not None:
            return granted, sent
        block = _block_for(deadline, retry)
        if block is None:
            return None, sent
        seconds = _seconds(block)
        await _run_blocking_async(conn, ["BLPOP", _wake_key(options.name), seconds], float(seconds))


class _Options:
    """What an acquire sends, checked once."""

    def __init__(
        self,
        name: Identifier,
        limit: int,
        lease: float,
        wait: Optional[float],
        fair: bool,
        count: Optional[int],
        bound: bool,
        identifier: Optional[Identifier],
        durable_replicas: int,
        durable_timeout_ms: int,
        auto_refresh: bool,
    ) -> None:
        if not name:
            raise ValueError("the semaphore name must not be empty")
        if not isinstance(limit, int) or limit < 1:
            raise ValueError("limit must be an integer of at least 1")
        if not lease > 0:
            raise ValueError("lease must be a number of seconds greater than 0")
        if wait is not None and not wait >= 0:
            raise ValueError("wait must be None, or a number of seconds (math.inf: no limit)")
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError("count must be None or an integer of at least 1")
        if identifier is not None and not identifier:
            raise ValueError("the identifier must not be empty")
        if durable_replicas < 0 or durable_timeout_ms < 0:
            raise ValueError("durable_replicas and durable_timeout_ms must not be negative")
        self.name = name
        self.limit = limit
        self.lease = float(lease)
        self.wait = wait
        self.fair = fair
        self.count = count
        self.bound = bound
        self.identifier = identifier
        self.durable_replicas = durable_replicas
        self.durable_timeout_ms = durable_timeout_ms
        self.auto_refresh = auto_refresh

    def acquire_command(self, identifier: Identifier, in_server: bool = True) -> Args:
        """The acquire; ``in_server=False`` leaves out WAIT and BOUND (the script's form: its
        caller waits)."""
        command = "SEM.ACQUIREFAIR" if self.fair else "SEM.ACQUIRE"
        args: Args = [command, self.name, self.limit, _seconds(self.lease), "ID", identifier]
        if self.count is not None:
            args += ["COUNT", self.count]
        if self.fair:
            args.append("WITHTICKET")
        if not in_server:
            return args
        if self.wait:  # None and 0 do not wait
            args += ["WAIT", "0" if math.isinf(self.wait) else _seconds(self.wait)]
        if self.bound:
            args.append("BOUND")
        return args

    def blocks_for(self) -> Optional[float]:
        """How long the acquire may wait in the server (None: without limit)."""
        if self.wait and math.isinf(self.wait):
            return None
        return self.wait or 0.0

    def ticket_of(self, reply: Any) -> Optional[int]:
        """The ticket of a granted reply (``[identifier, ticket]`` when fair), else None."""
        return int(reply[1]) if self.fair else None

    def describe(self) -> str:
        waited = f" within {self.wait} s" if self.wait else ""
        return f"no permit of {self.name!r} (limit {self.limit}) was granted{waited}"


class _SetOptions:
    """What a set acquire sends, checked once."""

    def __init__(
        self,
        semaphores: Sequence[SemaphoreSpec],
        lease: float,
        wait: Optional[float],
        fair: bool,
        bound: bool,
        identifier: Optional[Identifier],
        auto_refresh: bool,
    ) -> None:
        specs: List[Tuple[Identifier, int, int]] = []
        for spec in semaphores:
            name, limit, *rest = spec
            count = rest[0] if rest else 1
            if not name:
                raise ValueError("a semaphore name must not be empty")
            if not isinstance(limit, int) or limit < 1:
                raise ValueError(f"the limit of {name!r} must be an integer of at least 1")
            if not isinstance(count, int) or not 1 <= count <= limit:
                raise ValueError(f"the count of {name!r} must be an integer from 1 to its limit")
            specs.append((name, limit, count))
        if not 1 <= len(specs) <= 64:
            raise ValueError("a set has from 1 to 64 semaphores")
        encoded = {name if isinstance(name, bytes) else name.encode() for name, _, _ in specs}
        if len(encoded) < len(specs):
            raise ValueError("a semaphore is named twice")
        if not lease > 0:
            raise ValueError("lease must be a number of seconds greater than 0")
        if wait is not None and not wait >= 0:
            raise ValueError("wait must be None, or a number of seconds (math.inf: no limit)")
        if identifier is not None and not identifier:
            raise ValueError("the identifier must not be empty")
        self.semaphores = specs
        self.names = tuple(name for name, _, _ in specs)
        self.lease = float(lease)
        self.wait = wait
        self.fair = fair
        self.bound = bound
        self.identifier = identifier
        self.auto_refresh = auto_refresh

    def acquire_command(self, identifier: Identifier) -> Args:
        args: Args = ["SEM.ACQUIREALL", len(self.semaphores)]
        for name, limit, count in self.semaphores:
            args += [name, limit, count]
        args += [_seconds(self.lease), "ID", identifier]
        if self.fair:
            args += ["FAIR", "WITHTICKET"]
        if self.wait:  # None and 0 do not wait
            args += ["WAIT", "0" if math.isinf(self.wait) else _seconds(self.wait)]
        if self.bound:
            args.append("BOUND")
        return args

    def blocks_for(self) -> Optional[float]:
        """How long the acquire may wait in the server (None: without limit)."""
        if self.wait and math.isinf(self.wait):
            return None
        return self.wait or 0.0

    def tickets_of(self, reply: Any) -> Optional[Tuple[int, ...]]:
        """The tickets of a granted reply (``[identifier, [ticket, ...]]`` when fair), else None."""
        return tuple(int(ticket) for ticket in reply[1]) if self.fair else None

    def describe(self) -> str:
        waited = f" within {self.wait} s" if self.wait else ""
        wanted = ", ".join(f"{name!r} ({count} of {limit})" for name, limit, count in self.semaphores)
        return f"the set {wanted} was not granted{waited}"


class _Held:
    """What every permit shares, sync or async, of one semaphore or of a set: identity, and
    whether it is still held."""

    # How many semaphores a refresh or a release must find held.
    _wanted = 1
    # Sent through the script (the server has no module), else as the module's commands.
    _scripts = False

    def __init__(self, identifier: Identifier, lease: float, sent: float) -> None:
        #: The holder's identifier: ``identifier=``, or the UUID v4 made for this permit.
        self.id: Identifier = identifier
        self.lease = lease
        # The server's deadline is at least this (monotonic clock): the last acquire or refresh
        # confirmed was sent at `sent`, and its lease started when the server ran it, later.
        self._confirmed_until = sent + lease
        self._lost_reason: Optional[str] = None
        self._released: Optional[bool] = None  # the release's outcome, once released

    def _what(self) -> str:
        raise NotImplementedError

    def _refresh_args(self) -> Args:
        raise NotImplementedError

    def _release_args(self) -> Args:
        raise NotImplementedError

    @property
    def lost(self) -> bool:
        """True once the permit may have run out: a refresh or the release answered 0, or no
        refresh was confirmed within a lease (the server is unreachable). It stays True."""
        self._note_deadline()
        return self._lost_reason is not None

    def _note_deadline(self) -> None:
        """Marks the permit lost once no confirmed lease covers the present."""
        if self._released is None and time.monotonic() >= self._confirmed_until:
            self._mark_lost("no refresh was confirmed within the lease")

    def check(self) -> None:
        """Raises PermitLost if the permit is lost: call it in long work to stop early."""
        if self.lost:
            raise PermitLost(self._lost_message())

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason

    def _lost_message(self) -> str:
        return f"the permit {self.id!r} of {self._what()} was lost: {self._lost_reason}"

    def _answered(self, command: Args, reply: Any) -> str:
        if self._wanted == 1:
            return f"{command[0]!s} answered {reply}"
        return f"{command[0]!s} answered {reply} of {self._wanted}"

    def _refreshed(self, command: Args, reply: Any, sent: float) -> bool:
        if reply == self._wanted:
            self._confirmed_until = sent + self.lease
            return True
        # Fewer than all: a lease ran out (the server removes it) or another client removed it.
        self._mark_lost(
            f"{self._answered(command, reply)} (the lease ran out, or the holder was removed)"
        )
        return False

    def _released_with(self, command: Args, reply: Any) -> bool:
        if reply != self._wanted:
            answered = self._answered(command, reply)
            self._mark_lost(f"{answered}: the lease ran out before the release")
        self._released = self._lost_reason is None
        return self._released

    def _release_failed(self, err: BaseException) -> None:
        # Not refreshed any more, the permit runs out at the end of its lease.
        self._mark_lost(f"the release failed: {err!r}")
        self._released = False

    def _describe(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        state = "lost" if self._lost_reason else ("released" if self._released else "held")
        return f"<{type(self).__name__} {self._describe()} {state}>"


class _PermitState(_Held):
    """A permit of one semaphore."""

    def __init__(
        self, options: _Options, identifier: Identifier, ticket: Optional[int], sent: float
    ) -> None:
        super().__init__(identifier, options.lease, sent)
        self._options = options
        self.name = options.name
        #: The fencing ticket of a fair permit (only ever grows per name), else None.
        self.ticket = ticket
        #: The number of permits held (COUNT).
        self.count = options.count or 1

    def _what(self) -> str:
        return repr(self.name)

    def _refresh_args(self) -> Args:
        return ["SEM.REFRESH", self.name, self.id, _seconds(self.lease)]

    def _release_args(self) -> Args:
        return ["SEM.RELEASE", self.name, self.id]

    def _check_release_some(self, count: int) -> None:
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        if not 1 <= count < self.count:
            raise ValueError(f"count must be from 1 to {self.count - 1}; use release() for all")

    def _describe(self) -> str:
        ticket = f" ticket={self.ticket}" if self.ticket is not None else ""
        return f"{self.name!r} id={self.id!r}{ticket} count={self.count}"


class _SetState(_Held):
    """Permits of several semaphores, taken together for one identifier."""

    def __init__(
        self,
        options: _SetOptions,
        identifier: Identifier,
        tickets: Optional[Tuple[int, ...]],
        sent: float,
    ) -> None:
        super().__init__(identifier, options.lease, sent)
        #: The semaphores' names, in the order given.
        self.names = options.names
        #: The permits held of each, in the same order.
        self.counts = tuple(count for _, _, count in options.semaphores)
        #: With ``fair``: the fencing ticket of each semaphore, in the same order; else None.
        self.tickets = tickets
        self._wanted = len(self.names)

    def _what(self) -> str:
        return "the set " + ", ".join(repr(name) for name in self.names)

    def _refresh_args(self) -> Args:
        return ["SEM.REFRESHALL", len(self.names), *self.names, self.id, _seconds(self.lease)]

    def _release_args(self) -> Args:
        return ["SEM.RELEASEALL", len(self.names), *self.names, self.id]

    def _describe(self) -> str:
        tickets = f" tickets={list(self.tickets)}" if self.tickets is not None else ""
        return f"{list(self.names)!r} id={self.id!r}{tickets} counts={list(self.counts)}"


_SyncSelf = TypeVar("_SyncSelf", bound="_SyncHeld")
_AsyncSelf = TypeVar("_AsyncSelf", bound="_AsyncHeld")


class _SyncHeld(_Held):
    """Refresh in a background thread, and release, over a redis-py connection."""

    _conn: redis.Redis

    def _init_sync(self, conn: redis.Redis) -> None:
        self._conn = conn
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._release_lock = threading.Lock()

    def _start_refreshing(self) -> None:
        self._thread = threading.Thread(
            target=self._refresh_loop, name=f"redsem-refresh-{self.id!r}", daemon=True
        )
        self._thread.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                if not self.refresh():
                    return
            except Exception:  # unreachable server: retry until the lease is up
                if self.lost:
                    return

    def refresh(self) -> bool:
        """Moves the deadline to now + lease (the background thread does this every lease/3).
        Returns False, and marks the permit lost, if it had run out."""
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        sent = time.monotonic()
        command = self._refresh_args()
        return self._refreshed(command, _send(self._conn, self._scripts, command), sent)

    def release(self) -> bool:
        """Gives the permit back: True if it was held throughout, False if it was lost (then
        the work it guarded may have overlapped another holder's). Later calls repeat the
        answer."""
        with self._release_lock:
            if self._released is not None:
                return self._released
            self._note_deadline()
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()  # lets a refresh under way finish first
            command = self._release_args()
            try:
                reply = _send(self._conn, self._scripts, command)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                self._conn.close()  # back to the pool
            return self._released_with(command, reply)

    def __enter__(self: _SyncSelf) -> _SyncSelf:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            released = self.release()
        except Exception as err:
            if exc is None:
                raise
            _add_note(exc, f"redsem: releasing {self._what()} failed too: {err!r}")
            return
        if exc is None and not released:
            raise PermitLost(self._lost_message())


class _AsyncHeld(_Held):
    """As _SyncHeld, for redis.asyncio: the refresh is an asyncio task."""

    _conn: redis.asyncio.Redis

    def _init_async(self, conn: redis.asyncio.Redis) -> None:
        self._conn = conn
        self._stop = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None
        self._release_lock = asyncio.Lock()

    def _start_refreshing(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        # Stopped by the event, never cancelled: a cancelled command would close the connection,
        # and with it a BOUND permit.
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self.lease / 3)
                return
            except asyncio.TimeoutError:
                pass
            try:
                if not await self.refresh():
                    return
            except Exception:  # unreachable server: retry until the lease is up
                if self.lost:
                    return

    async def refresh(self) -> bool:
        """As Permit.refresh."""
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        sent = time.monotonic()
        command = self._refresh_args()
        reply = await _send_async(self._conn, self._scripts, command)
        return self._refreshed(command, reply, sent)

    async def release(self) -> bool:
        """As Permit.release."""
        async with self._release_lock:
            if self._released is not None:
                return self._released
            self._note_deadline()
            self._stop.set()
            if self._task is not None and self._task is not asyncio.current_task():
                await self._task
            command = self._release_args()
            try:
                reply = await _send_async(self._conn, self._scripts, command)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                await self._conn.aclose()  # back to the pool
            return self._released_with(command, reply)

    async def __aenter__(self: _AsyncSelf) -> _AsyncSelf:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            released = await self.release()
        except Exception as err:
            if exc is None:
                raise
            _add_note(exc, f"redsem: releasing {self._what()} failed too: {err!r}")
            return
        if exc is None and not released:
            raise PermitLost(self._lost_message())


class Permit(_SyncHeld, _PermitState):
    """A granted permit: refreshed in a background thread every lease/3 while held, given back
    by ``release()`` or at the end of its ``with`` block."""

    def __init__(
        self,
        options: _Options,
        conn: redis.Redis,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
        scripts: bool = False,
    ) -> None:
        _PermitState.__init__(self, options, identifier, ticket, sent)
        self._init_sync(conn)
        self._scripts = scripts

    def release_some(self, count: int) -> bool:
        """Gives back ``count`` of a weighted permit's permits and keeps holding the rest (with
        its deadline and ticket). Returns False, and marks it lost, if it had run out."""
        self._check_release_some(count)
        command: Args = ["SEM.RELEASE", self.name, self.id, "COUNT", count]
        reply = _send(self._conn, self._scripts, command)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False


class AsyncPermit(_AsyncHeld, _PermitState):
    """The asyncio form of Permit: refreshed by an asyncio task every lease/3 while held."""

    def __init__(
        self,
        options: _Options,
        conn: redis.asyncio.Redis,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
        scripts: bool = False,
    ) -> None:
        _PermitState.__init__(self, options, identifier, ticket, sent)
        self._init_async(conn)
        self._scripts = scripts

    async def release_some(self, count: int) -> bool:
        """As Permit.release_some."""
        self._check_release_some(count)
        command: Args = ["SEM.RELEASE", self.name, self.id, "COUNT", count]
        reply = await _send_async(self._conn, self._scripts, command)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False


class PermitSet(_SyncHeld, _SetState):
    """Permits of several semaphores taken at once (``acquire_all``): refreshed together
    (SEM.REFRESHALL) in a background thread every lease/3, and lost as soon as any one of them
    is; given back together (SEM.RELEASEALL) by ``release()`` or at the end of its ``with``
    block."""

    def __init__(
        self,
        options: _SetOptions,
        conn: redis.Redis,
        identifier: Identifier,
        tickets: Optional[Tuple[int, ...]],
        sent: float,
    ) -> None:
        _SetState.__init__(self, options, identifier, tickets, sent)
        self._init_sync(conn)


class AsyncPermitSet(_AsyncHeld, _SetState):
    """The asyncio form of PermitSet."""

    def __init__(
        self,
        options: _SetOptions,
        conn: redis.asyncio.Redis,
        identifier: Identifier,
        tickets: Optional[Tuple[int, ...]],
        sent: float,
    ) -> None:
        _SetState.__init__(self, options, identifier, tickets, sent)
        self._init_async(conn)


# The permits entered through `with semaphore` in this thread or task, innermost last, so one
# Semaphore object can be shared by threads and tasks like threading.Semaphore.
_entered: contextvars.ContextVar[Tuple[Tuple[object, _Held], ...]] = contextvars.ContextVar(
    "redsem_entered", default=()
)


def _push(semaphore: object, permit: _Held) -> None:
    _entered.set(_entered.get() + ((semaphore, permit),))


def _pop(semaphore: object) -> Any:
    entered = _entered.get()
    for i in range(len(entered) - 1, -1, -1):
        if entered[i][0] is semaphore:
            _entered.set(entered[:i] + entered[i + 1 :])
            return entered[i][1]
    raise SemaphoreError("exit of a semaphore that was not entered in this thread or task")


class Semaphore:
    """A redsem semaphore: ``with Semaphore(...) as permit`` or ``permit = sem.acquire()``.

    client: a ``redis.Redis`` (its pool lends each permit a connection).
    name, limit, lease: the semaphore's key, its number of permits, and the lease in seconds
        (millisecond precision); the permit is refreshed every lease/3 while held.
    wait: seconds to wait inside the server for a permit; None or 0 do not wait, math.inf
        waits without limit. Without the module the package waits: it tries again whenever a
        release wakes it (BLPOP on ``<name>:wake``), when the earliest lease ends, and at
        least every second; a newcomer may then take a freed permit ahead of the waiters.
    fair: use SEM.ACQUIREFAIR (first come, first served; ``permit.ticket`` is a fencing token).
    count: take this many permits at once (COUNT), all or none.
    bound: BOUND; the permit is given back when its connection closes (the process dies).
        It needs the module: without it, acquire() raises ModuleRequired.
    identifier: the holder's identifier (default: a new UUID v4 per acquire). An identifier
        names one permit: a second acquire with it, while the first permit is held, renews
        that permit rather than taking another (which is what makes a retried acquire safe).
    durable_replicas, durable_timeout_ms: after the grant, ``WAIT durable_replicas
        durable_timeout_ms``; fewer acknowledgements give the permit back and raise NotDurable.
    auto_refresh: False to refresh by hand (``permit.refresh()``) instead of in a thread.

    Without ``identifier``, one Semaphore can be shared by threads; each ``with`` takes its own
    permit. With one, it must not be held twice at once.
    """

    def __init__(
        self,
        client: redis.Redis,
        name: Identifier,
        limit: int,
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        count: Optional[int] = None,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        durable_replicas: int = 0,
        durable_timeout_ms: int = 1000,
        auto_refresh: bool = True,
    ) -> None:
        self.client = client
        self.options = _Options(
            name, limit, lease, wait, fair, count, bound, identifier,
            durable_replicas, durable_timeout_ms, auto_refresh,
        )

    def acquire(self) -> Permit:
        """Takes a permit, or raises NotAcquired (or NotDurable, or a redis-py error)."""
        options = self.options
        scripts = not _has_module(self.client)
        if scripts and options.bound:
            raise ModuleRequired("BOUND")
        identifier = options.identifier or str(uuid.uuid4())
        # One connection of the pool, for this permit only (client() is untyped in some
        # redis-py releases).
        conn: redis.Redis = cast(Any, self.client).client()
        try:
            if scripts:
                reply, sent = _acquire_by_script(conn, options, identifier)
            else:
                sent = time.monotonic()
                command = options.acquire_command(identifier)
                reply = _run_blocking(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permit = Permit(options, conn, identifier, options.ticket_of(reply), sent, scripts)
        except BaseException:
            conn.close()
            raise
        try:
            if options.durable_replicas:
                wait: Args = ["WAIT", options.durable_replicas, options.durable_timeout_ms]
                acked = _run_blocking(conn, wait, options.durable_timeout_ms / 1000 or None)
                if acked < options.durable_replicas:
                    raise NotDurable(
                        f"{acked} of {options.durable_replicas} replicas acknowledged the grant "
                        f"of {options.name!r} within {options.durable_timeout_ms} ms",
                        acked,
                        options.durable_replicas,
                    )
            # A wait for the grant leaves the lease's start unknown: confirm it now.
            if time.monotonic() - sent > options.lease / 3 and not permit.refresh():
                raise PermitLost(permit._lost_message())
        except BaseException:
            try:
                permit.release()
            except Exception:
                pass
            raise
        if options.auto_refresh:
            permit._start_refreshing()
        return permit

    def __enter__(self) -> Permit:
        permit = self.acquire()
        _push(self, permit)
        return permit

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _pop(self).__exit__(exc_type, exc, tb)


class AsyncSemaphore:
    """The asyncio form of Semaphore, for ``redis.asyncio.Redis``: ``async with
    AsyncSemaphore(...) as permit``; the same options. Each permit, held or waited for, holds a
    connection of the pool: with ``redis.asyncio.BlockingConnectionPool`` (or a
    ``max_connections``), size the pool for the permits taken at once."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        name: Identifier,
        limit: int,
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        count: Optional[int] = None,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        durable_replicas: int = 0,
        durable_timeout_ms: int = 1000,
        auto_refresh: bool = True,
    ) -> None:
        self.client = client
        self.options = _Options(
            name, limit, lease, wait, fair, count, bound, identifier,
            durable_replicas, durable_timeout_ms, auto_refresh,
        )

    async def acquire(self) -> AsyncPermit:
        """As Semaphore.acquire."""
        options = self.options
        scripts = not await _has_module_async(self.client)
        if scripts and options.bound:
            raise ModuleRequired("BOUND")
        identifier = options.identifier or str(uuid.uuid4())
        conn = self.client.client()
        try:
            if scripts:
                reply, sent = await _acquire_by_script_async(conn, options, identifier)
            else:
                sent = time.monotonic()
                command = options.acquire_command(identifier)
                reply = await _run_blocking_async(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permit = AsyncPermit(
                options, conn, identifier, options.ticket_of(reply), sent, scripts
            )
        except BaseException:
            await conn.aclose()
            raise
        try:
            if options.durable_replicas:
                wait: Args = ["WAIT", options.durable_replicas, options.durable_timeout_ms]
                acked = await _run_blocking_async(
                    conn, wait, options.durable_timeout_ms / 1000 or None
                )
                if acked < options.durable_replicas:
                    raise NotDurable(
                        f"{acked} of {options.durable_replicas} replicas acknowledged the grant "
                        f"of {options.name!r} within {options.durable_timeout_ms} ms",
                        acked,
                        options.durable_replicas,
                    )
            if time.monotonic() - sent > options.lease / 3 and not await permit.refresh():
                raise PermitLost(permit._lost_message())
        except BaseException:
            try:
                await permit.release()
            except Exception:
                pass
            raise
        if options.auto_refresh:
            permit._start_refreshing()
        return permit

    async def __aenter__(self) -> AsyncPermit:
        permit = await self.acquire()
        _push(self, permit)
        return permit

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _pop(self).__aexit__(exc_type, exc, tb)


class SemaphoreSet:
    """Permits of several semaphores for one identifier, all or none (SEM.ACQUIREALL): ``with
    SemaphoreSet(r, [("gpu", 1), ("licence", 5, 2)]) as permits``, or ``acquire_all(...)``.

    client: a ``redis.Redis`` (its pool lends each set a connection, as for a Semaphore).
    semaphores: ``(name, limit)`` for one permit of ``name``, or ``(name, limit, count)``; 1 to
        64 distinct names (in Redis Cluster they must share a slot: use hash tags).
    lease: seconds, the same for every semaphore; they are refreshed together every lease/3,
        and the set is lost as soon as any one of them is.
    wait: seconds to wait inside the server until the whole set can be granted at once; None
        or 0 do not wait, math.inf waits without limit.
    fair: every semaphore is a fair one (FAIR); ``permits.tickets`` has one fencing ticket per
        semaphore, in the order given.
    bound, identifier, auto_refresh: as for Semaphore.

    A set needs the module: without it, acquire() raises ModuleRequired.
    """

    def __init__(
        self,
        client: redis.Redis,
        semaphores: Sequence[SemaphoreSpec],
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        auto_refresh: bool = True,
    ) -> None:
        self.client = client
        self.options = _SetOptions(semaphores, lease, wait, fair, bound, identifier, auto_refresh)

    def acquire(self) -> PermitSet:
        """Takes every permit of the set, or raises NotAcquired (then none is held);
        ModuleRequired without the module."""
        options = self.options
        if not _has_module(self.client):
            raise ModuleRequired("SEM.ACQUIREALL")
        identifier = options.identifier or str(uuid.uuid4())
        conn: redis.Redis = cast(Any, self.client).client()
        try:
            sent = time.monotonic()
            command = options.acquire_command(identifier)
            reply = _run_blocking(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permits = PermitSet(options, conn, identifier, options.tickets_of(reply), sent)
        except BaseException:
            conn.close()
            raise
        try:
            # A wait for the grant leaves the lease's start unknown: confirm it now.
            if time.monotonic() - sent > options.lease / 3 and not permits.refresh():
                raise PermitLost(permits._lost_message())
        except BaseException:
            try:
                permits.release()
            except Exception:
                pass
            raise
        if options.auto_refresh:
            permits._start_refreshing()
        return permits

    def __enter__(self) -> PermitSet:
        permits = self.acquire()
        _push(self, permits)
        return permits

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        _pop(self).__exit__(exc_type, exc, tb)


class AsyncSemaphoreSet:
    """The asyncio form of SemaphoreSet, for ``redis.asyncio.Redis``; the same options."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        semaphores: Sequence[SemaphoreSpec],
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        auto_refresh: bool = True,
    ) -> None:
        self.client = client
        self.options = _SetOptions(semaphores, lease, wait, fair, bound, identifier, auto_refresh)

    async def acquire(self) -> AsyncPermitSet:
        """As SemaphoreSet.acquire."""
        options = self.options
        if not await _has_module_async(self.client):
            raise ModuleRequired("SEM.ACQUIREALL")
        identifier = options.identifier or str(uuid.uuid4())
        conn = self.client.client()
        try:
            sent = time.monotonic()
            command = options.acquire_command(identifier)
            reply = await _run_blocking_async(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permits = AsyncPermitSet(options, conn, identifier, options.tickets_of(reply), sent)
        except BaseException:
            await conn.aclose()
            raise
        try:
            if time.monotonic() - sent > options.lease / 3 and not await permits.refresh():
                raise PermitLost(permits._lost_message())
        except BaseException:
            try:
                await permits.release()
            except Exception:
                pass
            raise
        if options.auto_refresh:
            permits._start_refreshing()
        return permits

    async def __aenter__(self) -> AsyncPermitSet:
        permits = await self.acquire()
        _push(self, permits)
        return permits

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await _pop(self).__aexit__(exc_type, exc, tb)


def acquire_all(
    client: redis.Redis,
    semaphores: Sequence[SemaphoreSpec],
    lease: float = 30,
    *,
    wait: Optional[float] = None,
    fair: bool = False,
    bound: bool = False,
    identifier: Optional[Identifier] = None,
    auto_refresh: bool = True,
) -> PermitSet:
    """``SemaphoreSet(...).acquire()``: the set's permits, all held, or NotAcquired (none
    held). The PermitSet is a context manager that releases them."""
    return SemaphoreSet(
        client, semaphores, lease, wait=wait, fair=fair, bound=bound,
        identifier=identifier, auto_refresh=auto_refresh,
    ).acquire()


async def acquire_all_async(
    client: redis.asyncio.Redis,
    semaphores: Sequence[SemaphoreSpec],
    lease: float = 30,
    *,
    wait: Optional[float] = None,
    fair: bool = False,
    bound: bool = False,
    identifier: Optional[Identifier] = None,
    auto_refresh: bool = True,
) -> AsyncPermitSet:
    """As acquire_all, for redis.asyncio."""
    return await AsyncSemaphoreSet(
        client, semaphores, lease, wait=wait, fair=fair, bound=bound,
        identifier=identifier, auto_refresh=auto_refresh,
    ).acquire()


def _wait_empty_args(name: Identifier, timeout: float) -> Tuple[Args, Optional[float]]:
    """SEM.WAITEMPTY's arguments, and how long it may block (None: without limit)."""
    if not name:
        raise ValueError("the semaphore name must not be empty")
    if not timeout >= 0:
        raise ValueError("timeout must be a number of seconds (math.inf: no limit)")
    if math.isinf(timeout):
        return ["SEM.WAITEMPTY", name, "0"], None
    # The server reads 0 as "no limit": a timeout of 0 looks for at most a millisecond instead.
    seconds = _seconds(timeout) if timeout > 0 else "0.001"
    return ["SEM.WAITEMPTY", name, seconds], float(seconds)


def wait_empty(client: redis.Redis, name: Identifier, timeout: float) -> bool:
    """Waits until the semaphore ``name`` has no live holder (SEM.WAITEMPTY): True once it has
    none (at once if it has none now), False when ``timeout`` seconds pass first (math.inf:
    no limit). It takes nothing. It blocks the connection, so it uses one of the pool's own.
    It needs the module: without it, it raises ModuleRequired."""
    args, block = _wait_empty_args(name, timeout)
    if not _has_module(client):
        raise ModuleRequired("SEM.WAITEMPTY")
    conn: redis.Redis = cast(Any, client).client()
    try:
        return bool(_run_blocking(conn, args, block) == 1)
    finally:
        conn.close()


async def wait_empty_async(client: redis.asyncio.Redis, name: Identifier, timeout: float) -> bool:
    """As wait_empty, for redis.asyncio."""
    args, block = _wait_empty_args(name, timeout)
    if not await _has_module_async(client):
        raise ModuleRequired("SEM.WAITEMPTY")
    conn = client.client()
    try:
        return bool(await _run_blocking_async(conn, args, block) == 1)
    finally:
        await conn.aclose()


# The largest limit SEM.LIMIT stores (an unsigned 32-bit number).
_MAX_LIMIT = 4294967295


def _checked_name(name: Identifier) -> Identifier:
    if not name:
        raise ValueError("the semaphore name must not be empty")
    return name


def _set_limit_args(name: Identifier, limit: int) -> Args:
    """SEM.LIMIT's arguments to store ``limit``, checked before anything is sent."""
    _checked_name(name)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= _MAX_LIMIT:
        raise ValueError(f"limit must be an integer from 0 to {_MAX_LIMIT} (0 pauses)")
    return ["SEM.LIMIT", name, limit]


def stored_limit(client: redis.Redis, name: Identifier) -> Optional[int]:
    """The operator's limit stored for the semaphore ``name`` (SEM.LIMIT name), or None when
    there is none. While one is stored, every acquire of ``name`` uses it instead of its own."""
    command: Args = ["SEM.LIMIT", _checked_name(name)]
    reply = _send(client, not _has_module(client), command)
    return None if reply is None else int(reply)


async def stored_limit_async(client: redis.asyncio.Redis, name: Identifier) -> Optional[int]:
    """As stored_limit, for redis.asyncio."""
    command: Args = ["SEM.LIMIT", _checked_name(name)]
    reply = await _send_async(client, not await _has_module_async(client), command)
    return None if reply is None else int(reply)


def set_limit(client: redis.Redis, name: Identifier, limit: int) -> None:
    """Stores an operator's limit for the semaphore ``name`` (SEM.LIMIT name n), 0 to
    4294967295: every acquire of ``name`` uses it instead of its own until clear_limit. 0
    pauses the semaphore; a lower limit takes no permit from its holders."""
    command = _set_limit_args(name, limit)
    _send(client, not _has_module(client), command)


async def set_limit_async(client: redis.asyncio.Redis, name: Identifier, limit: int) -> None:
    """As set_limit, for redis.asyncio."""
    command = _set_limit_args(name, limit)
    await _send_async(client, not await _has_module_async(client), command)


def clear_limit(client: redis.Redis, name: Identifier) -> bool:
    """Removes the operator's limit of the semaphore ``name`` (SEM.LIMIT name CLEAR): acquires
    use their own limits again. True if one was stored, else False."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(_send(client, not _has_module(client), command) == 1)


async def clear_limit_async(client: redis.asyncio.Redis, name: Identifier) -> bool:
    """As clear_limit, for redis.asyncio."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(await _send_async(client, not await _has_module_async(client), command) == 1)
