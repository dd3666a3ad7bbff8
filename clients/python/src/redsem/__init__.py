"""Permits of a redsem semaphore (the Redis module ``sem``) for redis-py.

Install it with ``pip install clients/python`` (the package redsem-client). It needs Python
3.8 or later and redis-py 5 or later (tested with 8.1). Where the server has the module loaded
it sends the module's commands; where it has not (a managed service), it runs the same
operations as a Lua script (``redsem.lua``, shipped in this package) over the same keys, found
out per connection pool with ``COMMAND INFO SEM.ACQUIRE`` (asked again after 10 s while the
answer is "no module"; a module loaded meanwhile is used as soon as the script reports it).
What only the module can do (``bound``, sets, wait_empty) raises ModuleRequired there.

    import redis
    from redsem import Semaphore, NotAcquired, PermitLost

    r = redis.Redis()
    with Semaphore(r, "jobs", limit=3, lease=30, wait=10) as permit:
        ...  # at most 3 holders here; call permit.check() in long work to stop early

A held permit keeps no connection and no thread: its calls borrow a connection of the
client's pool for the call, and one renewal per client (a daemon thread, or a task of the
event loop) refreshes every permit the client holds. A call that blocks in the server (a wait
for a permit, ``WAIT`` for replicas with ``durable_replicas``, wait_empty) or a ``BOUND``
permit uses a connection of its own, made with the pool's settings outside the pool, so waits
never take the connections the application needs. The reply of a waiting acquire is read for
``wait`` plus the pool's ``socket_timeout`` (with redis-py before 8, whose default
``socket_timeout`` is None, a ``socket_timeout`` you set must exceed ``wait``, and without the
module 2.5 s, the longest BLPOP of a wait).

The identifier is made here (a UUID v4) unless ``identifier=`` gives one, so a retried acquire
(redis-py retries on connection errors) renews the same holder rather than taking a second
permit.

Every call takes a ``redis.cluster.RedisCluster`` (``redis.asyncio.cluster.RedisCluster`` for
the asyncio forms) wherever it takes a ``redis.Redis``. In Redis Cluster a name needs a hash tag
(``"{jobs}"``, ``"app:{jobs}"``) and the names of a set one slot, checked before anything is
sent; every call goes to the primary serving the name's slot, in the long form (every key
named), and a move of the slot or a failover of its primary is waited out: the call is resent,
with the same identifier, until it has an answer or ``retry_for`` seconds (30) have passed.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import heapq
import importlib.resources
import inspect
import math
import threading
import time
import uuid
import weakref
from types import TracebackType
from typing import (
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    cast,
)

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot

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
# What the calls take: a client of one server, or of a Redis Cluster.
Client = Union[redis.Redis, redis.cluster.RedisCluster]
AsyncClient = Union[redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster]
# How long a call in Redis Cluster is resent through a move or a failover before it gives up.
RETRY_FOR = 30.0

_T = TypeVar("_T")


def _execute(conn: _SyncConn, *args: Union[str, bytes, int, float]) -> Any:
    """conn.execute_command, whose signature some redis-py releases leave untyped."""
    return cast(Any, conn).execute_command(*args)


async def _execute_async(conn: _AsyncConn, *args: Union[str, bytes, int, float]) -> Any:
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


def _unblocked(err: BaseException) -> bool:
    """A blocked command ended by the server without an answer (``UNBLOCKED``): what a failover
    gives its waiters (the primary turned replica), and CLIENT UNBLOCK ... ERROR. A wait cut so
    is sent again, for what is left of it."""
    return isinstance(err, redis.exceptions.ResponseError) and str(err).startswith("UNBLOCKED")


_timed: Dict[Any, bool] = {}


def _reads_with_timeout(connection_class: Any) -> bool:
    """Whether the connection class's read_response takes a timeout (redis-py 8 and later)."""
    timed = _timed.get(connection_class)
    if timed is None:
        parameters = inspect.signature(connection_class.read_response).parameters
        timed = _timed[connection_class] = "timeout" in parameters
    return timed


def _run_blocking(
    conn: _SyncConn, args: Args, block: Optional[float], once: bool = False
) -> Any:
    """Runs a command that may block ``block`` seconds in the server (None: without limit) on a
    single-connection client. The reply is read for that long plus the connection's
    socket_timeout (redis-py 8 sets 5 s by default, shorter than many waits), and not retried
    (a retried wait would join the end of the line). ``once``: sent on this very connection or
    not at all, never by redis-py's retry on a new one (``WAIT numreplicas`` counts the writes
    of the connection it is sent on: on a new one it answers at once)."""
    if not once and block == 0:  # answers at once: any connection, a pooled client's too
        return _execute(conn, *args)
    connection = conn.connection
    if connection is None:
        raise SemaphoreError("a single-connection client has no connection")
    base = connection.socket_timeout
    timed = _reads_with_timeout(type(connection))
    if not once and (base is None or not timed):
        return _execute(conn, *args)
    if once and getattr(connection, "_sock", None) is None:
        raise redis.ConnectionError(f"the connection closed before {args[0]!s}")
    # Untyped in some redis-py releases. ``once``: no health check, whose PING would reconnect
    # a dropped connection silently.
    cast(Any, connection).send_command(*args, check_health=not once)
    if base is None or not timed:
        return connection.read_response()
    # On a timeout redis-py closes the connection (the server then drops the waiter).
    return connection.read_response(timeout=(_NO_LIMIT if block is None else block) + base)


async def _run_blocking_async(
    conn: _AsyncConn, args: Args, block: Optional[float], once: bool = False
) -> Any:
    """As _run_blocking, for redis.asyncio."""
    if not once and block == 0:
        return await _execute_async(conn, *args)
    await conn.initialize()
    connection = conn.connection
    if connection is None:
        raise SemaphoreError("a single-connection client has no connection")
    base = connection.socket_timeout
    if not once and (block == 0 or base is None):
        return await _execute_async(conn, *args)
    if once and not connection.is_connected:
        raise redis.ConnectionError(f"the connection closed before {args[0]!s}")
    loop = asyncio.get_running_loop()
    started = loop.time()
    # ``once``: no health check, whose PING would reconnect a dropped connection silently.
    await connection.send_command(*args, check_health=not once)
    if base is None:
        return await connection.read_response()
    timeout = (_NO_LIMIT if block is None else block) + base
    try:
        reply = await connection.read_response(timeout=timeout)
    except asyncio.CancelledError:
        # Closed (as recent redis-py releases do themselves): the server ends the wait, and no
        # reply of it is read later as another command's.
        await connection.disconnect(nowait=True)
        raise
    if reply is None and loop.time() - started >= timeout:
        # redis.asyncio answers None to a read that timed out: its reply may still come, so
        # this connection must not serve another command.
        await connection.disconnect()
        raise redis.TimeoutError(f"no reply to {args[0]!s} within {timeout} s")
    return reply


# --- Without the module: the script ------------------------------------------------------------
#
# A server without the module answers COMMAND INFO SEM.ACQUIRE with [nil]. Each connection pool
# asks (again every _BACKEND_TTL while the answer is "no module", so a module loaded later is
# picked up); without the module, SEM.ACQUIRE, ACQUIREFAIR, REFRESH, RELEASE, GET and LIMIT run
# as the script redsem.lua (shipped in this package; its one source is the repository's
# clients/scripts/redsem.lua) over the very keys the module keeps. The script keeps a line of
# waiters in the server and hands freed permits to them itself: a waiter takes its place with
# LINE and blocks on its own list <name>:wake:<id>, where the script tells it its grant.

# What each pool answered (True: the module is loaded) and when (monotonic), kept as long as the
# pool lives.
_backends: "weakref.WeakKeyDictionary[Any, Tuple[bool, float]]" = weakref.WeakKeyDictionary()
_backends_lock = threading.Lock()

# A "no module" answer is asked again after this many seconds: a module loaded later is used
# from then on (at once when a script call answers that it is loaded).
_BACKEND_TTL = 10.0

# The longest BLPOP of a wait: the script holds a waiter's place 6 s after its last attempt, so
# a waiter tries again at least this often (the script's NUDGE_MS).
_NUDGE = 2.5
# How long after a lease's deadline the first waiter sends TICK: the lease ends at its deadline,
# not before.
_TICK_LATE = 0.002

# The first line of the script as shipped; the text for new places has "#!lua" instead, so the
# server refuses it with its own OOM error when memory is full.
_OOM_SHEBANG = b"#!lua flags=allow-oom"


@functools.lru_cache(maxsize=None)
def _script(first: bool = False) -> Tuple[bytes, str]:
    """The script's text and its SHA1 (EVALSHA's name for it): as shipped (runs when memory is
    full), or (``first``) the text for an acquire that may take a new place."""
    files = getattr(importlib.resources, "files", None)
    if files is not None:  # Python 3.9+
        source: bytes = files(__name__).joinpath("redsem.lua").read_bytes()
    else:
        source = importlib.resources.read_binary(__name__, "redsem.lua")
    if first:
        if not source.startswith(_OOM_SHEBANG):
            raise SemaphoreError("the shipped redsem.lua does not start with " + str(_OOM_SHEBANG))
        source = b"#!lua" + source[len(_OOM_SHEBANG) :]
    return source, hashlib.sha1(source).hexdigest()


def _pool_of(client: Any) -> Any:
    """What the backend is cached on: the client's connection pool (shared by client())."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


def _fresh(entry: Optional[Tuple[bool, float]]) -> Optional[bool]:
    """A cached answer, or None when there is none or it is a "no module" too old to trust."""
    if entry is None:
        return None
    module, at = entry
    if not module and time.monotonic() - at >= _BACKEND_TTL:
        return None
    return module


def _known_backend(client: Any) -> Optional[bool]:
    with _backends_lock:
        return _fresh(_backends.get(_pool_of(client)))


def _is_module_reply(reply: Any) -> bool:
    """What COMMAND INFO SEM.ACQUIRE answered: ``[nil]`` without the module."""
    return isinstance(reply, (list, tuple)) and len(reply) > 0 and reply[0] is not None


def _note_backend(client: Any, module: bool) -> bool:
    with _backends_lock:
        _backends[_pool_of(client)] = (module, time.monotonic())
    return module


def _has_module(client: redis.Redis) -> bool:
    """Whether the server of ``client``'s pool has the module (see above)."""
    known = _known_backend(client)
    if known is not None:
        return known
    # "COMMAND INFO" as one name: redis-py has no reply callback for it (the one of COMMAND
    # cannot read [nil]), and sends it as two words.
    reply = _execute(client, "COMMAND INFO", "SEM.ACQUIRE")
    return _note_backend(client, _is_module_reply(reply))


async def _has_module_async(client: redis.asyncio.Redis) -> bool:
    """As _has_module, for redis.asyncio."""
    known = _known_backend(client)
    if known is not None:
        return known
    reply = await _execute_async(client, "COMMAND INFO", "SEM.ACQUIRE")
    return _note_backend(client, _is_module_reply(reply))


def _keys(name: Identifier) -> List[Identifier]:
    """The script's 6 keys: the semaphore's, the module's derived keys, and the wake-up key."""
    suffixes = ("", ":owner", ":counter", ":permits", ":limit", ":wake")
    if isinstance(name, bytes):
        return [name + suffix.encode() for suffix in suffixes]
    return [name + suffix for suffix in suffixes]


def _wake_key(name: Identifier, identifier: Identifier) -> Identifier:
    """The waiter's own list, where the script tells it its grant: <name>:wake:<id>."""
    if isinstance(name, bytes) or isinstance(identifier, bytes):
        return _encoded(name) + b":wake:" + _encoded(identifier)
    return f"{name}:wake:{identifier}"


def _script_args(args: Args, load: bool, first: bool = False) -> Args:
    """``SEM.<OP> name rest...`` as the script's EVALSHA (or EVAL, which also loads it);
    ``first``: the text for an acquire that may take a new place."""
    op = str(args[0]).upper()
    if not op.startswith("SEM."):
        raise ValueError(f"{op} is not a redsem command")
    source, sha = _script(first)
    head: Args = ["EVAL", source] if load else ["EVALSHA", sha]
    return [*head, 6, *_keys(cast(Identifier, args[1])), op[4:], *args[2:]]


def _send(conn: _SyncConn, scripts: bool, args: Args, first: bool = False) -> Any:
    """Sends a single-semaphore SEM.* command, as itself or (``scripts``) through the script."""
    if not scripts:
        return _execute(conn, *args)
    try:
        return _execute(conn, *_script_args(args, False, first))
    except redis.exceptions.NoScriptError:  # not loaded yet (or flushed): EVAL loads it
        return _execute(conn, *_script_args(args, True, first))


