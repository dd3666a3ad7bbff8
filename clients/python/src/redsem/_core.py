"""The package's core, with no I/O: its errors and options, the commands it builds and how it
reads their answers, a permit's state, the script's line as steps, the renewal's schedule.
The sync (_sync) and asyncio (_asyncio) drivers send what it builds."""

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
    Generator,
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
        source: bytes = files(__package__).joinpath("redsem.lua").read_bytes()
    else:
        source = importlib.resources.read_binary(__package__, "redsem.lua")
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


def _attempt(reply: Any) -> Tuple[Any, float, int]:
    """The script's ACQUIRE answer ``[reply, retry_ms, ahead]``: the module's reply (None:
    refused), the seconds until the earliest holder's lease ends (0: none), and how many wait
    before the caller (-1: the module is loaded, and the reply is its own)."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        raise redis.ResponseError(f"unexpected answer of the redsem script: {reply!r}")
    granted, retry_ms, ahead = reply
    return (None if granted is False else granted), int(retry_ms or 0) / 1000, int(ahead)


def _tried(reply: Any) -> Tuple[Any, bool]:
    """What an acquire through the script that does not wait answered: the module's reply (None:
    refused), and whether the module is loaded after all (the script then called it)."""
    granted, _, ahead = _attempt(reply)
    return granted, ahead == -1


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


# Idle connections of the line's own (_OwnConnection), per plain client's pool: a few are kept
# for the next waits.
_idle_lock = threading.Lock()


def _idle_of(pool: Any) -> List[Any]:
    """The idle connections of the line's own kept for ``pool`` (under _idle_lock): kept on the
    pool itself, so they go with it."""
    idle: Optional[List[Any]] = getattr(pool, "_redsem_idle", None)
    if idle is None:
        idle = []
        setattr(pool, "_redsem_idle", idle)
    return idle
_IDLE_KEPT = 4


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


# The script's line as steps: what a waiter sends and how it reads each answer, with no I/O.
# The generator yields what to do next (a _Step), the sync or asyncio driver does it and sends
# back its answer (or throws its error in), and the generator's return value is the acquire's
# (the module's reply, None when not granted, and the monotonic time of the last attempt).


class _Step:
    """One thing a driver of _script_line does: ``kind`` is "send" (``args`` as a SEM.* call
    through the script; ``first``: the text for an acquire that may take a new place), "block"
    (``args`` may block ``block`` seconds; with ``tick``, TICK is sent on another connection
    that many seconds on while it blocks), "module" (the module is loaded: use it), "wait"
    (wait with the module for what is left; answers its reply and send time) or "leave" (best
    effort: leave the line, and give back a grant that came meanwhile)."""

    __slots__ = ("kind", "args", "first", "block", "tick")

    def __init__(
        self,
        kind: str,
        args: Optional[Args] = None,
        first: bool = False,
        block: float = 0.0,
        tick: Optional[float] = None,
    ) -> None:
        self.kind = kind
        self.args = args
        self.first = first
        self.block = block
        self.tick = tick


_USE_MODULE = _Step("module")
_WAIT_WITH_MODULE = _Step("wait")
_LEAVE = _Step("leave")

_Steps = Generator[_Step, Any, Tuple[Any, float]]


def _script_line(
    options: "_Options", identifier: Identifier, deadline: float, cluster: bool
) -> _Steps:
    """Acquires through the script, waiting until ``deadline`` (monotonic) in the script's line
    (see above), as steps. In Cluster (``cluster``) a redirection or a lost node is resent on
    the slot's owner, where the same identifier keeps or takes the place: no LEAVE then."""
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
                granted, retry, ahead = _attempt((yield _Step("send", command, first)))
            except redis.exceptions.ResponseError:
                in_line = in_line and not first  # the script changed nothing
                raise
            first = False
            if ahead == -1:  # the module is loaded: its reply, or a wait with it
                in_line = False
                if granted is not None:
                    yield _USE_MODULE
                    return granted, sent
                reply: Tuple[Any, float] = yield _WAIT_WITH_MODULE
                return reply
            if granted is not None or not waits:
                return granted, sent
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    told = yield _Step("send", ["SEM.LEAVE", options.name, identifier])
                    in_line = False
                    return (_told(options, identifier, _text(told)) if told else None), sent
                seconds = _seconds(min(left, _NUDGE))
                tick = retry if ahead == 0 and 0 < retry < float(seconds) else None
                try:
                    blpop: Args = ["BLPOP", key, seconds]
                    popped = yield _Step("block", blpop, block=float(seconds), tick=tick)
                except redis.exceptions.ResponseError as err:
                    if not _unblocked(err):
                        raise
                    popped = None  # cut short: the next attempt keeps the place
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
                reply = yield _WAIT_WITH_MODULE
                return reply
            # "H" (or "H<ms>" after _NUDGE): the next attempt says when a lease ends.
    except GeneratorExit:
        raise
    except BaseException as err:
        if in_line and not (cluster and isinstance(err, redis.RedisError)):
            yield _LEAVE
        raise


