package io.redsem;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * What a permit of one semaphore and a set of permits share: the identifier, the background
 * refresh every lease/3 over the line, the lost-permit signal, and the release.
 */
abstract class Held implements AutoCloseable {
  final String id;
  final long leaseNanos;
  final Line line;
  private final ReentrantLock calls = new ReentrantLock();
  private final List<Consumer<PermitLost>> listeners = new CopyOnWriteArrayList<>();
  private final AtomicBoolean refreshing = new AtomicBoolean();
  // The server's deadline is at least this (System.nanoTime): the last acquire or refresh
  // confirmed was sent then plus a lease, and its lease started when the server ran it, later.
  private volatile long confirmedUntil;
  private volatile String lostReason;
  private volatile Boolean released; // the release's outcome, once released
  private ScheduledFuture<?> ticker; // a lease under 90 ms: a task of its own on the timer
  /** Refresher's: when the next refresh is due (System.nanoTime), and the refresh period. */
  volatile long due;
  long period;
  final long seq = SEQ.incrementAndGet(); // orders permits due at the same nanosecond
  /** Set once the background refresh is to stop (released, lost). */
  volatile boolean stopped;

  private static final AtomicLong SEQ = new AtomicLong();

  Held(String id, long leaseNanos, Line line, long sent) {
    this.id = id;
    this.leaseNanos = leaseNanos;
    this.line = line;
    this.confirmedUntil = sent + leaseNanos;
  }

  /** What the permit is of, for messages: the name, or the set's names. */
  abstract String what();

  /** How many semaphores a refresh or a release must find held. */
  abstract int wanted();

  abstract List<Object> refreshArgs();

  abstract List<Object> releaseArgs();

  /** The holder's identifier: the one given, or the UUID v4 made for this permit. */
  public String id() {
    return id;
  }

  /**
   * True once the permit may have run out: a refresh or the release answered that it was not
   * held, or no refresh was confirmed within a lease (the server is unreachable). It stays true.
   */
  public boolean isLost() {
    noteDeadline();
    return lostReason != null;
  }

  /** Throws {@link PermitLost} if the permit is lost: call it in long work to stop early. */
  public void check() {
    if (isLost()) {
      throw new PermitLost(lostMessage());
    }
  }

  /**
   * Calls {@code listener} once when the permit is found lost (on the refresh thread, or on the
   * thread that finds it out), at once if it is lost already.
   */
  public void onLost(Consumer<PermitLost> listener) {
    listeners.add(listener);
    if (lostReason != null && listeners.remove(listener)) {
      listener.accept(new PermitLost(lostMessage()));
    }
  }

  void noteDeadline() {
    if (released == null && System.nanoTime() - confirmedUntil >= 0) {
      markLost("no refresh was confirmed within the lease");
    }
  }

  void markLost(String reason) {
    synchronized (this) {
      if (lostReason != null) {
        return;
      }
      lostReason = reason;
    }
    List<Consumer<PermitLost>> called = new ArrayList<>(listeners);
    listeners.removeAll(called);
    PermitLost lost = new PermitLost(lostMessage());
    for (Consumer<PermitLost> listener : called) {
      try {
        listener.accept(lost);
      } catch (RuntimeException ignored) {
        // a listener's failure is its own
      }
    }
  }

  String lostMessage() {
    return "the permit " + id + " of " + what() + " was lost: " + lostReason;
  }

  private String answered(List<Object> command, long reply) {
    String head = Commands.text(command.get(0)) + " answered " + reply;
    return wanted() == 1 ? head : head + " of " + wanted();
  }

  void startRefreshing() {
    period = Math.max(leaseNanos / 3, 1_000_000);
    if (!Refresher.hold(this)) {
      ticker = Refresher.watch(period, this::tick);
    }
  }

  /**
   * On the timer thread, when the refresh is due: queues it, unless the last one is still
   * queued or running. False once the permit needs no more refreshes.
   */
  boolean tick() {
    if (released != null || lostReason != null || stopped) {
      stopTicking();
      return false;
    }
    if (!refreshing.compareAndSet(false, true)) {
      return true; // the last refresh is still under way (a failover, or a long queue)
    }
    try {
      Refresher.refresh(this::refreshInBackground);
    } catch (RuntimeException e) {
      refreshing.set(false); // refused: tried again at the next tick
    }
    return true;
  }

  private void refreshInBackground() {
    try {
      if (released != null || lostReason != null) {
        return;
      }
      if (!refresh()) {
        stopTicking();
      }
    } catch (RuntimeException e) {
      // An unreachable server (or released meanwhile): tried again until the lease is up.
      if (isLost() || released != null) {
        stopTicking();
      }
    } finally {
      refreshing.set(false);
    }
  }