async def _send_async(conn: _AsyncConn, scripts: bool, args: Args, first: bool = False) -> Any:
    """As _send, for redis.asyncio."""
    if not scripts:
        return await _execute_async(conn, *args)
    try:
        return await _execute_async(conn, *_script_args(args, False, first))
    except redis.exceptions.NoScriptError:
        return await _execute_async(conn, *_script_args(args, True, first))


def _attempt(reply: Any) -> Tuple[Any, float, int]:
    """The script's ACQUIRE answer ``[reply, retry_ms, ahead]``: the module's reply (None:
    refused), the seconds until the earliest holder's lease ends (0: none), and how many wait
    before the caller (-1: the module is loaded, and the reply is its own)."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        raise redis.ResponseError(f"unexpected answer of the redsem script: {reply!r}")
    granted, retry_ms, ahead = reply
    return (None if granted is False else granted), int(retry_ms or 0) / 1000, int(ahead)


def _nudge(message: Optional[str]) -> float:
    """The seconds an "H<ms>" message of the script's line gives until a lease ends (0.0: the
    message is another)."""
    if message and message[0] == "H" and message[1:].isdigit():
        return int(message[1:]) / 1000
    return 0.0


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _server_error(message: str) -> redis.ResponseError:
    """The server's error ``message`` as redis-py raises it (its class by the code)."""
    try:
        from redis._parsers.base import BaseParser  # redis-py 5+
    except ImportError:  # pragma: no cover
        return redis.ResponseError(message)
    return cast(redis.ResponseError, cast(Any, BaseParser).parse_error(message))


def _told(options: "_Options", identifier: Identifier, message: str) -> Any:
    """What a grant told on the waiter's list (or answered by LEAVE) means: ``G`` and
    ``G<ticket>`` the module's reply to the acquire, ``E<error>`` that error, raised."""
    if message.startswith("E"):
        raise _server_error(message[1:])
    if options.fair:
        return [identifier, int(message[1:])]
    return identifier


def _wait_deadline(wait: Optional[float]) -> float:
    """The monotonic time a script-side wait ends (inf: no limit; now: no wait)."""
    return time.monotonic() + (wait or 0.0)


def _wait_left(wait: Optional[float], deadline: float) -> Optional[float]:
    """What is left, at this send, of a wait (None, 0: no wait; math.inf: no limit) that ends at
    ``deadline`` (monotonic): a call resent after a move or a failover waits only that long."""
    if not wait or math.isinf(wait):
        return wait
    return max(deadline - time.monotonic(), 0.0)


def _blocks_for(wait: Optional[float]) -> Optional[float]:
    """How long a call with this wait may block in the server (None: without limit)."""
    if wait and math.isinf(wait):
        return None
    return wait or 0.0


# --- Where the calls go: one server, or the slot's primary in Redis Cluster --------------------
#
# A semaphore's calls (or a set's) go through a line: on a plain client, the client itself or
# one connection of its pool (a permit's own); on a cluster client, a connection to the
# primary serving the names' slot, opened again on the slot's new owner after a move or a
# failover. Each call on a line is an operation given a _Hop: the connection, whether that
# server runs the script (no module), and, in Cluster, the names whose keys the long form adds.

# The commands on a set of semaphores: their keys follow every argument in the long form.
_SET_COMMANDS = ("SEM.ACQUIREALL", "SEM.RELEASEALL", "SEM.REFRESHALL")


def _encoded(name: Identifier) -> bytes:
    return name if isinstance(name, bytes) else name.encode()


def _shown(name: Identifier) -> str:
    return name if isinstance(name, str) else name.decode("utf-8", "backslashreplace")


def _has_hash_tag(name: bytes) -> bool:
    """Redis's rule: the bytes between the first ``{`` and the first ``}`` after it, if any."""
    start = name.find(b"{")
    return start >= 0 and name.find(b"}", start + 1) > start + 1


def _cluster_slot(names: Sequence[Identifier]) -> int:
    """The one slot of the names' keys in Redis Cluster, or ValueError before anything is sent:
    a name without a hash tag, or names in different slots."""
    slots: List[Tuple[Identifier, int]] = []
    for name in names:
        raw = _encoded(name)
        if not _has_hash_tag(raw):
            n = _shown(name)
            raise ValueError(
                f'in Redis Cluster a semaphore\'s name needs a hash tag, e.g. "{{{n}}}" or '
                f'"app:{{{n}}}": the keys of "{n}" ({n}, {n}:owner, {n}:counter, {n}:permits, '
                f"{n}:limit) would fall in different slots"
            )
        slots.append((name, key_slot(raw)))
    first, slot = slots[0]
    for other, other_slot in slots[1:]:
        if other_slot != slot:
            raise ValueError(
                "in Redis Cluster the semaphores of a set must share a slot: give their names "
                f'one hash tag, e.g. "{{app}}a" and "{{app}}b" ("{_shown(first)}" is in slot '
                f'{slot}, "{_shown(other)}" in slot {other_slot})'
            )
    return slot


def _long_form(args: Args, names: Sequence[Identifier]) -> Args:
    """A SEM.* command with every key named (what Redis Cluster routes by): a semaphore's four
    keys after its name, a set's after every argument; other commands as they are."""
    command = str(args[0]).upper()
    if command in _SET_COMMANDS:
        return [*args, *(key for name in names for key in _keys(name)[1:5])]
    if command.startswith("SEM."):
        return [args[0], args[1], *_keys(cast(Identifier, args[1]))[1:5], *args[2:]]
    return args


class _Hop:
    """One connection a line's operation runs on, and how commands are sent there."""

    def __init__(
        self,
        conn: _SyncConn,
        scripts: bool,
        names: Optional[Sequence[Identifier]],
        side: Optional[Callable[[Args], Any]] = None,
        on_module: Optional[Callable[[], None]] = None,
    ) -> None:
        self.conn = conn
        #: The server runs the script (it has no module).
        self.scripts = scripts
        #: In Cluster: the line resends a call after a redirection or a lost connection.
        self.cluster = names is not None
        self._names = names  # in Cluster: the long form's names
        self._side = side
        self._on_module = on_module

    def _form(self, args: Args) -> Args:
        # The script names its 6 keys itself.
        return args if self._names is None or self.scripts else _long_form(args, self._names)

    def send(self, args: Args, first: bool = False) -> Any:
        """A SEM.* command, as itself or through the script (``first``: its text for an acquire
        that may take a new place)."""
        return _send(self.conn, self.scripts, self._form(args), first)

    def blocking(self, args: Args, block: Optional[float], once: bool = False) -> Any:
        """A command that may block ``block`` seconds in the server (None: without limit);
        ``once``: on this connection or not at all (see _run_blocking)."""
        return _run_blocking(self.conn, self._form(args), block, once)

    def waiting(self, command: Callable[[], Tuple[Args, Optional[float]]]) -> Tuple[Any, float]:
        """A wait: the blocking command ``command()`` makes for the time left then (its
        arguments, and how long it may block), sent again when UNBLOCKED cuts it. Returns its
        reply and the monotonic time of its last send."""
        while True:
            sent = time.monotonic()
            args, block = command()
            try:
                return self.blocking(args, block), sent
            except redis.exceptions.ResponseError as err:
                if not _unblocked(err):
                    raise

    def side(self, args: Args) -> Any:
        """A script operation on another connection to the same server, while this one blocks
        (thread-safe)."""
        if self._side is None:
            return _send(self.conn, True, args)
        return self._side(args)

    def use_module(self) -> None:
        """The server has the module after all (a script call said so): use it from now on."""
        self.scripts = False
        if self._on_module is not None:
            self._on_module()


# Idle connections of the line's own (_OwnConnection), per plain client's pool: a few are kept
# for the next waits.
_idle: "weakref.WeakKeyDictionary[Any, List[Any]]" = weakref.WeakKeyDictionary()
_idle_lock = threading.Lock()
_IDLE_KEPT = 4


class _OwnConnection:
    """A connection made with a plain client's pool settings but outside its pool: what a wait
    blocks (or a BOUND permit keeps), so that waits never take the connections the
    application's calls and the holders' releases need. Used as a single-connection client
    (what _execute and _run_blocking need of one); kept idle for the next wait when it ends
    well (a few per pool), closed when it did not (its reply may still come)."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool = pool
        self.connection = connection

    @classmethod
    def take(cls, pool: Any) -> "_OwnConnection":
        with _idle_lock:
            idle = _idle.get(pool)
            connection = idle.pop() if idle else None
        if connection is None:
            connection = pool.connection_class(**dict(pool.connection_kwargs))
        else:
            try:  # closed by the server meanwhile, or a reply left unread: a new socket
                if connection.can_read():
                    connection.disconnect()
            except Exception:
                connection.disconnect()
        return cls(pool, connection)

    def execute_command(self, *args: Union[str, bytes, int, float]) -> Any:
        self.connection.send_command(*args)
        return self.connection.read_response()

    def close(self, broken: bool = False) -> None:
        connection, self.connection = self.connection, None
        if connection is None:
            return
        if not broken:
            with _idle_lock:
                idle = _idle.setdefault(self._pool, [])
                if len(idle) < _IDLE_KEPT:
                    idle.append(connection)
                    return
        connection.disconnect()


class _AsyncOwnConnection:
    """As _OwnConnection, for redis.asyncio."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool = pool
        self.connection = connection

    @classmethod
    async def take(cls, pool: Any) -> "_AsyncOwnConnection":
        with _idle_lock:
            idle = _idle.get(pool)
            connection = idle.pop() if idle else None
        if connection is None:
            connection = pool.connection_class(**dict(pool.connection_kwargs))
        else:
            try:
                # can_read in redis-py 8, can_read_destructive before.
                readable = getattr(connection, "can_read", None) or connection.can_read_destructive
                if connection.is_connected and await readable():
                    await connection.disconnect()
            except Exception:
                await connection.disconnect()
        return cls(pool, connection)

    async def initialize(self) -> None:
        pass

    async def execute_command(self, *args: Union[str, bytes, int, float]) -> Any:
        await self.connection.send_command(*args)
        return await self.connection.read_response()

    async def aclose(self, broken: bool = False) -> None:
        connection, self.connection = self.connection, None
        if connection is None:
            return
        if not broken:
            with _idle_lock:
                idle = _idle.setdefault(self._pool, [])
                if len(idle) < _IDLE_KEPT:
                    idle.append(connection)
                    return
        await connection.disconnect()


