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
client's pool for the call, and one renewal per client (a daemon thread, or a timer of the
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

The package is one core with no I/O (``_core``: the options, the commands and how their answers
are read, a permit's state, the script's line as steps, the renewal's schedule) and two drivers
over it that send what it builds: ``_sync`` for redis-py's sync clients, ``_asyncio`` for
redis.asyncio's. Everything public is imported from here.
"""

from ._asyncio import (
    AsyncPermit as AsyncPermit,
    AsyncPermitSet as AsyncPermitSet,
    AsyncSemaphore as AsyncSemaphore,
    AsyncSemaphoreSet as AsyncSemaphoreSet,
    acquire_all_async as acquire_all_async,
    wait_empty_async as wait_empty_async,
    stored_limit_async as stored_limit_async,
    set_limit_async as set_limit_async,
    clear_limit_async as clear_limit_async,
)
from ._core import (
    Identifier as Identifier,
    Args as Args,
    SemaphoreSpec as SemaphoreSpec,
    Client as Client,
    AsyncClient as AsyncClient,
    RETRY_FOR as RETRY_FOR,
    SemaphoreError as SemaphoreError,
    NotAcquired as NotAcquired,
    PermitLost as PermitLost,
    NotDurable as NotDurable,
    ModuleRequired as ModuleRequired,
    _known_backend as _known_backend,
    _script as _script,
)
from ._sync import (
    Permit as Permit,
    PermitSet as PermitSet,
    Semaphore as Semaphore,
    SemaphoreSet as SemaphoreSet,
    acquire_all as acquire_all,
    wait_empty as wait_empty,
    stored_limit as stored_limit,
    set_limit as set_limit,
    clear_limit as clear_limit,
)

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

# The public classes are shown (and pickled) as redsem's, wherever they are defined.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type):
        _public.__module__ = __name__
del _name, _public
