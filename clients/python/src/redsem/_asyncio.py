"""The asyncio driver: redis.asyncio's clients over the core, as the sync driver does."""

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
from ._core import (
    _tried,
    Identifier,
    Args,
    SemaphoreSpec,
    AsyncClient,
    RETRY_FOR,
    _T,
    SemaphoreError,
    NotAcquired,
    PermitLost,
    ModuleRequired,
    _add_note,
    _NO_LIMIT,
    _unblocked,
    _TICK_LATE,
    _known_backend,
    _is_module_reply,
    _note_backend,
    _script_args,
    _text,
    _wait_deadline,
    _wait_left,
    _cluster_slot,
    _long_form,
    _idle_lock,
    _idle_of,
    _IDLE_KEPT,
    _PAUSED,
    _NOT_RETRIED,
    _known_node_backend,
    _note_node_backend,
    _Retries,
    _Step,
    _script_line,
    _acquire_args,
    _check_retry_for,
    _Options,
    _SetOptions,
    _FORGET_FOR,
    _unseen,
    _cut,
    _demoted,
    _not_found,
    _Held,
    _PermitState,
    _SetState,
    _ROUND_MOST,
    _WORKERS,
    _renewal_args,
    _Schedule,
    _renewals,
    _renewals_lock,
    _push,
    _pop,
    _wait_empty_args,
    _wait_empty_left,
    _checked_name,
    _set_limit_args,
)



async def _execute_async(conn: _AsyncConn, *args: Union[str, bytes, int, float]) -> Any:
    """As _execute, for redis.asyncio."""
    return await cast(Any, conn).execute_command(*args)


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


async def _has_module_async(client: redis.asyncio.Redis) -> bool:
    """As _has_module, for redis.asyncio."""
    known = _known_backend(client)
    if known is not None:
        return known
    reply = await _execute_async(client, "COMMAND INFO", "SEM.ACQUIRE")
    return _note_backend(client, _is_module_reply(reply))


async def _send_async(conn: _AsyncConn, scripts: bool, args: Args, first: bool = False) -> Any:
    """As _send, for redis.asyncio."""
    if not scripts:
        return await _execute_async(conn, *args)
    try:
        return await _execute_async(conn, *_script_args(args, False, first))
    except redis.exceptions.NoScriptError:
        return await _execute_async(conn, *_script_args(args, True, first))


class _AsyncOwnConnection:
    """As _OwnConnection, for redis.asyncio."""

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool = pool
        self.connection = connection

    @classmethod
    async def take(cls, pool: Any) -> "_AsyncOwnConnection":
        with _idle_lock:
            idle = _idle_of(pool)
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
                idle = _idle_of(self._pool)
                if len(idle) < _IDLE_KEPT:
                    idle.append(connection)
                    return
        await connection.disconnect()


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
    hop: _AsyncHop, options: _Options, identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """As _acquire_by_script, for redis.asyncio."""
    steps = _script_line(options, identifier, deadline, hop.cluster)
    answer: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(Tuple[Any, float], done.value)
        answer, error = None, None
        try:
            answer = await _do_async(hop, step, options, identifier, deadline)
        except BaseException as err:
            error = err


async def _do_async(
    hop: _AsyncHop, step: _Step, options: _Options, identifier: Identifier, deadline: float
) -> Any:
    """As _do, for redis.asyncio."""
    if step.kind == "send":
        return await hop.send(cast(Args, step.args), step.first)
    if step.kind == "block":
        ticker = None if step.tick is None else _AsyncTicker(hop, options.name, step.tick)
        try:
            return await hop.blocking(cast(Args, step.args), step.block)
        finally:
            if ticker is not None:
                await ticker.stop()
    if step.kind == "module":
        hop.use_module()
        return None
    if step.kind == "wait":
        return await _with_module_async(hop, options, identifier, deadline)
    await _leave_async(hop, options, identifier)
    return None


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
                if _unblocked(cut) or _demoted(cut):
                    raise redis.ConnectionError(str(cut)) from cut
                raise

        try:
            reply, sent, acked = await line.run(again)
        except redis.exceptions.ReadOnlyError:
            # One server, now a replica: no primary of now to look for the holder on.
            raise _not_found(options, err) from err
        if not permit._refreshed(command, reply, sent):
            raise _not_found(options, err) from err
    options.check_durable(int(acked))