  private void stopTicking() {
    stopped = true;
    Refresher.drop(this);
    ScheduledFuture<?> t = ticker;
    if (t != null) {
      t.cancel(false);
    }
  }

  /**
   * Moves the deadline to now + lease (the background refresh does it every lease/3). Returns
   * false, and marks the permit lost, if it had run out.
   */
  public boolean refresh() {
    calls.lock();
    try {
      if (released != null) {
        throw new IllegalStateException("the permit was already released");
      }
      long sent = System.nanoTime();
      List<Object> command = refreshArgs();
      // In Cluster, resent through a move or a failover while the last lease may still run.
      long reply;
      try {
        reply = Commands.integer(line.run(hop -> hop.send(command), confirmedUntil));
      } catch (Line.Unanswered e) {
        if (System.nanoTime() - confirmedUntil < 0) {
          throw e;
        }
        // No primary answered before the confirmed lease ended: it may have run out on the
        // server unconfirmed, so the permit is lost, as a refresh finding no holder says.
        markLost("no refresh was answered before the lease ended (" + e.getMessage() + ")");
        return false;
      }
      if (reply == wanted()) {
        confirmedUntil = sent + leaseNanos;
        return true;
      }
      // Fewer than all: a lease ran out (the server removed it) or another client removed it.
      markLost(answered(command, reply) + " (the lease ran out, or the holder was removed)");
      return false;
    } finally {
      calls.unlock();
    }
  }

  /**
   * Gives the permit back: true if it was held throughout, false if it was lost (then the work
   * it guarded may have overlapped another holder's). Later calls repeat the answer.
   */
  public boolean release() {
    stopTicking();
    calls.lock();
    try {
      if (released != null) {
        return released;
      }
      noteDeadline();
      List<Object> command = releaseArgs();
      long reply;
      try {
        reply = Commands.integer(line.run(hop -> hop.send(command)));
      } catch (RuntimeException e) {
        // Not refreshed any more, the permit runs out at the end of its lease.
        markLost("the release failed: " + e);
        released = false;
        throw e;
      } finally {
        line.close();
      }
      if (reply != wanted()) {
        markLost(answered(command, reply) + ": the lease ran out before the release");
      }
      released = lostReason == null;
      return released;
    } finally {
      calls.unlock();
    }
  }

  /**
   * {@code take} on {@code executor}, its permit as the future's result. Completed by anyone
   * else (cancel, orTimeout, completeExceptionally), the future ends the wait ({@code stop}),
   * and a permit granted after that is given back before its refresh starts.
   */
  static <P extends Held> CompletableFuture<P> async(Executor executor, Stop stop,
      Supplier<P> take, boolean autoRefresh) {
    CompletableFuture<P> future = new CompletableFuture<>();
    future.whenComplete((permit, error) -> stop.request(false)); // nothing once it has finished
    try {
      executor.execute(() -> {
        P permit;
        try {
          permit = take.get();
        } catch (Throwable e) {
          future.completeExceptionally(e);
          return;
        }
        if (future.isDone()) {
          permit.abandon();
          return;
        }
        if (autoRefresh) {
          permit.startRefreshing();
        }
        if (!future.complete(permit)) {
          permit.abandon();
        }
      });
    } catch (RuntimeException e) {
      future.completeExceptionally(e); // the executor refused it
    }
    return future;
  }

  /** {@link #release()} on redsem's own daemon threads. */
  public CompletableFuture<Boolean> releaseAsync() {
    return CompletableFuture.supplyAsync(this::release, Refresher.async());
  }

  /** {@link #refresh()} on redsem's own daemon threads. */
  public CompletableFuture<Boolean> refreshAsync() {
    return CompletableFuture.supplyAsync(this::refresh, Refresher.async());
  }

  /** Used by releaseSome: a call on the line under the permit's lock. */
  Object call(List<Object> command) {
    calls.lock();
    try {
      if (released != null) {
        throw new IllegalStateException("the permit was already released");
      }
      return line.run(hop -> hop.send(command));
    } finally {
      calls.unlock();
    }
  }

  /**
   * Releases the permit (try-with-resources): throws {@link PermitLost} when it was lost during
   * the work. When the work threw, that error is the one raised, and this one is suppressed in
   * it.
   */
  @Override
  public void close() {
    if (!release()) {
      throw new PermitLost(lostMessage());
    }
  }

  /** Gives the permit back after a failure of the acquire's last steps, ignoring errors. */
  void abandon() {
    try {
      release();
    } catch (RuntimeException ignored) {
      // the acquire's own error is the one raised
    }
  }

  String state() {
    return lostReason != null ? "lost" : Boolean.TRUE.equals(released) ? "released" : "held";
  }
}
