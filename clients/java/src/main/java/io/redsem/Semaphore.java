package io.redsem;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

/**
 * A redsem semaphore: {@code try (Permit permit = semaphore.acquire()) { ... }}. Built with
 * {@link #builder(Redsem, String)} (or {@link Redsem#semaphore(String)}); immutable, and shared
 * by threads: each {@link #acquire()} takes its own permit.
 */
public final class Semaphore {
  private final Redsem redsem;
  private final String name;
  private final long limit;
  private final long leaseNanos;
  private final long waitNanos;
  private final boolean fair;
  private final long count; // 0: no COUNT
  private final boolean bound;
  private final String id;
  private final int durableReplicas;
  private final long durableTimeoutMillis;
  private final boolean autoRefresh;
  private final long retryForNanos;
  private final List<String> names; // the one name, as a Line takes it
  private final String what; // for messages
  private final String leaseText; // the lease as sent

  private Semaphore(Builder b) {
    this.redsem = b.redsem;
    this.name = b.name;
    this.limit = b.limit;
    this.leaseNanos = b.leaseNanos;
    this.waitNanos = b.waitNanos;
    this.fair = b.fair;
    this.count = b.count;
    this.bound = b.bound;
    this.id = b.id;
    this.durableReplicas = b.durableReplicas;
    this.durableTimeoutMillis = b.durableTimeoutMillis;
    this.autoRefresh = b.autoRefresh;
    this.retryForNanos = b.retryForNanos;
    this.names = List.of(name);
    this.what = "a permit of \"" + name + "\"";
    this.leaseText = Commands.secondsOfNanos(leaseNanos);
  }

  /** The same semaphore with another wait. */
  private Semaphore(Semaphore s, long waitNanos) {
    this.redsem = s.redsem;
    this.name = s.name;
    this.limit = s.limit;
    this.leaseNanos = s.leaseNanos;
    this.waitNanos = waitNanos;
    this.fair = s.fair;
    this.count = s.count;
    this.bound = s.bound;
    this.id = s.id;
    this.durableReplicas = s.durableReplicas;
    this.durableTimeoutMillis = s.durableTimeoutMillis;
    this.autoRefresh = s.autoRefresh;
    this.retryForNanos = s.retryForNanos;
    this.names = s.names;
    this.what = s.what;
    this.leaseText = s.leaseText;
  }

  /** A builder of the semaphore {@code name} through {@code redsem}'s client. */
  public static Builder builder(Redsem redsem, String name) {
    return new Builder(redsem, name);
  }

  public String name() {
    return name;
  }

  /**
   * Takes a permit, or throws {@link NotAcquired} (or {@link NotDurable}, {@link
   * ModuleRequired}, or the client library's error). A wait whose thread is interrupted ends
   * in the server and throws {@link WaitInterrupted} (the thread's interrupt status stays set);
   * a permit granted in that instant is given back.
   */
  public Permit acquire() {
    Permit permit = take(new Stop(redsem.transport, what()));
    if (autoRefresh) {
      permit.startRefreshing();
    }
    return permit;
  }

  /**
   * Waits up to {@code wait} for a permit, instead of the semaphore's own {@code waitFor} (null
   * or zero: no wait), and throws {@link NotAcquired} when none was granted in that time; as
   * {@link #acquire()} otherwise.
   */
  public Permit acquire(Duration wait) {
    return new Semaphore(this, Commands.waitNanos(wait, "wait")).acquire();
  }

  /**
   * Takes a permit if one is free now, without waiting (whatever {@code waitFor} says): the
   * permit, or {@link Optional#empty()} when none is free. Other failures ({@link NotDurable},
   * {@link ModuleRequired}, the client library's errors) are thrown as {@link #acquire()}
   * throws them.
   */
  public Optional<Permit> tryAcquire() {
    return tryAcquire(Duration.ZERO);
  }