class _AsyncRenewal:
    """As _Renewal, for an asyncio client: a timer of its event loop while it sleeps (no task: a
    loop closed meanwhile leaves nothing pending), one task during a round; in Redis Cluster
    each due refresh is a task of its own, at most _WORKERS sending at once."""

    def __init__(self, client: AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = weakref.ref(client)  # as _Renewal's
        self.loop = loop
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._schedule = _Schedule()
        self._timer: Optional[asyncio.TimerHandle] = None
        self._round_task: Optional["asyncio.Task[None]"] = None
        self._sending: Optional[asyncio.Semaphore] = None
        self._refreshing: "set[asyncio.Task[None]]" = set()

    def add(self, permit: "_AsyncHeld", failed: bool = False) -> None:
        wake = self._schedule.add(permit, failed)
        # A round under way sets the timer when it ends.
        if self._round_task is None and (wake or self._timer is None):
            self._arm()

    def remove(self, permit: "_AsyncHeld") -> None:
        self._schedule.remove(permit)

    def _arm(self) -> None:
        """Sets the timer for the next round (none when nothing is held any more)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pause = self._schedule.pause(time.monotonic())
        if pause is not None:
            self._timer = self.loop.call_later(pause, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.monotonic()
        pause = self._schedule.pause(now)
        if pause is None:
            return
        if pause > 0:
            self._timer = self.loop.call_later(pause, self._fire)
            return
        self._round_task = self.loop.create_task(self._rounds(self._schedule.take_due(now)))

    async def _rounds(self, due: List["_AsyncHeld"]) -> None:
        try:
            if self._cluster:
                if self._sending is None:
                    self._sending = asyncio.Semaphore(_WORKERS)
                for permit in due:
                    task = self.loop.create_task(self._refresh_one(permit))
                    self._refreshing.add(task)
                    task.add_done_callback(self._refreshing.discard)
                return
            for start in range(0, len(due), _ROUND_MOST):
                await self._round(due[start : start + _ROUND_MOST])
        except asyncio.CancelledError:
            # An application cancelling every task: what this round had not refreshed is tried
            # again at the next.
            for permit in due:
                if permit._entry is None:
                    self._again(permit, True)
            raise
        finally:
            self._round_task = None
            if not self.loop.is_closed():
                self._arm()

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
        client = cast(Optional[redis.asyncio.Redis], self._client())
        if client is None:
            return
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
_AsyncSelf = TypeVar("_AsyncSelf", bound="_AsyncHeld")


class _AsyncHeld(_Held):
    """As _SyncHeld, for redis.asyncio: refreshed by its client's renewal (a loop timer)."""

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


class AsyncPermit(_AsyncHeld, _PermitState):
    """The asyncio form of Permit: refreshed by its client's renewal every lease/3."""

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


class AsyncSemaphore:
    """The asyncio form of Semaphore, for ``redis.asyncio.Redis`` or
    ``redis.asyncio.cluster.RedisCluster``: ``async with AsyncSemaphore(...) as permit``; the
    same options. A held permit keeps no connection (its client's renewal refreshes it); a
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
                command = options.acquire_command(identifier, in_server=False)
                reply, module = _tried(await _send_async(client, True, command, first=True))
                if module:
                    line._use_module()
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


async def _limit_call_async(client: AsyncClient, command: Args, retry_for: float) -> Any:
    """As _limit_call, for redis.asyncio."""
    _check_retry_for(retry_for)
    line = _async_line(client, [cast(Identifier, command[1])], retry_for, own=False)
    try:
        return await line.run(lambda hop: hop.send(command))
    finally:
        await line.close()


async def stored_limit_async(
    client: AsyncClient, name: Identifier, *, retry_for: float = RETRY_FOR
) -> Optional[int]:
    """As stored_limit, for redis.asyncio."""
    reply = await _limit_call_async(client, ["SEM.LIMIT", _checked_name(name)], retry_for)
    return None if reply is None else int(reply)


async def set_limit_async(
    client: AsyncClient, name: Identifier, limit: int, *, retry_for: float = RETRY_FOR
) -> None:
    """As set_limit, for redis.asyncio."""
    await _limit_call_async(client, _set_limit_args(name, limit), retry_for)


async def clear_limit_async(
    client: AsyncClient, name: Identifier, *, retry_for: float = RETRY_FOR
) -> bool:
    """As clear_limit, for redis.asyncio."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(await _limit_call_async(client, command, retry_for) == 1)
