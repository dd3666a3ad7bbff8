package io.redsem;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

/**
 * Permits of several semaphores for one identifier, all or none ({@code SEM.ACQUIREALL}):
 * {@code try (PermitSet permits = redsem.semaphoreSet().semaphore("gpu", 1).semaphore("licence",
 * 5, 2).acquire()) { ... }}. It needs the module: without it, {@link #acquire()} throws {@link
 * ModuleRequired}.
 */
public final class SemaphoreSet {
  private final Redsem redsem;
  private final List<String> names;
  private final List<Long> limits;
  private final List<Long> counts;
  private final long leaseNanos;
  private final long waitNanos;
  private final boolean fair;
  private final boolean bound;
  private final String id;
  private final boolean autoRefresh;
  private final long retryForNanos;

  /** The same set with another wait. */
  private SemaphoreSet(SemaphoreSet s, long waitNanos) {
    this.redsem = s.redsem;
    this.names = s.names;
    this.limits = s.limits;
    this.counts = s.counts;
    this.leaseNanos = s.leaseNanos;
    this.waitNanos = waitNanos;
    this.fair = s.fair;
    this.bound = s.bound;
    this.id = s.id;
    this.autoRefresh = s.autoRefresh;
    this.retryForNanos = s.retryForNanos;
  }

  private SemaphoreSet(Builder b) {
    this.redsem = b.redsem;
    this.names = List.copyOf(b.names);
    this.limits = List.copyOf(b.limits);
    this.counts = List.copyOf(b.counts);
    this.leaseNanos = b.leaseNanos;
    this.waitNanos = b.waitNanos;
    this.fair = b.fair;
    this.bound = b.bound;
    this.id = b.id;
    this.autoRefresh = b.autoRefresh;
    this.retryForNanos = b.retryForNanos;
  }

  public static Builder builder(Redsem redsem) {
    return new Builder(redsem);
  }

  /** The semaphores' names, in the order given. */
  public List<String> names() {
    return names;
  }

  /**
   * Takes every permit of the set, or throws {@link NotAcquired} (then none is held); {@link
   * ModuleRequired} without the module.
   */
  public PermitSet acquire() {
    PermitSet permits = take(new Stop(redsem.transport, what()));
    if (autoRefresh) {
      permits.startRefreshing();
    }
    return permits;
  }

  /**
   * Waits up to {@code wait} for the whole set, instead of the set's own {@code waitFor} (null
   * or zero: no wait), and throws {@link NotAcquired} when it was not granted in that time.
   */
  public PermitSet acquire(Duration wait) {
    return new SemaphoreSet(this, Commands.waitNanos(wait, "wait")).acquire();
  }

  /** Takes the whole set if it can be granted now, without waiting: else empty. */
  public Optional<PermitSet> tryAcquire() {
    return tryAcquire(Duration.ZERO);
  }

  /** Waits up to {@code wait} for the whole set: empty when it was not granted in that time. */
  public Optional<PermitSet> tryAcquire(Duration wait) {
    SemaphoreSet once = new SemaphoreSet(this, Commands.waitNanos(wait, "wait"));
    try {
      return Optional.of(once.acquire());
    } catch (NotAcquired none) {
      return Optional.empty();
    }
  }

  private String what() {
    return "the set \"" + String.join("\", \"", names) + "\"";
  }

  /** The acquire, not refreshed yet; {@code stop} ends its wait from outside. */
  private PermitSet take(Stop stop) {
    if (waitNanos != 0) {
      stop.check(); // interrupted already: nothing is sent
    }
    Line line = new Line(redsem, names, true, retryForNanos, stop);
    PermitSet permits;
    long sent;
    String identifier = id != null ? id : Commands.newId();
    try {
      line.open("SEM.ACQUIREALL");
      long deadline = waitNanos == Commands.NO_LIMIT ? 0 : System.nanoTime() + waitNanos;
      Object[] result = line.run(hop -> {
        if (hop.scripts) { // a node without the module, after a move
          throw new ModuleRequired("SEM.ACQUIREALL");
        }
        long at = System.nanoTime();
        long left = Commands.waitLeft(waitNanos, deadline);
        return new Object[] {
          hop.blocking(command(identifier, left), left == 0 ? 0 : Commands.blockMillis(left)), at
        };
      });
      Object reply = result[0];
      sent = (Long) result[1];
      if (reply == null) {
        if (waitNanos != 0 && stop.stopping()) {
          throw stop.stopped(null);
        }
        StringBuilder wanted = new StringBuilder();
        for (int i = 0; i < names.size(); i++) {
          wanted.append(i == 0 ? "" : ", ").append('"').append(names.get(i)).append("\" (")
              .append(counts.get(i)).append(" of ").append(limits.get(i)).append(')');
        }
        throw new NotAcquired(
            "the set " + wanted + " was not granted" + Commands.describeWait(waitNanos));
      }
      Optional<List<Long>> tickets = Optional.empty();
      if (fair) {
        List<Long> t = new ArrayList<>();
        for (Object ticket : (List<?>) ((List<?>) reply).get(1)) {
          t.add(Commands.integer(ticket));
        }
        tickets = Optional.of(List.copyOf(t));
      }
      permits = new PermitSet(names, counts, identifier, tickets, leaseNanos, line, sent);
    } catch (RuntimeException e) {
      line.close();
      boolean stopped = e instanceof WaitInterrupted || (waitNanos != 0 && stop.stopping());
      if (stopped && id == null) {
        // A grant may have been written to a connection closed under it: the id is this
        // acquire's own, nobody else holds with it.
        try (Line back = new Line(redsem, names, false,
            Math.min(retryForNanos, ScriptWait.NUDGE_NANOS))) {
          back.run(hop -> hop.send(releaseAll(identifier)));
        } catch (RuntimeException ignored) {
          // their leases end them
        }
      }
      throw stopped && !(e instanceof WaitInterrupted) ? stop.stopped(e) : e;
    }
    try {
      // A wait for the grant leaves the lease's start unknown: confirm it now.
      if (System.nanoTime() - sent > leaseNanos / 3 && !permits.refresh()) {
        throw new PermitLost(permits.lostMessage());
      }
      if (!stop.finish()) {
        throw stop.stopped(null); // stopped as it was granted: nobody will have it
      }
    } catch (RuntimeException e) {
      permits.abandon();
      throw e;
    }
    if (!bound) {
      line.shed();
    }
    return permits;
  }