  /**
   * Waits up to {@code wait} for a permit (null or zero: no wait), as {@code
   * java.util.concurrent.Semaphore.tryAcquire(timeout, unit)}: the permit, or {@link
   * Optional#empty()} when none was granted in that time.
   */
  public Optional<Permit> tryAcquire(Duration wait) {
    Semaphore once = new Semaphore(this, Commands.waitNanos(wait, "wait"));
    try {
      return Optional.of(once.acquire());
    } catch (NotAcquired none) {
      return Optional.empty();
    }
  }

  private String what() {
    return what;
  }

  /** The acquire, not refreshed yet; {@code stop} ends its waits from outside. */
  private Permit take(Stop stop) {
    boolean dedicated = bound || waitNanos != 0 || durableReplicas > 0;
    if (waitNanos != 0) {
      stop.check(); // interrupted already: nothing is sent
    }
    Line line = new Line(redsem, names, dedicated, retryForNanos, stop);
    Permit permit;
    long sent;
    ScriptWait[] waiter = {null}; // made once a server without the module is met
    String identifier = id != null ? id : Commands.newId();
    try {
      if (bound) {
        line.open("BOUND");
      }
      long deadline = waitNanos == Commands.NO_LIMIT ? 0 : System.nanoTime() + waitNanos;
      Object[] result = line.run(hop -> {
        if (hop.scripts) {
          if (bound) { // a node without the module, after a move
            throw new ModuleRequired("BOUND");
          }
          if (waiter[0] == null) {
            waiter[0] = new ScriptWait(redsem, name, identifier, fair, waitNanos, deadline,
                command(identifier, 0, false), left -> command(identifier, left, true));
          }
          return waiter[0].run(hop);
        }
        long at = System.nanoTime();
        long left = Commands.waitLeft(waitNanos, deadline);
        List<Object> command = command(identifier, left, true);
        return new Object[] {hop.blocking(command, left == 0 ? 0 : Commands.blockMillis(left)), at};
      });
      Object reply = result[0];
      sent = (Long) result[1];
      if (reply == null) {
        if (waitNanos != 0 && stop.stopping()) {
          throw stop.stopped(null);
        }
        throw new NotAcquired("no permit of \"" + name + "\" (limit " + limit + ") was granted"
            + Commands.describeWait(waitNanos));
      }
      OptionalLong ticket = fair
          ? OptionalLong.of(Commands.integer(((List<?>) reply).get(1)))
          : OptionalLong.empty();
      permit = new Permit(name, identifier, ticket, count == 0 ? 1 : count, leaseNanos, line, sent);
    } catch (RuntimeException e) {
      line.close();
      boolean stopped = e instanceof WaitInterrupted || (waitNanos != 0 && stop.stopping());
      RuntimeException thrown = stopped && !(e instanceof WaitInterrupted) ? stop.stopped(e) : e;
      if (waiter[0] != null && line.scripts) {
        waiter[0].leave(retryForNanos, id == null && stopped);
      } else if (stopped && id == null) {
        // A grant may have been written to a connection closed under it: the id is this
        // acquire's own, nobody else holds with it.
        giveBack(identifier);
      }
      throw thrown;
    }
    try {
      if (durableReplicas > 0) {
        durable(line, permit);
      }
      // A wait for the grant leaves the lease's start unknown: confirm it now.
      if (System.nanoTime() - sent > leaseNanos / 3 && !permit.refresh()) {
        throw new PermitLost(permit.lostMessage());
      }
      if (!stop.finish()) {
        throw stop.stopped(null); // stopped as it was granted: nobody will have it
      }
    } catch (RuntimeException e) {
      permit.abandon();
      throw e;
    }
    if (!bound) {
      line.shed(); // only BOUND ties the permit to its connection
    }
    return permit;
  }

