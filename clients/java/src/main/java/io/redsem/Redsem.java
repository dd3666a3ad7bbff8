package io.redsem;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A client library's client, as redsem speaks through it: {@link #of(redis.clients.jedis.UnifiedJedis)}
 * for Jedis ({@code RedisClient}, {@code JedisCluster}, {@code RedisClusterClient}, or any
 * pooled {@code UnifiedJedis}), {@link #of(io.lettuce.core.RedisClient)} and {@link
 * #of(io.lettuce.core.cluster.RedisClusterClient)} for Lettuce.
 *
 * <p>It finds out per server (in Redis Cluster, per node) whether the server has the module
 * ({@code COMMAND INFO SEM.ACQUIRE}); where it has not, every operation runs as the script
 * redsem.lua over the same keys, and what only the module does throws {@link ModuleRequired}.
 * A server without it is asked again at the next call once 10 s have passed, and the script
 * itself says when the module has been loaded since: the client moves to it at once. Close it when done: it closes the connections it opened itself (Lettuce),
 * never your client.
 */
public final class Redsem implements AutoCloseable {
  /** How long a call in Redis Cluster is resent through a move or a failover by default. */
  public static final Duration RETRY_FOR = Duration.ofSeconds(30);

  /** How long a node found without the module is believed so: then asked again. */
  private static final long RECHECK_NANOS = 10_000_000_000L;

  final Transport transport;
  private final Map<String, Backend> backends;
  final long retryForNanos;

  /** What a node answered to COMMAND INFO SEM.ACQUIRE, and when (System.nanoTime). */
  private static final class Backend {
    final boolean module;
    final long askedAt;

    Backend(boolean module, long askedAt) {
      this.module = module;
      this.askedAt = askedAt;
    }
  }

  private Redsem(Transport transport, Map<String, Backend> backends, long retryForNanos) {
    this.transport = transport;
    this.backends = backends;
    this.retryForNanos = retryForNanos;
  }

  Redsem(Transport transport) {
    this(transport, new ConcurrentHashMap<>(), RETRY_FOR.toNanos());
  }

  /**
   * Jedis: a {@code RedisClient} (its pool lends connections), a {@code JedisCluster} or
   * {@code RedisClusterClient} (connections to the primary serving each name's slot), or
   * another {@code UnifiedJedis} over a pool of connections.
   */
  public static Redsem of(redis.clients.jedis.UnifiedJedis jedis) {
    return new Redsem(JedisTransport.of(jedis));
  }

  /** Lettuce, one server: the client's URI names it. */
  public static Redsem of(io.lettuce.core.RedisClient lettuce) {
    return new Redsem(LettuceTransport.of(lettuce));
  }

  /** Lettuce, Redis Cluster: calls go to the primary serving each name's slot. */
  public static Redsem of(io.lettuce.core.cluster.RedisClusterClient lettuce) {
    return new Redsem(new LettuceClusterTransport(lettuce));
  }

  /**
   * The same client with another retry budget in Redis Cluster: how long a call is resent, with
   * the same identifier, while its slot moves or its primary fails over (default 30 s; zero: no
   * retry).
   */
  public Redsem withRetryFor(Duration retryFor) {
    return new Redsem(transport, backends, Commands.durationNanos(retryFor, "retryFor"));
  }

  /** Whether this client speaks to a Redis Cluster. */
  public boolean isCluster() {
    return transport.cluster();
  }

  /** A builder of a semaphore named {@code name}. */
  public Semaphore.Builder semaphore(String name) {
    return Semaphore.builder(this, name);
  }

  /** A builder of a set of semaphores taken together ({@code SEM.ACQUIREALL}). */
  public SemaphoreSet.Builder semaphoreSet() {
    return SemaphoreSet.builder(this);
  }

  /**
   * Whether the server (or the cluster node {@code node}) has the module: asked once, and again
   * when the answer was no and is older than 10 s (a module loaded later is picked up live).
   */
  boolean hasModule(String node, Transport.Conn conn) {
    Backend known = backends.get(node);
    long now = System.nanoTime();
    if (known != null && (known.module || now - known.askedAt < RECHECK_NANOS)) {
      return known.module;
    }
    Object reply = conn.call(0, List.of("COMMAND", "INFO", "SEM.ACQUIRE"));
    boolean module = reply instanceof List && !((List<?>) reply).isEmpty()
        && ((List<?>) reply).get(0) != null;
    backends.put(node, new Backend(module, now));
    return module;
  }

  /** The script found the module loaded on {@code node}: the next calls go to it. */
  void moduleLoaded(String node) {
    backends.put(node, new Backend(true, System.nanoTime()));
  }

  /**
   * Waits until the semaphore {@code name} has no live holder ({@code SEM.WAITEMPTY}): true once
   * it has none (at once if it has none now), false when {@code timeout} passes first (null or
   * zero: look once). It takes nothing, and blocks a connection of its own. It needs the module.
   */
  public boolean waitEmpty(String name, Duration timeout) {
    return waitEmptyNanos(name, Commands.waitNanos(timeout, "timeout"));
  }

  /** As {@link #waitEmpty(String, Duration)}, in seconds: Double.POSITIVE_INFINITY waits without limit. */
  public boolean waitEmpty(String name, double timeoutSeconds) {
    return waitEmptyNanos(name, Commands.waitNanos(timeoutSeconds, "timeout"));
  }

  private boolean waitEmptyNanos(String name, long timeout) {
    Commands.checkName(name, "the semaphore name");
    return waitEmptyNanos(name, timeout, new Stop(transport, "\"" + name + "\" to be empty"));
  }

  private boolean waitEmptyNanos(String name, long timeout, Stop stop) {
    stop.check(); // interrupted already: nothing is sent
    try (Line line = new Line(this, List.of(name), true, retryForNanos, stop)) {
      line.open("SEM.WAITEMPTY");
      long deadline = timeout == Commands.NO_LIMIT ? 0 : System.nanoTime() + timeout;
      Object reply = line.run(hop -> {
        if (hop.scripts) {
          throw new ModuleRequired("SEM.WAITEMPTY");
        }
        if (timeout == Commands.NO_LIMIT) {
          return hop.blocking(List.of("SEM.WAITEMPTY", name, "0"), -1);
        }
        long left = Math.max(deadline - System.nanoTime(), 0);
        // The server reads 0 as "no limit": a timeout of 0 looks for a millisecond instead.
        long ms = Math.max(1, Commands.sentMillis(left));
        return hop.blocking(List.of("SEM.WAITEMPTY", name, Commands.seconds(ms)), ms);
      });
      if (stop.stopping()) {
        throw stop.stopped(null);
      }
      return reply != null && Commands.integer(reply) == 1;
    } catch (RuntimeException e) {
      throw !(e instanceof WaitInterrupted) && stop.stopping() ? stop.stopped(e) : e;
    }
  }

  /**
   * {@link #waitEmpty(String, Duration)} on redsem's own daemon threads; completing the future
   * yourself (cancel, orTimeout) ends the wait in the server.
   */
  public CompletableFuture<Boolean> waitEmptyAsync(String name, Duration timeout) {
    long nanos = Commands.waitNanos(timeout, "timeout");
    Commands.checkName(name, "the semaphore name");
    Stop stop = new Stop(transport, "\"" + name + "\" to be empty");
    CompletableFuture<Boolean> future = new CompletableFuture<>();
    future.whenComplete((emptied, error) -> stop.request(false));
    try {
      Refresher.async().execute(() -> {
        try {
          future.complete(waitEmptyNanos(name, nanos, stop));
        } catch (Throwable e) {
          future.completeExceptionally(e);
        }
      });
    } catch (RuntimeException e) {
      future.completeExceptionally(e);
    }
    return future;
  }

  /**
   * The operator's limit stored for {@code name} ({@code SEM.LIMIT name}), or empty when there is
   * none. While one is stored, every acquire of {@code name} uses it instead of its own.
   */
  public OptionalLong storedLimit(String name) {
    Object reply = limitCall(List.of("SEM.LIMIT", Commands.checkName(name, "the semaphore name")));
    return reply == null ? OptionalLong.empty() : OptionalLong.of(Commands.integer(reply));
  }

  /**
   * Stores an operator's limit for {@code name} ({@code SEM.LIMIT name n}), 0 to 4294967295:
   * every acquire of {@code name} uses it instead of its own until {@link #clearLimit}. 0 pauses
   * the semaphore; a lower limit takes no permit from its holders.
   */
  public void setLimit(String name, long limit) {
    Commands.checkName(name, "the semaphore name");
    if (limit < 0 || limit > Commands.MAX_LIMIT) {
      throw new IllegalArgumentException(
          "limit must be an integer from 0 to " + Commands.MAX_LIMIT + " (0 pauses; got " + limit
              + ")");
    }
    limitCall(List.of("SEM.LIMIT", name, limit));
  }

  /**
   * Removes the operator's limit of {@code name} ({@code SEM.LIMIT name CLEAR}): acquires use
   * their own limits again. True if one was stored.
   */
  public boolean clearLimit(String name) {
    Object reply = limitCall(
        List.of("SEM.LIMIT", Commands.checkName(name, "the semaphore name"), "CLEAR"));
    return Commands.integer(reply) == 1;
  }

  /** The permits in use of {@code name} ({@code SEM.GET name}). */
  public long inUse(String name) {
    Object reply = limitCall(List.of("SEM.GET", Commands.checkName(name, "the semaphore name")));
    return Commands.integer(reply);
  }

  private Object limitCall(List<Object> command) {
    try (Line line = new Line(this, List.of(Commands.text(command.get(1))), false, retryForNanos)) {
      return line.run(hop -> hop.send(command));
    }
  }

  /** Closes the connections redsem opened itself; never the application's client. */
  @Override
  public void close() {
    transport.close();
  }
}
