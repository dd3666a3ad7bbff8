"""The sync driver: redis-py's redis.Redis and redis.cluster.RedisCluster over the core."""

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
    Client,
    RETRY_FOR,
    _T,
    SemaphoreError,
    NotAcquired,
    PermitLost,
    NotDurable,
    ModuleRequired,
    _add_note,
    _NO_LIMIT,
    _unblocked,
    _NUDGE,
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



def _execute(conn: _SyncConn, *args: Union[str, bytes, int, float]) -> Any:
    """conn.execute_command, whose signature some redis-py releases leave untyped."""
    return cast(Any, conn).execute_command(*args)


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


def _has_module(client: redis.Redis) -> bool:
    """Whether the server of ``client``'s pool has the module (see above)."""
    known = _known_backend(client)
    if known is not None:
        return known
    # "COMMAND INFO" as one name: redis-py has no reply callback for it (the one of COMMAND
    # cannot read [nil]), and sends it as two words.
    reply = _execute(client, "COMMAND INFO", "SEM.ACQUIRE")
    return _note_backend(client, _is_module_reply(reply))


def _send(conn: _SyncConn, scripts: bool, args: Args, first: bool = False) -> Any:
    """Sends a single-semaphore SEM.* command, as itself or (``scripts``) through the script."""
    if not scripts:
        return _execute(conn, *args)
    try:
        return _execute(conn, *_script_args(args, False, first))
    except redis.exceptions.NoScriptError:  # not loaded yet (or flushed): EVAL loads it
        return _execute(conn, *_script_args(args, True, first))


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
            idle = _idle_of(pool)
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
                idle = _idle_of(self._pool)
                if len(idle) < _IDLE_KEPT:
                    idle.append(connection)
                    return
        connection.disconnect()


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


# The connection an operation runs on: a single-connection client, or one of a cluster node.
_SyncConn = Union[redis.Redis, _NodeConnection, _OwnConnection]


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


def _with_module(
    hop: _Hop, options: "_Options", identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """The module was found loaded while waiting: wait with it for the time left."""
    hop.use_module()
    if not _wait_left(options.wait, deadline):
        return None, time.monotonic()
    return hop.waiting(lambda: _acquire_args(options, identifier, deadline))


def _acquire_by_script(
    hop: _Hop, options: _Options, identifier: Identifier, deadline: float
) -> Tuple[Any, float]:
    """Drives _script_line on ``hop``: the acquire through the script, waiting in its line."""
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
            answer = _do(hop, step, options, identifier, deadline)
        except BaseException as err:
            error = err


def _do(
    hop: _Hop, step: _Step, options: _Options, identifier: Identifier, deadline: float
) -> Any:
    """One step of _script_line, done on ``hop``."""
    if step.kind == "send":
        return hop.send(cast(Args, step.args), step.first)
    if step.kind == "block":
        ticker = None if step.tick is None else _Ticker(hop, options.name, step.tick)
        try:
            return hop.blocking(cast(Args, step.args), step.block)
        finally:
            if ticker is not None:
                ticker.stop()
    if step.kind == "module":
        hop.use_module()
        return None
    if step.kind == "wait":
        return _with_module(hop, options, identifier, deadline)
    _leave(hop, options, identifier)
    return None


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
                if _unblocked(cut) or _demoted(cut):  # a failover under way: in Cluster, again on the new owner
                    raise redis.ConnectionError(str(cut)) from cut
                raise

        try:
            reply, sent, acked = line.run(again)
        except redis.exceptions.ReadOnlyError:
            # One server, now a replica: no primary of now to look for the holder on.
            raise _not_found(options, err) from err
        if not permit._refreshed(command, reply, sent):
            raise _not_found(options, err) from err
    options.check_durable(int(acked))


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
        # Weak: the renewal (a value of _renewals, keyed by the client) must not keep it alive.
        self._client = weakref.ref(client)
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._schedule = _Schedule()
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None

    def add(self, permit: "_SyncHeld", failed: bool = False) -> None:
        with self._cond:
            wake = self._schedule.add(permit, failed)
            if self._thread is None:
                if permit._renewing:
                    self._thread = threading.Thread(
                        target=self._run, name="redsem-renewal", daemon=True
                    )
                    self._thread.start()
            elif wake:
                self._cond.notify()

    def remove(self, permit: "_SyncHeld") -> None:
        with self._cond:
            self._schedule.remove(permit)

    def _due_now(self) -> Optional[List["_SyncHeld"]]:
        """Waits for the next round; its permits, or None when the thread ends (the next add
        starts another)."""
        with self._cond:
            while True:
                now = time.monotonic()
                pause = self._schedule.pause(now)
                if pause is None:
                    self._thread = None
                    return None
                if pause == 0:
                    return self._schedule.take_due(now)
                self._cond.wait(pause)

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
        client = cast(Optional[redis.Redis], self._client())
        if client is None:  # gone, and its permits with it
            return
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


def _renewal(client: Client) -> _Renewal:
    """The renewal of ``client``, made at its first permit."""
    with _renewals_lock:
        renewal = _renewals.get(client)
        if renewal is None:
            renewal = _renewals[client] = _Renewal(client)
        return cast(_Renewal, renewal)


_SyncSelf = TypeVar("_SyncSelf", bound="_SyncHeld")


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
                command = options.acquire_command(identifier, in_server=False)
                reply, module = _tried(_send(client, True, command, first=True))
                if module:
                    line._use_module()
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


def _limit_call(client: Client, command: Args, retry_for: float) -> Any:
    """A SEM.LIMIT call on the client's server, or the primary of its name's slot."""
    _check_retry_for(retry_for)
    line = _line(client, [cast(Identifier, command[1])], retry_for, own=False)
    try:
        return line.run(lambda hop: hop.send(command))
    finally:
        line.close()


def stored_limit(
    client: Client, name: Identifier, *, retry_for: float = RETRY_FOR
) -> Optional[int]:
    """The operator's limit stored for the semaphore ``name`` (SEM.LIMIT name), or None when
    there is none. While one is stored, every acquire of ``name`` uses it instead of its own."""
    reply = _limit_call(client, ["SEM.LIMIT", _checked_name(name)], retry_for)
    return None if reply is None else int(reply)


def set_limit(
    client: Client, name: Identifier, limit: int, *, retry_for: float = RETRY_FOR
) -> None:
    """Stores an operator's limit for the semaphore ``name`` (SEM.LIMIT name n), 0 to
    4294967295: every acquire of ``name`` uses it instead of its own until clear_limit. 0
    pauses the semaphore; a lower limit takes no permit from its holders."""
    _limit_call(client, _set_limit_args(name, limit), retry_for)


def clear_limit(client: Client, name: Identifier, *, retry_for: float = RETRY_FOR) -> bool:
    """Removes the operator's limit of the semaphore ``name`` (SEM.LIMIT name CLEAR): acquires
    use their own limits again. True if one was stored, else False."""
    command: Args = ["SEM.LIMIT", _checked_name(name), "CLEAR"]
    return bool(_limit_call(client, command, retry_for) == 1)