class _Line:
    """Where the calls of one semaphore or set go (see above)."""

    #: The client the line's calls go through.
    client: Client

    #: Whether the server of the last call runs the script (it has no module).
    scripts = False

    def open(self, needs: Optional[str]) -> None:
        """Finds out the server's backend; ModuleRequired(needs) when it runs the script."""
        self.run(lambda hop: None)
        if needs is not None and self.scripts:
            raise ModuleRequired(needs)

    def run(
        self, op: Callable[[_Hop], _T], until: Optional[float] = None, once: bool = False
    ) -> _T:
        """Runs ``op``; in Cluster, again after a move or a failure (until the monotonic time
        ``until`` at the latest). ``once``: on the line's connection as it is, or an error."""
        raise NotImplementedError

    def send(self, args: Args, until: Optional[float] = None) -> Any:
        """One SEM.* command (in Cluster resent until ``until``, as run)."""
        return self.run(lambda hop: hop.send(args), until)

    def settle(self, keep: bool) -> None:
        """The acquire is over (see _PlainLine.settle)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _PlainLine(_Line):
    """A plain client's line: the client itself (each call borrows a connection of its pool for
    that call only), or (``own``: a call that blocks in the server, or a BOUND permit) a
    connection of the line's own outside the pool (see _OwnConnection)."""

    def __init__(self, client: redis.Redis, own: bool) -> None:
        self.client = self._client = client
        self._own = own
        self._conn: Optional[_OwnConnection] = None
        self._kept: Optional[_OwnConnection] = None  # a BOUND permit's, kept open to its release

    def open(self, needs: Optional[str]) -> None:
        # Asked once per pool; no connection of the line's own yet.
        self.scripts = not _has_module(self._client)
        if needs is not None and self.scripts:
            raise ModuleRequired(needs)

    def _side(self, args: Args) -> Any:
        # The client's pool lends another connection for the call.
        return _send(self._client, True, args)

    def _use_module(self) -> None:
        _note_backend(self._client, True)
        self.scripts = False

    def run(
        self, op: Callable[[_Hop], _T], until: Optional[float] = None, once: bool = False
    ) -> _T:
        # Cached per pool; asked again while on the script, so a module loaded later is used.
        self.scripts = not _has_module(self._client)
        if not self._own:
            return op(_Hop(self._client, self.scripts, None, self._side, self._use_module))
        conn = self._conn
        if conn is None:
            if once:
                raise redis.ConnectionError("the connection of the line closed")
            conn = self._conn = _OwnConnection.take(self._client.connection_pool)
        try:
            return op(_Hop(conn, self.scripts, None, self._side, self._use_module))
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            # Interrupted or without an answer: closed, so the server ends a wait on it and no
            # late reply is read as another command's.
            self._conn = None
            conn.close(broken=True)
            raise

    def send(self, args: Args, until: Optional[float] = None) -> Any:
        if self._own:
            return super().send(args, until)
        # The common call of a held permit: on a borrowed connection, no hop needed.
        self.scripts = not _has_module(self._client)
        return _send(self._client, self.scripts, args)

    def settle(self, keep: bool) -> None:
        """The acquire is over: later calls borrow the pool's connections; the line's own goes
        back, or (``keep``: BOUND) stays open, unused, until close()."""
        if keep:
            self._kept, self._conn = self._conn, None
        self._close_own()
        self._own = False

    def _close_own(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def close(self) -> None:
        self._close_own()
        self._own = False
        if self._kept is not None:
            kept, self._kept = self._kept, None
            kept.close(broken=True)  # closing it ends the binding


# Errors after which a call in Cluster waits and is sent again to the slot's owner (found anew):
# a slot on the move or a cluster without agreement, a node loading, down or gone, a replica.
_PAUSED = (
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.SlotNotCoveredError,
)
# Failures that no wait mends: raised at once.
_NOT_RETRIED = tuple(
    getattr(redis.exceptions, name)
    for name in ("AuthenticationError", "AuthorizationError", "MaxConnectionsError")
    if hasattr(redis.exceptions, name)
)
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0

# What each cluster client's nodes answered to COMMAND INFO SEM.ACQUIRE (True: the module) and
# when, by node address: a cluster may get the module node by node.
_node_backends: "weakref.WeakKeyDictionary[Any, Dict[str, Tuple[bool, float]]]" = (
    weakref.WeakKeyDictionary()
)


def _known_node_backend(cluster: Any, node: str) -> Optional[bool]:
    with _backends_lock:
        return _fresh(_node_backends.get(cluster, {}).get(node))


def _note_node_backend(cluster: Any, node: str, module: bool) -> bool:
    with _backends_lock:
        _node_backends.setdefault(cluster, {})[node] = (module, time.monotonic())
    return module


class _Retries:
    """The redirections and failures of a call in Cluster, and the pauses between its sends:
    MOVED and ASK are followed at once, the rest (_PAUSED) waits 50 ms, doubling to 1 s; after
    ``retry_for`` seconds (or at ``until``) the last error is raised as a SemaphoreError."""

    def __init__(self, retry_for: float, until: Optional[float], slot: int) -> None:
        self.started = time.monotonic()
        self.give_up = self.started + retry_for
        if until is not None:
            self.give_up = min(self.give_up, until)
        self.slot = slot
        self.pause = _FIRST_PAUSE

    def next_pause(self, err: BaseException, pauses: bool) -> float:
        """How long to wait before the next send, or the error that ends the call."""
        now = time.monotonic()
        left = self.give_up - now
        if left <= 0:
            raise SemaphoreError(
                f"no answer from the primary of slot {self.slot} after {now - self.started:.1f} "
                f"s of retries through moves and failovers: {type(err).__name__}: {err}"
            ) from err
        if not pauses:
            return 0.0
        pause = min(self.pause, left)
        self.pause = min(self.pause * 2, _LONGEST_PAUSE)
        return pause


class _NodeConnection:
    """One connection of a cluster node's pool, held by one line (what _execute and
    _run_blocking need of a single-connection client). Commands go on it directly: a
    single-connection client would reconnect it after a command once a refresh of the cluster's
    map marked it, and a reconnect gives a BOUND permit back."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        # Some redis-py releases ask for a command name (later ones warn when given one).
        name = inspect.signature(pool.get_connection).parameters.get("command_name")
        needs_name = name is not None and name.default is inspect.Parameter.empty
        self.connection: Any = pool.get_connection("SEM") if needs_name else pool.get_connection()

    def execute_command(self, *args: Union[str, bytes, int, float]) -> Any:
        self.connection.send_command(*args)
        return self.connection.read_response()

    def close(self, broken: bool = False) -> None:
        """Back to the pool; closed first when a call on it failed (its reply may still come)."""
        try:
            if broken:
                self.connection.disconnect()
        finally:
            self._pool.release(self.connection)


def _side_of(pool: Any) -> Callable[[Args], Any]:
    """Script operations on another connection of a node's pool, while the line's blocks."""

    def side(args: Args) -> Any:
        conn = _NodeConnection(pool)
        broken = True
        try:
            reply = _send(conn, True, args)
            broken = False
            return reply
        except redis.exceptions.ResponseError:
            broken = False
            raise
        finally:
            conn.close(broken)

    return side


class _ClusterLine(_Line):
    """In Redis Cluster: a connection to the primary serving the names' slot, held from the first
    call to close(). Every call on it is resent through MOVED (the slot's owner learnt anew), ASK
    (ASKING, then the call, on one connection to the node named) and _PAUSED, with the same
    arguments (the same identifier)."""

    def __init__(
        self, cluster: redis.cluster.RedisCluster, names: Sequence[Identifier], retry_for: float
    ) -> None:
        self.slot = _cluster_slot(names)
        self.client = cluster
        self._cluster: Any = cluster  # its methods are untyped in some redis-py releases
        self._names = names
        self._retry_for = retry_for
        self._conn: Optional[_NodeConnection] = None
        self._node = ""  # the name of the node of self._conn
        # Once settled (a permit held, not BOUND): each call borrows the connection.
        self._borrow = False
        # The renewal's calls and the owner's take turns on the connection.
        self._lock = threading.RLock()

    def _ask(self, conn: _NodeConnection, node: str) -> bool:
        """Whether ``node`` has the module: cached per node, asked again while it has not."""
        module = _known_node_backend(self._cluster, node)
        if module is None:
            reply = conn.execute_command("COMMAND INFO", "SEM.ACQUIRE")
            module = _note_node_backend(self._cluster, node, _is_module_reply(reply))
        return module

    def _connect(self, node: Any) -> Tuple[_NodeConnection, bool]:
        """A connection of ``node``'s pool, and whether the node runs the script."""
        conn = _NodeConnection(self._cluster.get_redis_connection(node).connection_pool)
        try:
            module = self._ask(conn, node.name)
        except BaseException:
            conn.close(broken=True)
            raise
        return conn, not module

    def _hop(self, conn: _NodeConnection, scripts: bool, node: str, own: bool) -> _Hop:
        def use_module() -> None:
            _note_node_backend(self._cluster, node, True)
            if own:
                self.scripts = False

        return _Hop(conn, scripts, self._names, _side_of(conn._pool), use_module)

    def _on_own(self, op: Callable[[_Hop], _T]) -> _T:
        """``op`` on the line's connection, closed when it failed other than by an answer."""
        conn = self._conn
        assert conn is not None
        try:
            return op(self._hop(conn, self.scripts, self._node, True))
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            self._conn = None
            conn.close(broken=True)
            raise

    def run(
        self, op: Callable[[_Hop], _T], until: Optional[float] = None, once: bool = False
    ) -> _T:
        retries = _Retries(self._retry_for, until, self.slot)
        asked: Any = None  # the node an ASK named
        with self._lock:
            if once:
                if self._conn is None:
                    raise redis.ConnectionError(f"no connection to slot {self.slot}'s primary")
                return self._on_own(op)
            while True:
                try:
                    if asked is not None:
                        node, asked = asked, None
                        conn, scripts = self._connect(node)
                        broken = True
                        try:
                            conn.execute_command("ASKING")
                            reply = op(self._hop(conn, scripts, node.name, False))
                            broken = False
                            return reply
                        except redis.exceptions.ResponseError:
                            broken = False
                            raise
                        finally:
                            conn.close(broken)
                    if self._conn is None:
                        node = self._cluster.nodes_manager.get_node_from_slot(self.slot)
                        self._conn, self.scripts = self._connect(node)
                        self._node = node.name
                    elif self.scripts:  # a module loaded since is used
                        self.scripts = not self._ask(self._conn, self._node)
                    try:
                        return self._on_own(op)
                    finally:
                        if self._borrow:
                            self._close()
                except redis.exceptions.MovedError as err:
                    self._close()
                    pause = retries.next_pause(err, pauses=False)
                    moved = getattr(self._cluster.nodes_manager, "move_slot", None)
                    if moved is not None:
                        moved(err)  # the slot's new owner, as MOVED names it
                    else:  # redis-py before 5.1
                        self._cluster.nodes_manager.initialize()
                except redis.exceptions.AskError as err:
                    pause = retries.next_pause(err, pauses=False)
                    asked = self._cluster.get_node(host=err.host, port=err.port)
                    if asked is None:  # a node the client does not know yet
                        pause = retries.next_pause(err, pauses=True)
                except _NOT_RETRIED:
                    raise
                except _PAUSED as err:
                    self._close()
                    pause = retries.next_pause(err, pauses=True)
                if pause > 0:
                    time.sleep(pause)
                    try:
                        self._cluster.nodes_manager.initialize()  # the slot's owner, anew
                    except Exception:
                        pass  # no node answered: the next send finds out

    def _close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def settle(self, keep: bool) -> None:
        """The acquire is over: unless ``keep`` (BOUND), the connection goes back to the node's
        pool and each later call borrows one for itself."""
        if not keep:
            with self._lock:
                self._close()
                self._borrow = True

    def close(self) -> None:
        with self._lock:
            self._close()


def _line(client: Client, names: Sequence[Identifier], retry_for: float, own: bool) -> _Line:
    """The line of a call on ``names`` through ``client`` (a plain or a cluster client)."""
    if isinstance(client, redis.cluster.RedisCluster):
        return _ClusterLine(client, names, retry_for)
    return _PlainLine(client, own)


# The asyncio forms.


class _AsyncNodeConnection:
    """A connection to a node of ``redis.asyncio.cluster``, used as a single-connection client
    (what _execute_async and _run_blocking_async need of one): one of the node's pool, or
    (``own``, for a BOUND permit) one made for the line alone and closed with it. Some redis-py
    releases close every connection of the node's pool when they reload the cluster's map: a
    permit's next call is then resent on a new connection, but a BOUND permit would be given
    back."""

    def __init__(self, node: Any, own: bool) -> None:
        self._node = node
        self._own = own
        if own:
            # No retry of its own, as the node's connections: the line resends.
            kwargs = {**node.connection_kwargs, "retry": AsyncRetry(NoBackoff(), 0)}
            self.connection: Any = node.connection_class(**kwargs)
        else:
            self.connection = node.acquire_connection()

    async def initialize(self) -> None:
        pass

    async def execute_command(self, *args: Union[str, bytes, int, float]) -> Any:
        await self.connection.send_command(*args)
        return await self.connection.read_response()

    async def aclose(self, broken: bool = False) -> None:
        if self._own:
            await self.connection.disconnect()
            return
        try:
            if broken:
                await self.connection.disconnect()
        finally:
            release = getattr(self._node, "release", None)
            if release is not None:
                release(self.connection)
            else:  # redis-py before 6: the node keeps its free connections in a deque
                self._node._free.append(self.connection)


# The connection an operation runs on: a single-connection client, or one of a cluster node.
_SyncConn = Union[redis.Redis, _NodeConnection, _OwnConnection]
_AsyncConn = Union[redis.asyncio.Redis, _AsyncNodeConnection, _AsyncOwnConnection]


class _AsyncHop:
    """As _Hop, for redis.asyncio."""

    def __init__(
        self,
        conn: _AsyncConn,
        scripts: bool,
        names: Optional[Sequence[Identifier]],
        side: Optional[Callable[[Args], Awaitable[Any]]] = None,
        on_module: Optional[Callable[[], None]] = None,
    ) -> None:
        self.conn = conn
        self.scripts = scripts
        self.cluster = names is not None
        self._names = names
        self._side = side
        self._on_module = on_module

    def _form(self, args: Args) -> Args:
        # The script names its 6 keys itself.
        return args if self._names is None or self.scripts else _long_form(args, self._names)

    async def send(self, args: Args, first: bool = False) -> Any:
        return await _send_async(self.conn, self.scripts, self._form(args), first)

    async def blocking(self, args: Args, block: Optional[float], once: bool = False) -> Any:
        return await _run_blocking_async(self.conn, self._form(args), block, once)

    async def waiting(
        self, command: Callable[[], Tuple[Args, Optional[float]]]
    ) -> Tuple[Any, float]:
        """As _Hop.waiting."""
        while True:
            sent = time.monotonic()
            args, block = command()
            try:
                return await self.blocking(args, block), sent
            except redis.exceptions.ResponseError as err:
                if not _unblocked(err):
                    raise

    async def side(self, args: Args) -> Any:
        if self._side is None:
            return await _send_async(self.conn, True, args)
        return await self._side(args)

    def use_module(self) -> None:
        self.scripts = False
        if self._on_module is not None:
            self._on_module()


class _AsyncLine:
    """As _Line, for redis.asyncio."""

    client: AsyncClient

    scripts = False

    async def open(self, needs: Optional[str]) -> None:
        async def nothing(hop: _AsyncHop) -> None:
            return None

        await self.run(nothing)
        if needs is not None and self.scripts:
            raise ModuleRequired(needs)

    async def run(
        self,
        op: Callable[[_AsyncHop], Awaitable[_T]],
        until: Optional[float] = None,
        once: bool = False,
    ) -> _T:
        raise NotImplementedError

    async def send(self, args: Args, until: Optional[float] = None) -> Any:
        """As _Line.send."""
        return await self.run(lambda hop: hop.send(args), until)

    async def settle(self, keep: bool) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class _AsyncPlainLine(_AsyncLine):
    """As _PlainLine, for redis.asyncio."""

    def __init__(self, client: redis.asyncio.Redis, own: bool) -> None:
        self.client = self._client = client
        self._own = own
        self._conn: Optional[_AsyncOwnConnection] = None
        self._kept: Optional[_AsyncOwnConnection] = None

    async def open(self, needs: Optional[str]) -> None:
        self.scripts = not await _has_module_async(self._client)
        if needs is not None and self.scripts:
            raise ModuleRequired(needs)

    async def _side(self, args: Args) -> Any:
        return await _send_async(self._client, True, args)

    def _use_module(self) -> None:
        _note_backend(self._client, True)
        self.scripts = False

    async def run(
        self,
        op: Callable[[_AsyncHop], Awaitable[_T]],
        until: Optional[float] = None,
        once: bool = False,
    ) -> _T:
        self.scripts = not await _has_module_async(self._client)
        if not self._own:
            return await op(
                _AsyncHop(self._client, self.scripts, None, self._side, self._use_module)
            )
        conn = self._conn
        if conn is None:
            if once:
                raise redis.ConnectionError("the connection of the line closed")
            conn = self._conn = await _AsyncOwnConnection.take(self._client.connection_pool)
        try:
            return await op(_AsyncHop(conn, self.scripts, None, self._side, self._use_module))
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            self._conn = None
            await conn.aclose(broken=True)
            raise

    async def send(self, args: Args, until: Optional[float] = None) -> Any:
        if self._own:
            return await super().send(args, until)
        self.scripts = not await _has_module_async(self._client)
        return await _send_async(self._client, self.scripts, args)

    async def settle(self, keep: bool) -> None:
        """As _PlainLine.settle."""
        if keep:
            self._kept, self._conn = self._conn, None
        await self._close_own()
        self._own = False

    async def _close_own(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.aclose()

    async def close(self) -> None:
        await self._close_own()
        self._own = False
        if self._kept is not None:
            kept, self._kept = self._kept, None
            await kept.aclose(broken=True)


class _AsyncClusterLine(_AsyncLine):
    """As _ClusterLine, for redis.asyncio.cluster."""

    def __init__(
        self,
        cluster: redis.asyncio.cluster.RedisCluster,
        names: Sequence[Identifier],
        retry_for: float,
        bound: bool,
    ) -> None:
        self.slot = _cluster_slot(names)
        self._bound = bound  # a connection of the line's own, not one of the node's pool
        self.client = cluster
        self._cluster: Any = cluster
        self._names = names
        self._retry_for = retry_for
        self._conn: Optional[_AsyncNodeConnection] = None
        self._node: Any = None  # the node of self._conn
        self._borrow = False
        self._lock = asyncio.Lock()

    async def _ask(self, conn: _AsyncNodeConnection, node: str) -> bool:
        """As _ClusterLine._ask."""
        module = _known_node_backend(self._cluster, node)
        if module is None:
            reply = await conn.execute_command("COMMAND INFO", "SEM.ACQUIRE")
            module = _note_node_backend(self._cluster, node, _is_module_reply(reply))
        return module

    async def _connect(self, node: Any, own: bool) -> Tuple[_AsyncNodeConnection, bool]:
        conn = _AsyncNodeConnection(node, own)
        try:
            module = await self._ask(conn, node.name)
        except BaseException:
            await conn.aclose(broken=True)
            raise
        return conn, not module

    def _hop(self, conn: _AsyncNodeConnection, scripts: bool, node: Any, own: bool) -> _AsyncHop:
        async def side(args: Args) -> Any:
            other = _AsyncNodeConnection(node, False)
            broken = True
            try:
                reply = await _send_async(other, True, args)
                broken = False
                return reply
            except redis.exceptions.ResponseError:
                broken = False
                raise
            finally:
                await other.aclose(broken)

        def use_module() -> None:
            _note_node_backend(self._cluster, node.name, True)
            if own:
                self.scripts = False

        return _AsyncHop(conn, scripts, self._names, side, use_module)

    async def run(
        self,
        op: Callable[[_AsyncHop], Awaitable[_T]],
        until: Optional[float] = None,
        once: bool = False,
    ) -> _T:
        retries = _Retries(self._retry_for, until, self.slot)
        asked: Any = None
        async with self._lock:
            if once:
                if self._conn is None:
                    raise redis.ConnectionError(f"no connection to slot {self.slot}'s primary")
                return await self._on_own(op)
            while True:
                try:
                    await self._cluster.initialize()  # once per client
                    if asked is not None:
                        node, asked = asked, None
                        conn, scripts = await self._connect(node, own=False)
                        broken = True
                        try:
                            await conn.execute_command("ASKING")
                            reply = await op(self._hop(conn, scripts, node, False))
                            broken = False
                            return reply
                        except redis.exceptions.ResponseError:
                            broken = False
                            raise
                        finally:
                            await conn.aclose(broken)
                    if self._conn is None:
                        node = self._cluster.nodes_manager.get_node_from_slot(self.slot)
                        self._conn, self.scripts = await self._connect(node, self._bound)
                        self._node = node
                    elif self.scripts:  # a module loaded since is used
                        self.scripts = not await self._ask(self._conn, self._node.name)
                    try:
                        return await self._on_own(op)
                    finally:
                        if self._borrow:
                            await self._close()
                except redis.exceptions.MovedError as err:
                    await self._close()
                    pause = retries.next_pause(err, pauses=False)
                    moved = getattr(self._cluster.nodes_manager, "move_slot", None)
                    if moved is not None:
                        await moved(err)
                    else:
                        await self._cluster.nodes_manager.initialize()
                except redis.exceptions.AskError as err:
                    pause = retries.next_pause(err, pauses=False)
                    asked = self._cluster.get_node(host=err.host, port=err.port)
                    if asked is None:
                        pause = retries.next_pause(err, pauses=True)
                except _NOT_RETRIED:
                    raise
                except _PAUSED as err:
                    await self._close()
                    pause = retries.next_pause(err, pauses=True)
                if pause > 0:
                    await asyncio.sleep(pause)
                    try:
                        await self._cluster.nodes_manager.initialize()
                    except Exception:
                        pass

    async def _on_own(self, op: Callable[[_AsyncHop], Awaitable[_T]]) -> _T:
        """As _ClusterLine._on_own."""
        conn = self._conn
        assert conn is not None
        try:
            return await op(self._hop(conn, self.scripts, self._node, True))
        except redis.exceptions.ResponseError:
            raise
        except BaseException:
            self._conn = None
            await conn.aclose(broken=True)
            raise

    async def _close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.aclose()

    async def settle(self, keep: bool) -> None:
        """As _ClusterLine.settle."""
        if not keep:
            async with self._lock:
                await self._close()
                self._borrow = True

    async def close(self) -> None:
        async with self._lock:
            await self._close()


def _async_line(
    client: AsyncClient,
    names: Sequence[Identifier],
    retry_for: float,
    own: bool,
    bound: bool = False,
) -> _AsyncLine:
    """As _line, for redis.asyncio; ``bound``: for a BOUND permit."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return _AsyncClusterLine(client, names, retry_for, bound)
    return _AsyncPlainLine(client, own)


class _Ticker:
    """TICK for the first in line, sent on another connection when the lease that keeps it
    waiting ends, while its BLPOP blocks: nothing in the server serves the line at a lease's end,
    and the waiter's next attempt may be up to _NUDGE away. Each TICK answers when the next lease
    ends; the ticker goes on until stopped."""

    def __init__(self, hop: _Hop, name: Identifier, delay: float) -> None:
        self._hop = hop
        self._name = name
        self._lock = threading.Lock()
        self._pending = True
        self._timer: Optional[threading.Timer] = None
        self._arm(delay)

    def _arm(self, delay: float) -> None:
        timer = threading.Timer(delay + _TICK_LATE, self._fire)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _fire(self) -> None:
        with self._lock:
            if not self._pending:
                return
        try:
            retry_ms = int(self._hop.side(["SEM.TICK", self._name]) or 0)
        except Exception:  # the waiter's next attempt serves the line anyway
            return
        with self._lock:
            if self._pending and retry_ms > 0:
                self._arm(retry_ms / 1000)

    def stop(self) -> None:
        with self._lock:
            self._pending = False
            if self._timer is not None:
                self._timer.cancel()


def _leave(hop: _Hop, options: "_Options", identifier: Identifier) -> None:
    """Best effort, for a waiter interrupted in line: it leaves the line, and a grant made to it
    meanwhile is given back (its caller will never see it)."""
    try:
        told = hop.side(["SEM.LEAVE", options.name, identifier])
        if told and _text(told).startswith("G"):
            hop.side(["SEM.RELEASE", options.name, identifier])
    except Exception:  # its place runs out 6 s after its last attempt
        pass


def _acquire_args(
    options: Union["_Options", "_SetOptions"], identifier: Identifier, deadline: float
) -> Tuple[Args, Optional[float]]:
    """An acquire with the module for what is left of its wait at ``deadline``, and how long it
    may block."""
    wait = _wait_left(options.wait, deadline)
    return options.acquire_command(identifier, wait), _blocks_for(wait)


def _with_module(
    hop: _Hop, options: "_Options", identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """The module was found loaded while waiting: wait with it for the time left."""
    hop.use_module()
    if not _wait_left(options.wait, deadline):
        return None, time.monotonic()
    return hop.waiting(lambda: _acquire_args(options, identifier, deadline))


def _acquire_by_script(
    hop: _Hop, options: "_Options", identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """Acquires through the script, waiting until ``deadline`` (monotonic) in the script's line
    (see above), on the permit's own connection. Returns the module's reply (None: not granted)
    and the monotonic time of the last attempt before the grant (the lease started later)."""
    waits = bool(options.wait)
    command = options.acquire_command(identifier, in_server=False)
    if waits:
        command.append("LINE")
    key = _wake_key(options.name, identifier)
    first, in_line = True, False
    try:
        while True:
            sent = time.monotonic()
            # A place may be taken from this send on, even if its answer never comes.
            in_line = in_line or waits
            try:
                # The first attempt may take a new place: the server refuses it when memory
                # is full.
                granted, retry, ahead = _attempt(hop.send(command, first))
            except redis.exceptions.ResponseError:
                in_line = in_line and not first  # the script changed nothing
                raise
            first = False
            if ahead == -1:  # the module is loaded: its reply, or a wait with it
                in_line = False
                if granted is not None:
                    hop.use_module()
                    return granted, sent
                return _with_module(hop, options, identifier, deadline)
            if granted is not None or not waits:
                return granted, sent
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    told = hop.send(["SEM.LEAVE", options.name, identifier])
                    in_line = False
                    return (_told(options, identifier, _text(told)) if told else None), sent
                seconds = _seconds(min(left, _NUDGE))
                ticker = None
                if ahead == 0 and 0 < retry < float(seconds):
                    ticker = _Ticker(hop, options.name, retry)
                try:
                    popped = hop.blocking(["BLPOP", key, seconds], float(seconds))
                except redis.exceptions.ResponseError as err:
                    if not _unblocked(err):
                        raise
                    popped = None  # cut short: the next attempt keeps the place
                finally:
                    if ticker is not None:
                        ticker.stop()
                message = _text(popped[1]) if popped else None
                # "H<ms>": first in line, a lease ends in ms: block again with a TICK then,
                # while the last attempt keeps the place (the next comes within _NUDGE).
                retry, ahead = _nudge(message), 0
                if not (retry and time.monotonic() - sent < _NUDGE):
                    break
            if message is None:
                continue  # the next attempt renews the place
            if message.startswith(("G", "E")):
                in_line = False
                return _told(options, identifier, message), sent
            if message == "M":
                in_line = False
                return _with_module(hop, options, identifier, deadline)
            # "H" (or "H<ms>" after _NUDGE): the next attempt says when a lease ends.
    except BaseException as err:
        # In Cluster a redirection or a lost node is resent on the slot's owner, where the same
        # identifier keeps or takes the place.
        if in_line and not (hop.cluster and isinstance(err, redis.RedisError)):
            _leave(hop, options, identifier)
        raise


class _AsyncTicker:
    """As _Ticker, for redis.asyncio: a timer of the event loop, the TICK a task."""

    def __init__(self, hop: _AsyncHop, name: Identifier, delay: float) -> None:
        self._hop = hop
        self._name = name
        self._loop = asyncio.get_running_loop()
        self._pending = True
        self._handle: Optional[asyncio.TimerHandle] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._arm(delay)

    def _arm(self, delay: float) -> None:
        self._handle = self._loop.call_later(delay + _TICK_LATE, self._fire)

    def _fire(self) -> None:
        if self._pending:
            self._task = self._loop.create_task(self._tick())

    async def _tick(self) -> None:
        try:
            retry_ms = int(await self._hop.side(["SEM.TICK", self._name]) or 0)
        except Exception:
            return
        if self._pending and retry_ms > 0:
            self._arm(retry_ms / 1000)

    async def stop(self) -> None:
        self._pending = False
        if self._handle is not None:
            self._handle.cancel()
        if self._task is not None:
            # Let a TICK under way finish: cancelled, it would close its pooled connection.
            await asyncio.wait([self._task])


async def _leave_async(hop: _AsyncHop, options: "_Options", identifier: Identifier) -> None:
    """As _leave, for redis.asyncio."""
    try:
        told = await hop.side(["SEM.LEAVE", options.name, identifier])
        if told and _text(told).startswith("G"):
            await hop.side(["SEM.RELEASE", options.name, identifier])
    except Exception:
        pass


async def _with_module_async(
    hop: _AsyncHop, options: "_Options", identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """As _with_module, for redis.asyncio."""
    hop.use_module()
    if not _wait_left(options.wait, deadline):
        return None, time.monotonic()
    return await hop.waiting(lambda: _acquire_args(options, identifier, deadline))


async def _acquire_by_script_async(
    hop: _AsyncHop, options: "_Options", identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """As _acquire_by_script, for redis.asyncio."""
    waits = bool(options.wait)
    command = options.acquire_command(identifier, in_server=False)
    if waits:
        command.append("LINE")
    key = _wake_key(options.name, identifier)
    first, in_line = True, False
    try:
        while True:
            sent = time.monotonic()
            in_line = in_line or waits
            try:
                granted, retry, ahead = _attempt(await hop.send(command, first))
            except redis.exceptions.ResponseError:
                in_line = in_line and not first
                raise
            first = False
            if ahead == -1:
                in_line = False
                if granted is not None:
                    hop.use_module()
                    return granted, sent
                return await _with_module_async(hop, options, identifier, deadline)
            if granted is not None or not waits:
                return granted, sent
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    told = await hop.send(["SEM.LEAVE", options.name, identifier])
                    in_line = False
                    return (_told(options, identifier, _text(told)) if told else None), sent
                seconds = _seconds(min(left, _NUDGE))
                ticker = None
                if ahead == 0 and 0 < retry < float(seconds):
                    ticker = _AsyncTicker(hop, options.name, retry)
                try:
                    popped = await hop.blocking(["BLPOP", key, seconds], float(seconds))
                except redis.exceptions.ResponseError as err:
                    if not _unblocked(err):
                        raise
                    popped = None  # cut short: the next attempt keeps the place
                finally:
                    if ticker is not None:
                        await ticker.stop()
                message = _text(popped[1]) if popped else None
                retry, ahead = _nudge(message), 0
                if not (retry and time.monotonic() - sent < _NUDGE):
                    break
            if message is None:
                continue
            if message.startswith(("G", "E")):
                in_line = False
                return _told(options, identifier, message), sent
            if message == "M":
                in_line = False
                return await _with_module_async(hop, options, identifier, deadline)
    except BaseException as err:
        if in_line and not (hop.cluster and isinstance(err, redis.RedisError)):
            await _leave_async(hop, options, identifier)
        raise


def _is_number(value: object) -> bool:
    """An int or a float, but not a bool (which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_seconds(what: str, value: object, *, positive: bool, infinite: bool) -> None:
    """``value`` is a number of seconds: finite (``infinite``: or math.inf), above 0
    (``positive``) or at least 0; otherwise a ValueError naming ``what``, before anything is
    sent."""
    ok = (
        _is_number(value)
        and not math.isnan(cast(float, value))
        and (infinite or math.isfinite(cast(float, value)))
        and (cast(float, value) > 0 if positive else cast(float, value) >= 0)
    )
    if not ok:
        kind = "greater than 0" if positive else "of at least 0"
        more = " (math.inf: no limit)" if infinite else ""
        raise ValueError(f"{what} must be a finite number of seconds {kind}{more}, not {value!r}")


def _check_integer(what: str, value: object, least: int) -> None:
    """``value`` is an int (not a bool) of at least ``least``; otherwise a ValueError naming
    ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{what} must be an integer of at least {least}, not {value!r}")


def _check_retry_for(retry_for: float) -> None:
    _check_seconds("retry_for", retry_for, positive=False, infinite=False)


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
        retry_for: float,
    ) -> None:
        if not name:
            raise ValueError("the semaphore name must not be empty")
        _check_integer("limit", limit, 1)
        _check_seconds("lease", lease, positive=True, infinite=False)
        if wait is not None:
            _check_seconds("wait", wait, positive=False, infinite=True)
        if count is not None:
            _check_integer("count", count, 1)
        if identifier is not None and not identifier:
            raise ValueError("the identifier must not be empty")
        _check_integer("durable_replicas", durable_replicas, 0)
        _check_integer("durable_timeout_ms", durable_timeout_ms, 0)
        _check_retry_for(retry_for)
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
        self.retry_for = float(retry_for)
        command = "SEM.ACQUIREFAIR" if fair else "SEM.ACQUIRE"
        self._head: Args = [command, name, limit, _seconds(self.lease), "ID"]

    def acquire_command(
        self, identifier: Identifier, wait: Optional[float] = None, in_server: bool = True
    ) -> Args:
        """The acquire, waiting ``wait`` seconds (what is left of options.wait);
        ``in_server=False`` leaves out WAIT and BOUND (the script's form: its caller waits)."""
        args: Args = [*self._head, identifier]
        if self.count is not None:
            args += ["COUNT", self.count]
        if self.fair:
            args.append("WITHTICKET")
        if not in_server:
            return args
        if wait:  # None and 0 do not wait
            args += ["WAIT", "0" if math.isinf(wait) else _seconds(wait)]
        if self.bound:
            args.append("BOUND")
        return args

    @property
    def blocks(self) -> bool:
        """Whether the acquire may block in the server (a wait, WAIT for replicas) or ties the
        permit to its connection (BOUND): then it runs on a connection of its own."""
        return bool(self.wait) or self.bound or self.durable_replicas > 0

    def check_durable(self, acked: int) -> None:
        """NotDurable when fewer than durable_replicas acknowledged the grant."""
        if acked < self.durable_replicas:
            raise NotDurable(
                f"{acked} of {self.durable_replicas} replicas acknowledged the grant "
                f"of {self.name!r} within {self.durable_timeout_ms} ms",
                acked,
                self.durable_replicas,
            )

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
        retry_for: float,
    ) -> None:
        specs: List[Tuple[Identifier, int, int]] = []
        for spec in semaphores:
            name, limit, *rest = spec
            count = rest[0] if rest else 1
            if not name:
                raise ValueError("a semaphore name must not be empty")
            _check_integer(f"the limit of {name!r}", limit, 1)
            _check_integer(f"the count of {name!r}", count, 1)
            if count > limit:
                raise ValueError(f"the count of {name!r} must be an integer from 1 to its limit")
            specs.append((name, limit, count))
        if not 1 <= len(specs) <= 64:
            raise ValueError("a set has from 1 to 64 semaphores")
        encoded = {name if isinstance(name, bytes) else name.encode() for name, _, _ in specs}
        if len(encoded) < len(specs):
            raise ValueError("a semaphore is named twice")
        _check_seconds("lease", lease, positive=True, infinite=False)
        if wait is not None:
            _check_seconds("wait", wait, positive=False, infinite=True)
        if identifier is not None and not identifier:
            raise ValueError("the identifier must not be empty")
        _check_retry_for(retry_for)
        self.semaphores = specs
        self.names = tuple(name for name, _, _ in specs)
        self.lease = float(lease)
        self.wait = wait
        self.fair = fair
        self.bound = bound
        self.identifier = identifier
        self.auto_refresh = auto_refresh
        self.retry_for = float(retry_for)

    def acquire_command(self, identifier: Identifier, wait: Optional[float]) -> Args:
        """The acquire, waiting ``wait`` seconds (what is left of options.wait)."""
        args: Args = ["SEM.ACQUIREALL", len(self.semaphores)]
        for name, limit, count in self.semaphores:
            args += [name, limit, count]
        args += [_seconds(self.lease), "ID", identifier]
        if self.fair:
            args += ["FAIR", "WITHTICKET"]
        if wait:  # None and 0 do not wait
            args += ["WAIT", "0" if math.isinf(wait) else _seconds(wait)]
        if self.bound:
            args.append("BOUND")
        return args

    @property
    def blocks(self) -> bool:
        """As _Options.blocks."""
        return bool(self.wait) or self.bound

    def tickets_of(self, reply: Any) -> Optional[Tuple[int, ...]]:
        """The tickets of a granted reply (``[identifier, [ticket, ...]]`` when fair), else None."""
        return tuple(int(ticket) for ticket in reply[1]) if self.fair else None

    def describe(self) -> str:
        waited = f" within {self.wait} s" if self.wait else ""
        wanted = ", ".join(f"{name!r} ({count} of {limit})" for name, limit, count in self.semaphores)
        return f"the set {wanted} was not granted{waited}"


# How long the release of a grant nobody saw is tried (in Cluster, resent through a failover).
_FORGET_FOR = 2.0


def _unseen(err: BaseException) -> bool:
    """Whether an acquire that raised ``err`` may have been granted unseen: anything but the
    server's answer (a refusal, an error) or a check before sending. An interrupt, a
    cancellation, a lost connection or a timeout may come after the grant."""
    return not isinstance(err, (redis.exceptions.ResponseError, NotAcquired, ModuleRequired))


def _forget(line: _Line, command: Args) -> None:
    """Best effort, after an acquire interrupted or without an answer: ``command`` (the release
    of its identifier) gives back a grant its caller never saw. The line's connection, closed
    first, ended the wait in the server; the release goes on another, and answers 0 where
    nothing was granted."""
    line.close()
    try:
        line.run(lambda hop: hop.send(command), until=time.monotonic() + _FORGET_FOR)
    except Exception:  # unreachable: the grant, if any, runs out with its lease
        pass
    finally:
        line.close()


async def _forget_async(line: _AsyncLine, command: Args) -> None:
    """As _forget, for redis.asyncio; shielded, so a second cancellation does not stop it."""

    async def forget() -> None:
        await line.close()
        try:
            await line.run(lambda hop: hop.send(command), until=time.monotonic() + _FORGET_FOR)
        except Exception:
            pass
        finally:
            await line.close()

    task = asyncio.ensure_future(forget())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def _cut(err: BaseException) -> bool:
    """Whether ``err`` cut a WAIT for replicas short, without its answer."""
    return isinstance(err, (redis.ConnectionError, redis.TimeoutError)) or _unblocked(err)


def _not_found(options: _Options, err: BaseException) -> NotDurable:
    return NotDurable(
        f"WAIT for the grant of {options.name!r} was cut ({type(err).__name__}: {err}), and "
        "the primary serving it since has no such holder",
        0,
        options.durable_replicas,
    )


def _durable(line: _Line, permit: "Permit", granted_on: object) -> None:
    """Raises NotDurable unless ``durable_replicas`` replicas acknowledged the grant: WAIT on
    the connection that wrote it (``granted_on``), sent once. A WAIT cut (its connection lost,
    the primary failed over) is never sent again on another connection, where it would count
    nothing written and answer at once: the holder is refreshed on the primary of now (a write
    of that connection) and WAIT follows on it; a holder not found there was not durable."""
    options = permit._options
    wait: Args = ["WAIT", options.durable_replicas, options.durable_timeout_ms]
    block = options.durable_timeout_ms / 1000 or None

    def on_grant(hop: _Hop) -> Any:
        if hop.conn is not granted_on:
            raise redis.ConnectionError("the grant was written on another connection")
        return hop.blocking(wait, block, once=True)

    try:
        acked = line.run(on_grant, once=True)
    except redis.RedisError as err:
        if not _cut(err):
            raise
        command = permit._refresh_args()

        def again(hop: _Hop) -> Tuple[Any, float, int]:
            sent = time.monotonic()
            reply = hop.send(command)
            if reply != 1:
                return reply, sent, 0
            try:
                return reply, sent, hop.blocking(wait, block, once=True)
            except redis.exceptions.ResponseError as cut:
                if _unblocked(cut):  # a failover under way: in Cluster, again on the new owner
                    raise redis.ConnectionError(str(cut)) from cut
                raise

        reply, sent, acked = line.run(again)
        if not permit._refreshed(command, reply, sent):
            raise _not_found(options, err) from err
    options.check_durable(int(acked))


async def _durable_async(line: _AsyncLine, permit: "AsyncPermit", granted_on: object) -> None:
    """As _durable, for redis.asyncio."""
    options = permit._options
    wait: Args = ["WAIT", options.durable_replicas, options.durable_timeout_ms]
    block = options.durable_timeout_ms / 1000 or None

    async def on_grant(hop: _AsyncHop) -> Any:
        if hop.conn is not granted_on:
            raise redis.ConnectionError("the grant was written on another connection")
        return await hop.blocking(wait, block, once=True)

    try:
        acked = await line.run(on_grant, once=True)
    except redis.RedisError as err:
        if not _cut(err):
            raise
        command = permit._refresh_args()

        async def again(hop: _AsyncHop) -> Tuple[Any, float, int]:
            sent = time.monotonic()
            reply = await hop.send(command)
            if reply != 1:
                return reply, sent, 0
            try:
                return reply, sent, await hop.blocking(wait, block, once=True)
            except redis.exceptions.ResponseError as cut:
                if _unblocked(cut):
                    raise redis.ConnectionError(str(cut)) from cut
                raise

        reply, sent, acked = await line.run(again)
        if not permit._refreshed(command, reply, sent):
            raise _not_found(options, err) from err
    options.check_durable(int(acked))


class _Held:
    """What every permit shares, sync or async, of one semaphore or of a set: identity, and
    whether it is still held."""

    # How many semaphores a refresh or a release must find held.
    _wanted = 1

    def __init__(self, identifier: Identifier, lease: float, sent: float) -> None:
        #: The holder's identifier: ``identifier=``, or the UUID v4 made for this permit.
        self.id: Identifier = identifier
        self.lease = lease
        # The server's deadline is at least this (monotonic clock): the last acquire or refresh
        # confirmed was sent at `sent`, and its lease started when the server ran it, later.
        self._confirmed_until = sent + lease
        self._lost_reason: Optional[str] = None
        self._released: Optional[bool] = None  # the release's outcome, once released
        self._release_error: Optional[BaseException] = None  # of a release without an answer
        self._renewing = False  # refreshed by its client's renewal, until the release begins
        self._entry: Optional[List[Any]] = None  # its place in the renewal's heap

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

    def _renewed(self, command: Args, reply: Any, sent: float) -> bool:
        """A refresh sent by the renewal answered: whether it goes on (a release under way makes
        its answer moot)."""
        if not self._renewing:
            return False
        return self._refreshed(command, reply, sent)

    def _released_with(self, command: Args, reply: Any) -> bool:
        if reply != self._wanted:
            answered = self._answered(command, reply)
            self._mark_lost(f"{answered}: the lease ran out before the release")
        self._released = self._lost_reason is None
        return self._released

    def _release_failed(self, err: BaseException) -> None:
        # No answer: the permit may still be held. It stays releasable (a later release() sends
        # again); not refreshed any more, it runs out at the end of its lease otherwise.
        self._release_error = err

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


# --- Renewal: one scheduler per client refreshes every permit it holds ------------------------
#
# A held permit costs no connection and no thread: the renewal of each client (one daemon thread
# for a sync client, one task for an asyncio one) keeps a heap of the times the permits are due,
# and at each sends the due refreshes, pipelined on one connection borrowed from the pool for
# the round (in Redis Cluster each refresh is a call of its own, resent through a move or a
# failover while its last lease may still run: workers, at most _WORKERS at once, send them so
# a slow one holds up no other).

# A renewal with no permit left ends after this many seconds.
_LINGER = 5.0
# Refreshes due within this many seconds of the first are sent in the same round.
_ROUND_SLACK = 0.05
# At most this many refreshes go in one pipeline.
_ROUND_MOST = 1000
# In Redis Cluster: at most this many refreshes under way at once (each borrows a connection).
_WORKERS = 8


def _due(permit: "_Held", failed: bool = False) -> float:
    """When ``permit`` is refreshed next: lease/3 after the last confirmed send, or (after a
    refresh without an answer) a lease/3 from now."""
    if failed:
        return time.monotonic() + permit.lease / 3
    return permit._confirmed_until - permit.lease * 2 / 3


def _renewal_args(permit: "_Held", scripts: bool) -> Args:
    """A refresh as the round sends it: the module's command, or the script's EVALSHA."""
    command = permit._refresh_args()
    if scripts and isinstance(permit, _PermitState):
        return _script_args(command, False)
    return command


class _Workers:
    """Threads that run the refreshes of cluster clients' permits: started when work comes, at
    most _WORKERS, each ending after a second with nothing to do."""

    def __init__(self) -> None:
        self._work: List[Callable[[], None]] = []
        self._cond = threading.Condition(threading.Lock())
        self._threads = 0
        self._idle = 0

    def submit(self, work: Callable[[], None]) -> None:
        with self._cond:
            self._work.append(work)
            if self._idle > 0:
                self._cond.notify()
            elif self._threads < _WORKERS:
                self._threads += 1
                threading.Thread(target=self._run, name="redsem-refresh", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._work:
                    self._idle += 1
                    self._cond.wait(1.0)
                    self._idle -= 1
                    if not self._work:
                        self._threads -= 1
                        return
                work = self._work.pop(0)
            try:
                work()
            except Exception:  # a refresh's own errors are handled where it runs
                pass


_workers = _Workers()


class _Renewal:
    """The renewal of one sync client (see above)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._heap: List[List[Any]] = []  # [due, order, permit or None once it left]
        self._dead = 0  # entries whose permit left
        self._order = 0
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._sleeps_until = math.inf  # when the thread wakes up next by itself

    def add(self, permit: "_SyncHeld", failed: bool = False) -> None:
        with self._cond:
            if not permit._renewing:
                return
            entry = [_due(permit, failed), self._order, permit]
            self._order += 1
            permit._entry = entry
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redsem-renewal", daemon=True
                )
                self._thread.start()
            elif cast(float, entry[0]) < self._sleeps_until:
                self._cond.notify()

    def remove(self, permit: "_SyncHeld") -> None:
        with self._cond:
            permit._renewing = False
            entry, permit._entry = permit._entry, None
            if entry is not None:
                entry[2] = None
                self._dead += 1
                if self._dead > 64 and self._dead * 2 > len(self._heap):
                    self._heap = [e for e in self._heap if e[2] is not None]
                    heapq.heapify(self._heap)
                    self._dead = 0

    def _due_now(self) -> Optional[List["_SyncHeld"]]:
        """Waits for the next round; its permits, or None when no permit is left (the thread
        ends, and the next add starts another)."""
        with self._cond:
            idle_since = None
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                    self._dead -= 1
                now = time.monotonic()
                if not self._heap:
                    # Lingers a while, so permits taken and given back in a row do not start a
                    # thread each.
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= _LINGER:
                        self._thread = None
                        return None
                    self._sleeps_until = idle_since + _LINGER
                elif self._heap[0][0] <= now:
                    break
                else:
                    idle_since = None
                    self._sleeps_until = self._heap[0][0]
                self._cond.wait(self._sleeps_until - now)
            self._sleeps_until = math.inf  # a round under way: an add looks again after it
            due: List["_SyncHeld"] = []
            while self._heap and self._heap[0][0] <= now + _ROUND_SLACK:
                entry = heapq.heappop(self._heap)
                if entry[2] is None:
                    self._dead -= 1
                    continue
                entry[2]._entry = None
                due.append(entry[2])
            return due

    def _run(self) -> None:
        while True:
            due = self._due_now()
            if due is None:
                return
            if self._cluster:
                for permit in due:
                    _workers.submit(functools.partial(self._refresh_one, permit))
                continue
            for start in range(0, len(due), _ROUND_MOST):
                self._round(due[start : start + _ROUND_MOST])

    def _refresh_one(self, permit: "_SyncHeld") -> None:
        failed = False
        try:
            command = permit._refresh_args()
            sent = time.monotonic()
            reply = permit._line.send(command, until=permit._confirmed_until)
            if not permit._renewed(command, reply, sent):
                return
        except Exception:  # unreachable: tried again until the lease is up
            failed = True
        self._again(permit, failed)

    def _again(self, permit: "_SyncHeld", failed: bool) -> None:
        if permit._renewing and not permit.lost:
            self.add(permit, failed)

    def _round(self, due: List["_SyncHeld"]) -> None:
        client = cast(redis.Redis, self._client)
        try:
            scripts = not _has_module(client)
            commands = [_renewal_args(permit, scripts) for permit in due]
            sent = time.monotonic()
            pipe: Any = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            replies: List[Any] = pipe.execute(raise_on_error=False)
        except Exception:  # no answer: each is tried again until its lease is up
            for permit in due:
                self._again(permit, True)
            return
        for permit, reply in zip(due, replies):
            failed = False
            if isinstance(reply, redis.exceptions.NoScriptError):
                try:  # the script is loaded by this send
                    sent = time.monotonic()
                    reply = _send(client, True, permit._refresh_args())
                except Exception as err:
                    reply = err
            if isinstance(reply, Exception):
                failed = True
            elif not permit._renewed(permit._refresh_args(), reply, sent):
                continue
            self._again(permit, failed)


_renewals: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_renewals_lock = threading.Lock()


def _renewal(client: Client) -> _Renewal:
    """The renewal of ``client``, made at its first permit."""
    with _renewals_lock:
        renewal = _renewals.get(client)
        if renewal is None:
            renewal = _renewals[client] = _Renewal(client)
        return cast(_Renewal, renewal)


class _AsyncRenewal:
    """As _Renewal, for an asyncio client: one task of its event loop (ending when no permit is
    left); in Redis Cluster each due refresh is a task of its own, at most _WORKERS sending at
    once."""

    def __init__(self, client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self.loop = loop
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._heap: List[List[Any]] = []
        self._dead = 0
        self._order = 0
        self._task: Optional["asyncio.Task[None]"] = None
        self._wake: Optional[asyncio.Event] = None
        self._sending: Optional[asyncio.Semaphore] = None
        self._refreshing: "set[asyncio.Task[None]]" = set()
        self._sleeps_until = math.inf

    def add(self, permit: "_AsyncHeld", failed: bool = False) -> None:
        if not permit._renewing:
            return
        entry = [_due(permit, failed), self._order, permit]
        self._order += 1
        permit._entry = entry
        heapq.heappush(self._heap, entry)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = self.loop.create_task(self._run())
        elif cast(float, entry[0]) < self._sleeps_until and self._wake is not None:
            self._wake.set()

    def remove(self, permit: "_AsyncHeld") -> None:
        permit._renewing = False
        entry, permit._entry = permit._entry, None
        if entry is not None:
            entry[2] = None
            self._dead += 1
            if self._dead > 64 and self._dead * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._dead = 0

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        idle_since = None
        while True:
            while self._heap and self._heap[0][2] is None:
                heapq.heappop(self._heap)
                self._dead -= 1
            now = time.monotonic()
            if not self._heap:
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= _LINGER:
                    self._task = None
                    return
                self._sleeps_until = idle_since + _LINGER
            elif self._heap[0][0] > now:
                idle_since = None
                self._sleeps_until = self._heap[0][0]
            if self._heap and self._heap[0][0] <= now:
                self._sleeps_until = math.inf
            else:
                # Woken at the time, or by an add() due earlier; no task of its own for the timer.
                wake.clear()
                timer = self.loop.call_later(self._sleeps_until - now, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
                continue
            due: List["_AsyncHeld"] = []
            while self._heap and self._heap[0][0] <= now + _ROUND_SLACK:
                entry = heapq.heappop(self._heap)
                if entry[2] is None:
                    self._dead -= 1
                    continue
                entry[2]._entry = None
                due.append(entry[2])
            if self._cluster:
                if self._sending is None:
                    self._sending = asyncio.Semaphore(_WORKERS)
                for permit in due:
                    task = self.loop.create_task(self._refresh_one(permit))
                    self._refreshing.add(task)
                    task.add_done_callback(self._refreshing.discard)
                continue
            for start in range(0, len(due), _ROUND_MOST):
                await self._round(due[start : start + _ROUND_MOST])

    def _again(self, permit: "_AsyncHeld", failed: bool) -> None:
        if permit._renewing and not permit.lost:
            self.add(permit, failed)

    async def _refresh_one(self, permit: "_AsyncHeld") -> None:
        assert self._sending is not None
        failed = False
        async with self._sending:
            try:
                command = permit._refresh_args()
                sent = time.monotonic()
                reply = await permit._line.send(command, until=permit._confirmed_until)
                if not permit._renewed(command, reply, sent):
                    return
            except Exception:
                failed = True
        self._again(permit, failed)

    async def _round(self, due: List["_AsyncHeld"]) -> None:
        client = cast(redis.asyncio.Redis, self._client)
        try:
            scripts = not await _has_module_async(client)
            commands = [_renewal_args(permit, scripts) for permit in due]
            sent = time.monotonic()
            pipe: Any = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            replies: List[Any] = await pipe.execute(raise_on_error=False)
        except Exception:
            for permit in due:
                self._again(permit, True)
            return
        for permit, reply in zip(due, replies):
            failed = False
            if isinstance(reply, redis.exceptions.NoScriptError):
                try:
                    sent = time.monotonic()
                    reply = await _send_async(client, True, permit._refresh_args())
                except Exception as err:
                    reply = err
            if isinstance(reply, Exception):
                failed = True
            elif not permit._renewed(permit._refresh_args(), reply, sent):
                continue
            self._again(permit, failed)


def _async_renewal(client: AsyncClient) -> _AsyncRenewal:
    """The renewal of ``client`` in the running event loop."""
    loop = asyncio.get_running_loop()
    with _renewals_lock:
        renewal = _renewals.get(client)
        if renewal is None or renewal.loop is not loop:
            renewal = _renewals[client] = _AsyncRenewal(client, loop)
        return cast(_AsyncRenewal, renewal)


_SyncSelf = TypeVar("_SyncSelf", bound="_SyncHeld")
_AsyncSelf = TypeVar("_AsyncSelf", bound="_AsyncHeld")


class _SyncHeld(_Held):
    """Refreshed by its client's renewal (see above), released over the permit's line."""

    _line: _Line

    def _init_sync(self, line: _Line) -> None:
        self._line = line
        self._release_lock = threading.Lock()
        self._renewal: Optional[_Renewal] = None

    def _start_refreshing(self) -> None:
        self._renewing = True
        self._renewal = _renewal(self._line.client)
        self._renewal.add(self)

    def refresh(self) -> bool:
        """Moves the deadline to now + lease (the client's renewal does this every lease/3).
        Returns False, and marks the permit lost, if it had run out."""
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        sent = time.monotonic()
        command = self._refresh_args()
        # In Cluster, resent through a move or a failover while the last lease may still run.
        reply = self._line.send(command, until=self._confirmed_until)
        return self._refreshed(command, reply, sent)

    def release(self) -> bool:
        """Gives the permit back: True if it was held throughout, False if it was lost (then
        the work it guarded may have overlapped another holder's). Later calls repeat the
        answer; after a release that raised (no answer: a connection error, a timeout, an
        interrupt) a later call sends it again."""
        with self._release_lock:
            if self._released is not None:
                return self._released
            self._note_deadline()
            if self._renewal is not None:
                self._renewal.remove(self)
            command = self._release_args()
            try:
                reply = self._line.send(command)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                self._line.close()  # back to the pool
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
    """As _SyncHeld, for redis.asyncio: refreshed by its client's renewal task."""

    _line: _AsyncLine

    def _init_async(self, line: _AsyncLine) -> None:
        self._line = line
        self._release_lock = asyncio.Lock()
        self._renewal: Optional[_AsyncRenewal] = None

    def _start_refreshing(self) -> None:
        self._renewing = True
        self._renewal = _async_renewal(self._line.client)
        self._renewal.add(self)

    async def refresh(self) -> bool:
        """As Permit.refresh."""
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        sent = time.monotonic()
        command = self._refresh_args()
        reply = await self._line.send(command, until=self._confirmed_until)
        return self._refreshed(command, reply, sent)

    async def release(self) -> bool:
        """As Permit.release."""
        async with self._release_lock:
            if self._released is not None:
                return self._released
            self._note_deadline()
            if self._renewal is not None:
                self._renewal.remove(self)
            command = self._release_args()
            try:
                reply = await self._line.send(command)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                await self._line.close()  # back to the pool
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
    """A granted permit: refreshed by its client's renewal every lease/3 while held, given back
    by ``release()`` or at the end of its ``with`` block."""

    def __init__(
        self,
        options: _Options,
        line: _Line,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
    ) -> None:
        _PermitState.__init__(self, options, identifier, ticket, sent)
        self._init_sync(line)

    def release_some(self, count: int) -> bool:
        """Gives back ``count`` of a weighted permit's permits and keeps holding the rest (with
        its deadline and ticket). Returns False, and marks it lost, if it had run out."""
        self._check_release_some(count)
        command: Args = ["SEM.RELEASE", self.name, self.id, "COUNT", count]
        reply = self._line.send(command)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False


class AsyncPermit(_AsyncHeld, _PermitState):
    """The asyncio form of Permit: refreshed by its client's renewal task every lease/3."""

    def __init__(
        self,
        options: _Options,
        line: _AsyncLine,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
    ) -> None:
        _PermitState.__init__(self, options, identifier, ticket, sent)
        self._init_async(line)

    async def release_some(self, count: int) -> bool:
        """As Permit.release_some."""
        self._check_release_some(count)
        command: Args = ["SEM.RELEASE", self.name, self.id, "COUNT", count]
        reply = await self._line.send(command)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False


class PermitSet(_SyncHeld, _SetState):
    """Permits of several semaphores taken at once (``acquire_all``): refreshed together
    (SEM.REFRESHALL) by the client's renewal every lease/3, and lost as soon as any one of them
    is; given back together (SEM.RELEASEALL) by ``release()`` or at the end of its ``with``
    block."""

    def __init__(
        self,
        options: _SetOptions,
        line: _Line,
        identifier: Identifier,
        tickets: Optional[Tuple[int, ...]],
        sent: float,
    ) -> None:
        _SetState.__init__(self, options, identifier, tickets, sent)
        self._init_sync(line)


class AsyncPermitSet(_AsyncHeld, _SetState):
    """The asyncio form of PermitSet."""

    def __init__(
        self,
        options: _SetOptions,
        line: _AsyncLine,
        identifier: Identifier,
        tickets: Optional[Tuple[int, ...]],
        sent: float,
    ) -> None:
        _SetState.__init__(self, options, identifier, tickets, sent)
        self._init_async(line)


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

    client: a ``redis.Redis`` (each call borrows a connection of its pool; a wait blocks one
        of its own), or a ``redis.cluster.RedisCluster`` (calls go to the primary serving the
        name's slot).
    name, limit, lease: the semaphore's key, its number of permits, and the lease in seconds
        (millisecond precision); the permit is refreshed every lease/3 while held. In Redis
        Cluster the name needs a hash tag (``"{jobs}"``, ``"app:{jobs}"``): without one,
        acquire() raises ValueError before sending anything.
    wait: seconds to wait inside the server for a permit; None or 0 do not wait, math.inf
        waits without limit. Without the module the script keeps the line in the server, first
        come first served, and hands a freed permit to the first waiter itself; the package
        blocks on the waiter's own list (``<name>:wake:<id>``) and tries again at least every
        2.5 s. A wait the server ends with UNBLOCKED (a failover, CLIENT UNBLOCK ... ERROR)
        waits again for what is left; one interrupted or cancelled gives back a grant that came
        meanwhile.
    fair: use SEM.ACQUIREFAIR (first come, first served; ``permit.ticket`` is a fencing token).
    count: take this many permits at once (COUNT), all or none.
    bound: BOUND; the permit is given back when its connection closes (the process dies).
        It needs the module: without it, acquire() raises ModuleRequired.
    identifier: the holder's identifier (default: a new UUID v4 per acquire). An identifier
        names one permit: a second acquire with it, while the first permit is held, renews
        that permit rather than taking another (which is what makes a retried acquire safe).
    durable_replicas, durable_timeout_ms: after the grant, ``WAIT durable_replicas
        durable_timeout_ms`` on the connection that wrote it; fewer acknowledgements give the
        permit back and raise NotDurable. A WAIT cut (the connection lost, a failover) is not
        sent again elsewhere: the holder is refreshed on the primary of now and WAIT follows
        there; a holder not found there raises NotDurable.
    auto_refresh: False to refresh by hand (``permit.refresh()``) instead of by the client's
        renewal.
    retry_for: in Redis Cluster, how long (seconds) a call is resent, with the same identifier,
        while its slot moves or its primary fails over (a waiting acquire then waits again on
        the new owner, for what is left of ``wait``, at the end of the line); then it raises
        SemaphoreError. A refresh is resent only while the last lease may still run.

    Without ``identifier``, one Semaphore can be shared by threads; each ``with`` takes its own
    permit. With one, it must not be held twice at once.
    """

    def __init__(
        self,
        client: Client,
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
        retry_for: float = RETRY_FOR,
    ) -> None:
        self.client = client
        self.options = _Options(
            name, limit, lease, wait, fair, count, bound, identifier,
            durable_replicas, durable_timeout_ms, auto_refresh, retry_for,
        )

    def acquire(self) -> Permit:
        """Takes a permit, or raises NotAcquired (or NotDurable, or a redis-py error)."""
        options = self.options
        if not options.blocks and not isinstance(self.client, redis.cluster.RedisCluster):
            return self._acquire_at_once()
        line = _line(self.client, [options.name], options.retry_for, own=options.blocks)
        identifier = options.identifier or str(uuid.uuid4())
        granted_on: List[object] = [None]  # the connection of the last send
        try:
            line.open("BOUND" if options.bound else None)
            deadline = _wait_deadline(options.wait)

            def attempt(hop: _Hop) -> Tuple[Any, float]:
                granted_on[0] = hop.conn
                if hop.scripts:
                    if options.bound:  # a node without the module, after a move
                        raise ModuleRequired("BOUND")
                    return _acquire_by_script(hop, options, identifier, deadline)
                return hop.waiting(lambda: _acquire_args(options, identifier, deadline))

            reply, sent = line.run(attempt)
            if reply is None:
                raise NotAcquired(options.describe())
            permit = Permit(options, line, identifier, options.ticket_of(reply), sent)
        except BaseException as err:
            if granted_on[0] is not None and _unseen(err):
                _forget(line, ["SEM.RELEASE", options.name, identifier])
            else:
                line.close()
            raise
        try:
            if options.durable_replicas:
                _durable(line, permit, granted_on[0])
            # A wait for the grant leaves the lease's start unknown: confirm it now.
            if time.monotonic() - sent > options.lease / 3 and not permit.refresh():
                raise PermitLost(permit._lost_message())
        except BaseException:
            try:
                permit.release()
            except Exception:
                pass
            raise
        line.settle(keep=options.bound)
        if options.auto_refresh:
            permit._start_refreshing()
        return permit

    def _acquire_at_once(self) -> Permit:
        """An acquire that neither waits nor binds on a plain client: one call, on a connection
        the pool lends for it (the common case, kept short)."""
        options = self.options
        client = cast(redis.Redis, self.client)
        line = _PlainLine(client, own=False)
        identifier = options.identifier or str(uuid.uuid4())
        sent = time.monotonic()
        try:
            if _has_module(client):
                reply = _execute(client, *options.acquire_command(identifier))
            else:
                line.scripts = True
                hop = _Hop(client, True, None, line._side, line._use_module)
                reply, sent = _acquire_by_script(hop, options, identifier, sent)
        except BaseException as err:
            if _unseen(err):
                _forget(line, ["SEM.RELEASE", options.name, identifier])
            raise
        if reply is None:
            raise NotAcquired(options.describe())
        permit = Permit(options, line, identifier, options.ticket_of(reply), sent)
        try:
            # An answer slower than lease/3 leaves the lease's start unknown: confirm it now.
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
    """The asyncio form of Semaphore, for ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``: ``async with AsyncSemaphore(...) as permit``; the
    same options. A held permit keeps no connection (its client's renewal task refreshes it); a
    wait blocks a connection of its own, outside the pool."""

    def __init__(
        self,
        client: AsyncClient,
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
        retry_for: float = RETRY_FOR,
    ) -> None:
        self.client = client
        self.options = _Options(
            name, limit, lease, wait, fair, count, bound, identifier,
            durable_replicas, durable_timeout_ms, auto_refresh, retry_for,
        )

    async def acquire(self) -> AsyncPermit:
        """As Semaphore.acquire."""
        options = self.options
        if not options.blocks and not isinstance(
            self.client, redis.asyncio.cluster.RedisCluster
        ):
            return await self._acquire_at_once()
        line = _async_line(
            self.client, [options.name], options.retry_for, own=options.blocks, bound=options.bound
        )
        identifier = options.identifier or str(uuid.uuid4())
        granted_on: List[object] = [None]  # the connection of the last send
        try:
            await line.open("BOUND" if options.bound else None)
            deadline = _wait_deadline(options.wait)

            async def attempt(hop: _AsyncHop) -> Tuple[Any, float]:
                granted_on[0] = hop.conn
                if hop.scripts:
                    if options.bound:
                        raise ModuleRequired("BOUND")
                    return await _acquire_by_script_async(hop, options, identifier, deadline)
                return await hop.waiting(lambda: _acquire_args(options, identifier, deadline))

            reply, sent = await line.run(attempt)
            if reply is None:
                raise NotAcquired(options.describe())
            permit = AsyncPermit(options, line, identifier, options.ticket_of(reply), sent)
        except BaseException as err:
            if granted_on[0] is not None and _unseen(err):
                await _forget_async(line, ["SEM.RELEASE", options.name, identifier])
            else:
                await line.close()
            raise
        try:
            if options.durable_replicas:
                await _durable_async(line, permit, granted_on[0])
            if time.monotonic() - sent > options.lease / 3 and not await permit.refresh():
                raise PermitLost(permit._lost_message())
        except BaseException:
            try:
                await permit.release()
            except Exception:
                pass
            raise
        await line.settle(keep=options.bound)
        if options.auto_refresh:
            permit._start_refreshing()
        return permit

    async def _acquire_at_once(self) -> AsyncPermit:
        """As Semaphore._acquire_at_once."""
        options = self.options
        client = cast(redis.asyncio.Redis, self.client)
        line = _AsyncPlainLine(client, own=False)
        identifier = options.identifier or str(uuid.uuid4())
        sent = time.monotonic()
        try:
            if await _has_module_async(client):
                reply = await _execute_async(client, *options.acquire_command(identifier))
            else:
                line.scripts = True
                hop = _AsyncHop(client, True, None, line._side, line._use_module)
                reply, sent = await _acquire_by_script_async(hop, options, identifier, sent)
        except BaseException as err:
            if _unseen(err):
                await _forget_async(line, ["SEM.RELEASE", options.name, identifier])
            raise
        if reply is None:
            raise NotAcquired(options.describe())
        permit = AsyncPermit(options, line, identifier, options.ticket_of(reply), sent)
        try:
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

    client: a ``redis.Redis`` (as for a Semaphore), or a ``redis.cluster.RedisCluster``.
    semaphores: ``(name, limit)`` for one permit of ``name``, or ``(name, limit, count)``; 1 to
        64 distinct names (in Redis Cluster they must share a slot: give them one hash tag,
        ``"{app}gpu"`` and ``"{app}licence"``; else acquire() raises ValueError before sending
        anything).
    lease: seconds, the same for every semaphore; they are refreshed together every lease/3,
        and the set is lost as soon as any one of them is.
    wait: seconds to wait inside the server until the whole set can be granted at once; None
        or 0 do not wait, math.inf waits without limit.
    fair: every semaphore is a fair one (FAIR); ``permits.tickets`` has one fencing ticket per
        semaphore, in the order given.
    bound, identifier, auto_refresh, retry_for: as for Semaphore.

    A set needs the module: without it, acquire() raises ModuleRequired.
    """

    def __init__(
        self,
        client: Client,
        semaphores: Sequence[SemaphoreSpec],
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        auto_refresh: bool = True,
        retry_for: float = RETRY_FOR,
    ) -> None:
        self.client = client
        self.options = _SetOptions(
            semaphores, lease, wait, fair, bound, identifier, auto_refresh, retry_for
        )

    def acquire(self) -> PermitSet:
        """Takes every permit of the set, or raises NotAcquired (then none is held);
        ModuleRequired without the module."""
        options = self.options
        line = _line(self.client, options.names, options.retry_for, own=options.blocks)
        identifier = options.identifier or str(uuid.uuid4())
        sent_once = False
        try:
            line.open("SEM.ACQUIREALL")
            deadline = _wait_deadline(options.wait)

            def attempt(hop: _Hop) -> Tuple[Any, float]:
                nonlocal sent_once
                sent_once = True
                if hop.scripts:  # a node without the module, after a move
                    raise ModuleRequired("SEM.ACQUIREALL")
                return hop.waiting(lambda: _acquire_args(options, identifier, deadline))

            reply, sent = line.run(attempt)
            if reply is None:
                raise NotAcquired(options.describe())
            permits = PermitSet(options, line, identifier, options.tickets_of(reply), sent)
        except BaseException as err:
            if sent_once and _unseen(err):
                _forget(line, ["SEM.RELEASEALL", len(options.names), *options.names, identifier])
            else:
                line.close()
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
        line.settle(keep=options.bound)
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
    """The asyncio form of SemaphoreSet, for ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``; the same options."""

    def __init__(
        self,
        client: AsyncClient,
        semaphores: Sequence[SemaphoreSpec],
        lease: float = 30,
        *,
        wait: Optional[float] = None,
        fair: bool = False,
        bound: bool = False,
        identifier: Optional[Identifier] = None,
        auto_refresh: bool = True,
        retry_for: float = RETRY_FOR,
    ) -> None:
        self.client = client
        self.options = _SetOptions(
            semaphores, lease, wait, fair, bound, identifier, auto_refresh, retry_for
        )

    async def acquire(self) -> AsyncPermitSet:
        """As SemaphoreSet.acquire."""
        options = self.options
        line = _async_line(
            self.client, options.names, options.retry_for, own=options.blocks, bound=options.bound
        )
        identifier = options.identifier or str(uuid.uuid4())
        sent_once = False
        try:
            await line.open("SEM.ACQUIREALL")
            deadline = _wait_deadline(options.wait)

            async def attempt(hop: _AsyncHop) -> Tuple[Any, float]:
                nonlocal sent_once
                sent_once = True
                if hop.scripts:
                    raise ModuleRequired("SEM.ACQUIREALL")
                return await hop.waiting(lambda: _acquire_args(options, identifier, deadline))

            reply, sent = await line.run(attempt)
            if reply is None:
                raise NotAcquired(options.describe())
            permits = AsyncPermitSet(options, line, identifier, options.tickets_of(reply), sent)
        except BaseException as err:
            if sent_once and _unseen(err):
                names = options.names
                await _forget_async(line, ["SEM.RELEASEALL", len(names), *names, identifier])
            else:
                await line.close()
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
        await line.settle(keep=options.bound)
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
    client: Client,
    semaphores: Sequence[SemaphoreSpec],
    lease: float = 30,
    *,
    wait: Optional[float] = None,
    fair: bool = False,
    bound: bool = False,
    identifier: Optional[Identifier] = None,
    auto_refresh: bool = True,
    retry_for: float = RETRY_FOR,
) -> PermitSet:
    """``SemaphoreSet(...).acquire()``: the set's permits, all held, or NotAcquired (none
    held). The PermitSet is a context manager that releases them."""
    return SemaphoreSet(
        client, semaphores, lease, wait=wait, fair=fair, bound=bound,
        identifier=identifier, auto_refresh=auto_refresh, retry_for=retry_for,
    ).acquire()


async def acquire_all_async(
    client: AsyncClient,
    semaphores: Sequence[SemaphoreSpec],
    lease: float = 30,
    *,
    wait: Optional[float] = None,
    fair: bool = False,
    bound: bool = False,
    identifier: Optional[Identifier] = None,
    auto_refresh: bool = True,
    retry_for: float = RETRY_FOR,
) -> AsyncPermitSet:
    """As acquire_all, for redis.asyncio."""
    return await AsyncSemaphoreSet(
        client, semaphores, lease, wait=wait, fair=fair, bound=bound,
        identifier=identifier, auto_refresh=auto_refresh, retry_for=retry_for,
    ).acquire()


def _wait_empty_args(name: Identifier, timeout: float) -> Tuple[Args, Optional[float]]:
    """SEM.WAITEMPTY's arguments, and how long it may block (None: without limit)."""
    if not name:
        raise ValueError("the semaphore name must not be empty")
    _check_seconds("timeout", timeout, positive=False, infinite=True)
    if math.isinf(timeout):
        return ["SEM.WAITEMPTY", name, "0"], None
    # The server reads 0 as "no limit": a timeout of 0 looks for at most a millisecond instead.
    seconds = _seconds(timeout) if timeout > 0 else "0.001"
    return ["SEM.WAITEMPTY", name, seconds], float(seconds)


def _wait_empty_left(
    name: Identifier, timeout: float, deadline: float
) -> Tuple[Args, Optional[float]]:
    """_wait_empty_args for what is left of ``timeout`` at this send."""
    left = timeout if math.isinf(timeout) else max(deadline - time.monotonic(), 0.0)
    return _wait_empty_args(name, left)


def wait_empty(
    client: Client, name: Identifier, timeout: float, *, retry_for: float = RETRY_FOR
) -> bool:
    """Waits until the semaphore ``name`` has no live holder (SEM.WAITEMPTY): True once it has
    none (at once if it has none now), False when ``timeout`` seconds pass first (math.inf:
    no limit). It takes nothing. It blocks the connection, so it uses one of the pool's own
    (in Redis Cluster, one to the primary of the name's slot; ``retry_for`` as for Semaphore).
    It needs the module: without it, it raises ModuleRequired."""
    _wait_empty_args(name, timeout)
    _check_retry_for(retry_for)
    line = _line(client, [name], retry_for, own=True)
    try:
        line.open("SEM.WAITEMPTY")
        deadline = _wait_deadline(timeout)

        def attempt(hop: _Hop) -> Any:
            if hop.scripts:
                raise ModuleRequired("SEM.WAITEMPTY")
            return hop.waiting(lambda: _wait_empty_left(name, timeout, deadline))[0]

        return bool(line.run(attempt) == 1)
    finally:
        line.close()


async def wait_empty_async(
    client: AsyncClient, name: Identifier, timeout: float, *, retry_for: float = RETRY_FOR
) -> bool:
    """As wait_empty, for redis.asyncio."""
    _wait_empty_args(name, timeout)
    _check_retry_for(retry_for)
    line = _async_line(client, [name], retry_for, own=True)
    try:
        await line.open("SEM.WAITEMPTY")
        deadline = _wait_deadline(timeout)

        async def attempt(hop: _AsyncHop) -> Any:
            if hop.scripts:
                raise ModuleRequired("SEM.WAITEMPTY")
            return (await hop.waiting(lambda: _wait_empty_left(name, timeout, deadline)))[0]

        return bool(await line.run(attempt) == 1)
    finally:
        await line.close()


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


def _limit_call(client: Client, command: Args, retry_for: float) -> Any:
    """A SEM.LIMIT call on the client's server, or the primary of its name's slot."""
    _check_retry_for(retry_for)
    line = _line(client, [cast(Identifier, command[1])], retry_for, own=False)
    try:
        return line.run(lambda hop: hop.send(command))
    finally:
        line.close()


async def _limit_call_async(client: AsyncClient, command: Args, retry_for: float) -> Any:
    """As _limit_call, for redis.asyncio."""
    _check_retry_for(retry_for)
    line = _async_line(client, [cast(Identifier, command[1])], retry_for, own=False)
    try:
        return await line.run(lambda hop: hop.send(command))
    finally:
        await line.close()


def stored_limit(
    client: Client, name: Identifier, *, retry_for: float = RETRY_FOR
) -> Optional[int]:
    """The operator's limit stored for the semaphore ``name`` (SEM.LIMIT name), or None when
    there is none. While one is stored, every acquire of ``name`` uses it instead of its own."""
    reply = _limit_call(client, ["SEM.LIMIT", _checked_name(name)], retry_for)
    return None if reply is None else int(reply)


async def stored_limit_async(
    client: AsyncClient, name: Identifier, *, retry_for: float = RETRY_FOR
) -> Optional[int]:
    """As stored_limit, for redis.asyncio."""
    reply = await _limit_call_async(client, ["SEM.LIMIT", _checked_name(name)], retry_for)
    return None if reply is None else int(reply)


def set_limit(
    client: Client, name: Identifier, limit: int, *, retry_for: float = RETRY_FOR
) -> None:
    """Stores an operator's limit for the semaphore ``name`` (SEM.LIMIT name n), 0 to
    4294967295: every acquire of ``name`` uses it instead of its own until clear_limit. 0
    pauses the semaphore; a lower limit takes no permit from its holders."""
    _limit_call(client, _set_limit_args(name, limit), retry_for)


async def set_limit_async(
    client: AsyncClient, name: Identifier, limit: int, *, retry_for: float = RETRY_FOR
) -> None:
    """As set_limit, for redis.asyncio."""
    await _limit_call_async(client, _set_limit_args(name, limit), retry_for)


def clear_limit(client: Client, name: Identifier, *, retry_for: float = RETRY_FOR) -> bool:
    """Removes the operator's limit of the semaphore ``name`` (SEM.LIMIT name CLEAR): acquires
    use their own limits again. True if one was stored, else False."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(_limit_call(client, command, retry_for) == 1)


async def clear_limit_async(
    client: AsyncClient, name: Identifier, *, retry_for: float = RETRY_FOR
) -> bool:
    """As clear_limit, for redis.asyncio."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(await _limit_call_async(client, command, retry_for) == 1)