  /**
   * WAIT replicas after the grant, on the granting connection (its writes are what WAIT
   * counts). When that connection is lost (the primary failed) or the WAIT is unblocked, a WAIT
   * sent anew on another connection would count no write of it: it would answer at once with
   * every replica attached. So the holder is first refreshed there (the new primary), and the
   * WAIT then counts that write; a holder the new primary does not have is NotDurable.
   */
  private void durable(Line line, Permit permit) {
    boolean[] again = {false};
    long acked = Commands.integer(line.run(hop -> {
      if (again[0]) {
        Object held = hop.send(permit.refreshArgs());
        if (Commands.integer(held) != 1) {
          return 0L;
        }
      }
      again[0] = true;
      return hop.blocking(List.of("WAIT", durableReplicas, durableTimeoutMillis),
          durableTimeoutMillis == 0 ? -1 : durableTimeoutMillis);
    }));
    if (line.stop.stopping()) {
      throw line.stop.stopped(null);
    }
    if (acked < durableReplicas) {
      throw new NotDurable(acked + " of " + durableReplicas
          + " replicas acknowledged the grant of \"" + name + "\" within "
          + durableTimeoutMillis + " ms", acked, durableReplicas);
    }
  }

  /** Best effort: releases this acquire's own identifier (a grant nobody will have). */
  private void giveBack(String identifier) {
    try (Line line = new Line(redsem, List.of(name), false,
        Math.min(retryForNanos, ScriptWait.NUDGE_NANOS))) {
      line.run(hop -> hop.send(List.of("SEM.RELEASE", name, identifier)));
    } catch (RuntimeException ignored) {
      // its lease ends it
    }
  }

  /**
   * {@link #acquire()} on redsem's own daemon threads: the future completes with the permit, or
   * with its error ({@link NotAcquired}, ...). Nothing blocks the caller's thread (nor Lettuce's
   * event loop); a waiting acquire holds one of those threads while it waits. Completing the
   * future yourself ({@code cancel}, {@code orTimeout}, {@code completeExceptionally}) ends the
   * wait in the server, and a permit granted after that is given back: nobody holds it.
   */
  public CompletableFuture<Permit> acquireAsync() {
    return acquireAsync(Refresher.async());
  }

  /** {@link #acquire()} on {@code executor}, as {@link #acquireAsync()}. */
  public CompletableFuture<Permit> acquireAsync(Executor executor) {
    Stop stop = new Stop(redsem.transport, what());
    return Held.async(executor, stop, () -> take(stop), autoRefresh);
  }

  /** The acquire, waiting {@code wait} ns; {@code inServer=false}: the script's form. */
  private List<Object> command(String identifier, long wait, boolean inServer) {
    List<Object> args = new ArrayList<>(12);
    args.add(fair ? "SEM.ACQUIREFAIR" : "SEM.ACQUIRE");
    args.add(name);
    args.add(limit);
    args.add(leaseText);
    args.add("ID");
    args.add(identifier);
    if (count != 0) {
      args.add("COUNT");
      args.add(count);
    }
    if (fair) {
      args.add("WITHTICKET");
    }
    if (!inServer) {
      return args;
    }
    if (wait != 0) {
      args.add("WAIT");
      args.add(wait == Commands.NO_LIMIT ? "0" : Commands.secondsOfNanos(wait));
    }
    if (bound) {
      args.add("BOUND");
    }
    return args;
  }

  @Override
  public String toString() {
    return "Semaphore[" + name + " limit=" + limit + (fair ? " fair" : "") + "]";
  }

  /** The options of a semaphore, each checked as it is set. */
  public static final class Builder {
    private final Redsem redsem;
    private final String name;
    private long limit = 1;
    private long leaseNanos = 30_000_000_000L;
    private long waitNanos;
    private boolean fair;
    private long count;
    private boolean bound;
    private String id;
    private int durableReplicas;
    private long durableTimeoutMillis = 1000;
    private boolean autoRefresh = true;
    private long retryForNanos;

    private Builder(Redsem redsem, String name) {
      if (redsem == null) {
        throw new IllegalArgumentException("redsem must not be null");
      }
      this.redsem = redsem;
      this.name = Commands.checkName(name, "the semaphore name");
      this.retryForNanos = redsem.retryForNanos;
    }

    /** The number of permits, 1 to 4294967295 (default 1). */
    public Builder limit(long limit) {
      Commands.checkLimit(limit, "limit");
      this.limit = limit;
      return this;
    }

