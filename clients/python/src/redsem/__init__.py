"""Permits of a redsem semaphore (the Redis module ``sem``) for redis-py.

Install it with ``pip install clients/python`` (the package redsem-client). It needs Python
3.8 or later, redis-py 5 or later (tested with 8.1) and a server with the module loaded.

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
8, whose default ``socket_timeout`` is None, a ``socket_timeout`` you set must exceed ``wait``).

The identifier is made here (a UUID v4) unless ``identifier=`` gives one, so a retried acquire
(redis-py retries on connection errors) renews the same holder rather than taking a second
permit.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import threading
import time
import uuid
from types import TracebackType
from typing import Any, List, Optional, Tuple, Type, Union, cast

import redis
import redis.asyncio

__all__ = [
    "Semaphore",
    "AsyncSemaphore",
    "Permit",
    "AsyncPermit",
    "SemaphoreError",
    "NotAcquired",
    "PermitLost",
    "NotDurable",
]

Identifier = Union[str, bytes]
# A command's arguments as redis-py sends them.
Args = List[Union[str, bytes, int, float]]


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

    def acquire_command(self, identifier: Identifier) -> Args:
        command = "SEM.ACQUIREFAIR" if self.fair else "SEM.ACQUIRE"
        args: Args = [command, self.name, self.limit, _seconds(self.lease), "ID", identifier]
        if self.count is not None:
            args += ["COUNT", self.count]
        if self.fair:
            args.append("WITHTICKET")
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


class _PermitState:
    """What sync and async permits share: identity, and whether the permit is still held."""

    def __init__(
        self, options: _Options, identifier: Identifier, ticket: Optional[int], sent: float
    ) -> None:
        self._options = options
        self.name = options.name
        #: The holder's identifier: ``identifier=``, or the UUID v4 made for this permit.
        self.id: Identifier = identifier
        #: The fencing ticket of a fair permit (only ever grows per name), else None.
        self.ticket = ticket
        #: The number of permits held (COUNT).
        self.count = options.count or 1
        self.lease = options.lease
        # The server's deadline is at least this (monotonic clock): the last acquire or refresh
        # confirmed was sent at `sent`, and its lease started when the server ran it, later.
        self._confirmed_until = sent + options.lease
        self._lost_reason: Optional[str] = None
        self._released: Optional[bool] = None  # the release's outcome, once released

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
        return f"the permit {self.id!r} of {self.name!r} was lost: {self._lost_reason}"

    def _refreshed(self, reply: Any, sent: float) -> bool:
        if reply == 1:
            self._confirmed_until = sent + self.lease
            return True
        self._mark_lost("SEM.REFRESH answered 0 (the lease ran out, or the holder was removed)")
        return False

    def _released_with(self, reply: Any) -> bool:
        if reply != 1:
            self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        self._released = self._lost_reason is None
        return self._released

    def _release_failed(self, err: BaseException) -> None:
        # Not refreshed any more, the permit runs out at the end of its lease.
        self._mark_lost(f"the release failed: {err!r}")
        self._released = False

    def _check_release_some(self, count: int) -> None:
        if self._released is not None:
            raise SemaphoreError("the permit was already released")
        if not 1 <= count < self.count:
            raise ValueError(f"count must be from 1 to {self.count - 1}; use release() for all")

    def __repr__(self) -> str:
        state = "lost" if self._lost_reason else ("released" if self._released else "held")
        ticket = f" ticket={self.ticket}" if self.ticket is not None else ""
        what = f"{self.name!r} id={self.id!r}{ticket} count={self.count}"
        return f"<{type(self).__name__} {what} {state}>"


class Permit(_PermitState):
    """A granted permit: refreshed in a background thread every lease/3 while held, given back
    by ``release()`` or at the end of its ``with`` block."""

    def __init__(
        self,
        options: _Options,
        conn: redis.Redis,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
    ) -> None:
        super().__init__(options, identifier, ticket, sent)
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
        reply = _execute(self._conn, "SEM.REFRESH", self.name, self.id, _seconds(self.lease))
        return self._refreshed(reply, sent)

    def release_some(self, count: int) -> bool:
        """Gives back ``count`` of a weighted permit's permits and keeps holding the rest (with
        its deadline and ticket). Returns False, and marks it lost, if it had run out."""
        self._check_release_some(count)
        reply = _execute(self._conn, "SEM.RELEASE", self.name, self.id, "COUNT", count)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False

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
            try:
                reply = _execute(self._conn, "SEM.RELEASE", self.name, self.id)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                self._conn.close()  # back to the pool
            return self._released_with(reply)

    def __enter__(self) -> "Permit":
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
            _add_note(exc, f"redsem: releasing {self.name!r} failed too: {err!r}")
            return
        if exc is None and not released:
            raise PermitLost(self._lost_message())


class AsyncPermit(_PermitState):
    """The asyncio form of Permit: refreshed by an asyncio task every lease/3 while held."""

    def __init__(
        self,
        options: _Options,
        conn: redis.asyncio.Redis,
        identifier: Identifier,
        ticket: Optional[int],
        sent: float,
    ) -> None:
        super().__init__(options, identifier, ticket, sent)
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
        reply = await _execute_async(self._conn, 
            "SEM.REFRESH", self.name, self.id, _seconds(self.lease)
        )
        return self._refreshed(reply, sent)

    async def release_some(self, count: int) -> bool:
        """As Permit.release_some."""
        self._check_release_some(count)
        reply = await _execute_async(self._conn, "SEM.RELEASE", self.name, self.id, "COUNT", count)
        if reply == 1:
            self.count -= count
            return True
        self._mark_lost("SEM.RELEASE answered 0: the lease ran out before the release")
        return False

    async def release(self) -> bool:
        """As Permit.release."""
        async with self._release_lock:
            if self._released is not None:
                return self._released
            self._note_deadline()
            self._stop.set()
            if self._task is not None and self._task is not asyncio.current_task():
                await self._task
            try:
                reply = await _execute_async(self._conn, "SEM.RELEASE", self.name, self.id)
            except BaseException as err:
                self._release_failed(err)
                raise
            finally:
                await self._conn.aclose()  # back to the pool
            return self._released_with(reply)

    async def __aenter__(self) -> "AsyncPermit":
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
            _add_note(exc, f"redsem: releasing {self.name!r} failed too: {err!r}")
            return
        if exc is None and not released:
            raise PermitLost(self._lost_message())


# The permits entered through `with semaphore` in this thread or task, innermost last, so one
# Semaphore object can be shared by threads and tasks like threading.Semaphore.
_entered: contextvars.ContextVar[Tuple[Tuple[object, _PermitState], ...]] = contextvars.ContextVar(
    "redsem_entered", default=()
)


def _push(semaphore: object, permit: _PermitState) -> None:
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
        waits without limit.
    fair: use SEM.ACQUIREFAIR (first come, first served; ``permit.ticket`` is a fencing token).
    count: take this many permits at once (COUNT), all or none.
    bound: BOUND; the permit is given back when its connection closes (the process dies).
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
        identifier = options.identifier or str(uuid.uuid4())
        # One connection of the pool, for this permit only (client() is untyped in some
        # redis-py releases).
        conn: redis.Redis = cast(Any, self.client).client()
        try:
            sent = time.monotonic()
            command = options.acquire_command(identifier)
            reply = _run_blocking(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permit = Permit(options, conn, identifier, options.ticket_of(reply), sent)
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
        identifier = options.identifier or str(uuid.uuid4())
        conn = self.client.client()
        try:
            sent = time.monotonic()
            command = options.acquire_command(identifier)
            reply = await _run_blocking_async(conn, command, options.blocks_for())
            if reply is None:
                raise NotAcquired(options.describe())
            permit = AsyncPermit(options, conn, identifier, options.ticket_of(reply), sent)
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