def _acquire_args(
    options: Union["_Options", "_SetOptions"], identifier: Identifier, deadline: float
) -> Tuple[Args, Optional[float]]:
    """An acquire with the module for what is left of its wait at ``deadline``, and how long it
    may block."""
    wait = _wait_left(options.wait, deadline)
    return options.acquire_command(identifier, wait), _blocks_for(wait)


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


def _demoted(err: BaseException) -> bool:
    """Whether ``err`` is a WAIT refused by a node that became a replica between the grant and
    the WAIT (a failover): none of its replicas will acknowledge the grant."""
    return isinstance(err, redis.exceptions.ResponseError) and (
        "WAIT cannot be used with replica instances" in str(err)
    )


def _cut(err: BaseException) -> bool:
    """Whether ``err`` cut a WAIT for replicas short, without its answer."""
    return (
        isinstance(err, (redis.ConnectionError, redis.TimeoutError))
        or _unblocked(err)
        or _demoted(err)
    )


def _not_found(options: _Options, err: BaseException) -> NotDurable:
    return NotDurable(
        f"WAIT for the grant of {options.name!r} was cut ({type(err).__name__}: {err}), and "
        "the primary serving it since has no such holder",
        0,
        options.durable_replicas,
    )


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
# for a sync client, a timer of the event loop for an asyncio one) keeps a heap of the times the
# permits are due, and at each sends the due refreshes, pipelined on one connection borrowed
# from the pool for the round (in Redis Cluster each refresh is a call of its own, resent through a move or a
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


class _Schedule:
    """A renewal's heap of due times, with no I/O: which permits are due, how long to sleep
    until the next, and when a renewal with nothing left ends (after _LINGER, so permits taken
    and given back in a row do not start a thread or task each). Its driver locks it."""

    def __init__(self) -> None:
        self._heap: List[List[Any]] = []  # [due, order, permit or None once it left]
        self._dead = 0  # entries whose permit left
        self._order = 0
        self._idle_since: Optional[float] = None
        #: When the driver wakes up next by itself (inf: a round is under way).
        self.sleeps_until = math.inf

    def add(self, permit: "_Held", failed: bool = False) -> bool:
        """Schedules ``permit`` (while it is renewed); True when it is due before the driver's
        next wake-up, which must then come earlier."""
        if not permit._renewing:
            return False
        entry = [_due(permit, failed), self._order, permit]
        self._order += 1
        permit._entry = entry
        heapq.heappush(self._heap, entry)
        return cast(float, entry[0]) < self.sleeps_until

    def remove(self, permit: "_Held") -> None:
        """``permit`` is renewed no more (its release began)."""
        permit._renewing = False
        entry, permit._entry = permit._entry, None
        if entry is not None:
            entry[2] = None
            self._dead += 1
            if self._dead > 64 and self._dead * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._dead = 0

    def pause(self, now: float) -> Optional[float]:
        """What the driver does at ``now``: 0.0, a round is due (take_due); a number of seconds
        to sleep (unless add() wakes it); None, end (nothing held for _LINGER)."""
        while self._heap and self._heap[0][2] is None:
            heapq.heappop(self._heap)
            self._dead -= 1
        if not self._heap:
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since >= _LINGER:
                self._idle_since = None
                return None
            self.sleeps_until = self._idle_since + _LINGER
        elif self._heap[0][0] <= now:
            self._idle_since = None
            self.sleeps_until = math.inf
            return 0.0
        else:
            self._idle_since = None
            self.sleeps_until = self._heap[0][0]
        return self.sleeps_until - now

    def take_due(self, now: float) -> List[Any]:
        """The permits due by ``now`` (or within _ROUND_SLACK of it), out of the heap until
        added again."""
        due: List[Any] = []
        while self._heap and self._heap[0][0] <= now + _ROUND_SLACK:
            entry = heapq.heappop(self._heap)
            if entry[2] is None:
                self._dead -= 1
                continue
            entry[2]._entry = None
            due.append(entry[2])
        return due


_renewals: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_renewals_lock = threading.Lock()


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