    /**
     * The lease (default 30 s, millisecond precision, at most a year); the permit is refreshed
     * every lease/3.
     */
    public Builder lease(Duration lease) {
      this.leaseNanos = Commands.leaseNanos(lease);
      return this;
    }

    /** The lease in seconds: finite, greater than 0 and at most 31536000 (a year). */
    public Builder lease(double seconds) {
      this.leaseNanos = Commands.leaseNanos(seconds);
      return this;
    }

    /**
     * How long to wait for a permit, first come first served: null or zero do not wait
     * (default); at most a year. With the module the wait is in the server; without it the
     * package waits in the script's line, told of its grant on its own list ({@code BLPOP
     * <name>:wake:<id>}).
     */
    public Builder waitFor(Duration wait) {
      this.waitNanos = Commands.waitNanos(wait, "wait");
      return this;
    }

    /**
     * The wait in seconds: 0 does not wait, Double.POSITIVE_INFINITY waits without limit, else at
     * most a year.
     */
    public Builder waitFor(double seconds) {
      this.waitNanos = Commands.waitNanos(seconds, "wait");
      return this;
    }

    /** SEM.ACQUIREFAIR: first come, first served, and a fencing ticket per permit. */
    public Builder fair(boolean fair) {
      this.fair = fair;
      return this;
    }

    /** Take this many permits at once (COUNT), all or none: 1 to the limit. */
    public Builder count(long count) {
      if (count < 1 || count > Commands.MAX_LIMIT) {
        throw new IllegalArgumentException(
            "count must be an integer from 1 to the limit (got " + count + ")");
      }
      this.count = count;
      return this;
    }

    /**
     * BOUND: the permit is given back when its connection closes (the process dies); it holds a
     * connection of its own until its release. It needs the module.
     */
    public Builder bound(boolean bound) {
      this.bound = bound;
      return this;
    }

    /**
     * The holder's identifier (default: a new UUID v4 per acquire). A second acquire with it,
     * while the first permit is held, renews that permit rather than taking another.
     */
    public Builder id(String id) {
      if (id != null && id.isEmpty()) {
        throw new IllegalArgumentException("id must not be empty");
      }
      this.id = id;
      return this;
    }

    /**
     * After the grant, {@code WAIT replicas timeout} on the granting connection; fewer
     * acknowledgements give the permit back and throw {@link NotDurable}.
     */
    public Builder durableReplicas(int replicas) {
      if (replicas < 0) {
        throw new IllegalArgumentException(
            "durableReplicas must not be negative (got " + replicas + ")");
      }
      this.durableReplicas = replicas;
      return this;
    }

    /** How long {@code durableReplicas} waits for the replicas (default 1 s; zero: no limit). */
    public Builder durableTimeout(Duration timeout) {
      this.durableTimeoutMillis = Commands.durationNanos(timeout, "durableTimeout") / 1_000_000;
      return this;
    }

    /** False to refresh by hand ({@link Permit#refresh()}) instead of in the background. */
    public Builder autoRefresh(boolean autoRefresh) {
      this.autoRefresh = autoRefresh;
      return this;
    }

    /**
     * In Redis Cluster, how long a call is resent with the same identifier while its slot moves
     * or its primary fails over (default: the Redsem's, 30 s).
     */
    public Builder retryFor(Duration retryFor) {
      this.retryForNanos = Commands.durationNanos(retryFor, "retryFor");
      return this;
    }

    /**
     * The semaphore. In Redis Cluster a name without a hash tag is refused here
     * (IllegalArgumentException), before anything is sent.
     */
    public Semaphore build() {
      if (count > limit) {
        throw new IllegalArgumentException(
            "count must be an integer from 1 to the limit " + limit + " (got " + count + ")");
      }
      if (redsem.isCluster()) {
        Commands.clusterSlot(List.of(name));
      }
      return new Semaphore(this);
    }

    /** {@code build().acquire()}. */
    public Permit acquire() {
      return build().acquire();
    }

    /** {@code build().tryAcquire()}: a permit if one is free now, else empty. */
    public Optional<Permit> tryAcquire() {
      return build().tryAcquire();
    }
  }
}