  private List<Object> releaseAll(String identifier) {
    List<Object> args = new ArrayList<>();
    args.add("SEM.RELEASEALL");
    args.add(names.size());
    args.addAll(names);
    args.add(identifier);
    return args;
  }

  /** {@link #acquire()} on redsem's own daemon threads (as {@link Semaphore#acquireAsync()}). */
  public CompletableFuture<PermitSet> acquireAsync() {
    return acquireAsync(Refresher.async());
  }

  /** {@link #acquire()} on {@code executor}. */
  public CompletableFuture<PermitSet> acquireAsync(Executor executor) {
    Stop stop = new Stop(redsem.transport, what());
    return Held.async(executor, stop, () -> take(stop), autoRefresh);
  }

  private List<Object> command(String identifier, long wait) {
    List<Object> args = new ArrayList<>();
    args.add("SEM.ACQUIREALL");
    args.add(names.size());
    for (int i = 0; i < names.size(); i++) {
      args.add(names.get(i));
      args.add(limits.get(i));
      args.add(counts.get(i));
    }
    args.add(Commands.secondsOfNanos(leaseNanos));
    args.add("ID");
    args.add(identifier);
    if (fair) {
      args.add("FAIR");
      args.add("WITHTICKET");
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

  /** The semaphores of a set and its options, each checked as it is set. */
  public static final class Builder {
    private final Redsem redsem;
    private final List<String> names = new ArrayList<>();
    private final List<Long> limits = new ArrayList<>();
    private final List<Long> counts = new ArrayList<>();
    private final Set<String> seen = new HashSet<>();
    private long leaseNanos = 30_000_000_000L;
    private long waitNanos;
    private boolean fair;
    private boolean bound;
    private String id;
    private boolean autoRefresh = true;
    private long retryForNanos;

    private Builder(Redsem redsem) {
      if (redsem == null) {
        throw new IllegalArgumentException("redsem must not be null");
      }
      this.redsem = redsem;
      this.retryForNanos = redsem.retryForNanos;
    }

    /** One permit of {@code name}, whose limit is {@code limit}. */
    public Builder semaphore(String name, long limit) {
      return semaphore(name, limit, 1);
    }

    /** {@code count} permits of {@code name} (1 to {@code limit}), whose limit is {@code limit}. */
    public Builder semaphore(String name, long limit, long count) {
      Commands.checkName(name, "a semaphore name");
      Commands.checkLimit(limit, "the limit of \"" + name + "\"");
      if (count < 1 || count > limit) {
        throw new IllegalArgumentException("the count of \"" + name
            + "\" must be an integer from 1 to its limit " + limit + " (got " + count + ")");
      }
      if (!seen.add(name)) {
        throw new IllegalArgumentException("the semaphore \"" + name + "\" is named twice");
      }
      if (names.size() == 64) {
        throw new IllegalArgumentException("a set has from 1 to 64 semaphores");
      }
      names.add(name);
      limits.add(limit);
      counts.add(count);
      return this;
    }

    /** The lease, the same for every semaphore (default 30 s). */
    public Builder lease(Duration lease) {
      this.leaseNanos = Commands.leaseNanos(lease);
      return this;
    }

    public Builder lease(double seconds) {
      this.leaseNanos = Commands.leaseNanos(seconds);
      return this;
    }

    /** How long to wait inside the server until the whole set can be granted at once. */
    public Builder waitFor(Duration wait) {
      this.waitNanos = Commands.waitNanos(wait, "wait");
      return this;
    }

    public Builder waitFor(double seconds) {
      this.waitNanos = Commands.waitNanos(seconds, "wait");
      return this;
    }

    /** Every semaphore is a fair one (FAIR), with a fencing ticket each. */
    public Builder fair(boolean fair) {
      this.fair = fair;
      return this;
    }

    public Builder bound(boolean bound) {
      this.bound = bound;
      return this;
    }

    public Builder id(String id) {
      if (id != null && id.isEmpty()) {
        throw new IllegalArgumentException("id must not be empty");
      }
      this.id = id;
      return this;
    }

    public Builder autoRefresh(boolean autoRefresh) {
      this.autoRefresh = autoRefresh;
      return this;
    }

    public Builder retryFor(Duration retryFor) {
      this.retryForNanos = Commands.durationNanos(retryFor, "retryFor");
      return this;
    }

    /**
     * The set. In Redis Cluster names in different slots (or without a hash tag) are refused
     * here, before anything is sent.
     */
    public SemaphoreSet build() {
      if (names.isEmpty()) {
        throw new IllegalArgumentException("a set has from 1 to 64 semaphores (got none)");
      }
      if (redsem.isCluster()) {
        Commands.clusterSlot(names);
      }
      return new SemaphoreSet(this);
    }

    /** {@code build().acquire()}. */
    public PermitSet acquire() {
      return build().acquire();
    }

    /** {@code build().tryAcquire()}: the whole set if it can be granted now, else empty. */
    public Optional<PermitSet> tryAcquire() {
      return build().tryAcquire();
    }
  }
}
