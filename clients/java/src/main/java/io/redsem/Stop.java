package io.redsem;

import java.util.List;
import java.util.concurrent.ScheduledFuture;

/**
 * How one wait (an acquire, a set's, a waitEmpty) is ended from outside: its future completed by
 * someone else (cancel, orTimeout, completeExceptionally), or its thread interrupted. A call that
 * blocks registers its connection's CLIENT ID (read in the same write as the call); a stop sends
 * {@code CLIENT UNBLOCK <id>} for it on another connection, again every 100 ms while the call has
 * not returned (it may not have reached the server yet), and after a second closes that
 * connection: the server then drops the wait, and gives back a grant it could not deliver. The
 * waiting thread reads the call's answer (nil, or a grant of that very moment, which it gives
 * back) and throws {@link WaitInterrupted}.
 */
final class Stop {
  private static final long RETRY_NANOS = 100_000_000L;
  private static final int UNBLOCKS = 10;
  /** How often a thread blocked in a socket read (Jedis) is looked at for an interrupt. */
  private static final long WATCH_NANOS = 50_000_000L;

  private final Transport transport;
  private final String what; // for messages: 'a permit of "jobs"'
  private boolean requested;
  private boolean byInterrupt;
  private boolean finished;
  private Blocked blocked;

  /** One blocking call under way. */
  private static final class Blocked {
    final String node;
    final Transport.Conn conn;
    final long clientId;
    final Thread thread;
    ScheduledFuture<?> watch;

    Blocked(String node, Transport.Conn conn, long clientId, Thread thread) {
      this.node = node;
      this.conn = conn;
      this.clientId = clientId;
      this.thread = thread;
    }
  }

  Stop(Transport transport, String what) {
    this.transport = transport;
    this.what = what;
  }

  /**
   * Ends the wait (from any thread): {@code interrupt} when its thread was interrupted, false
   * when its future was completed by someone else. Nothing once the wait has finished.
   */
  void request(boolean interrupt) {
    Blocked b;
    synchronized (this) {
      if (finished || requested) {
        return;
      }
      requested = true;
      byInterrupt = interrupt;
      b = blocked;
    }
    if (b != null) {
      Refresher.async().execute(() -> end(b));
    }
  }

  synchronized boolean requested() {
    return requested;
  }

  /** Whether the wait is to end: requested, or this thread interrupted (which requests it). */
  boolean stopping() {
    if (Thread.currentThread().isInterrupted()) {
      request(true);
    }
    return requested();
  }

  /**
   * Before a call that may block: throws {@link WaitInterrupted} when the wait was stopped or
   * its thread is interrupted (nothing is sent then).
   */
  void check() {
    if (Thread.currentThread().isInterrupted()) {
      request(true);
    }
    synchronized (this) {
      if (requested) {
        throw stopped(null);
      }
    }
  }

  /** The error a stopped wait throws. */
  synchronized WaitInterrupted stopped(Throwable cause) {
    return new WaitInterrupted((byInterrupt ? "interrupted" : "cancelled") + " while waiting for "
        + what, cause);
  }

  /**
   * Marks the wait done, so that a later request changes nothing: false when it was stopped
   * before (then its result must be given back).
   */
  synchronized boolean finish() {
    if (requested) {
      return false;
    }
    finished = true;
    return true;
  }

  /** A call blocks on {@code conn} (the server's client {@code clientId}) of {@code node}. */
  void enter(String node, Transport.Conn conn, long clientId) {
    Blocked b = new Blocked(node, conn, clientId, Thread.currentThread());
    boolean end;
    synchronized (this) {
      blocked = b;
      end = requested;
    }
    if (end) {
      Refresher.async().execute(() -> end(b));
      return;
    }
    // A thread blocked in a socket read does not see its interrupt: it is looked at instead.
    b.watch = Refresher.watch(WATCH_NANOS, () -> {
      if (b.thread.isInterrupted()) {
        request(true);
      }
    });
  }

  /** The blocking call registered by {@link #enter} has returned. */
  void leave() {
    Blocked b;
    synchronized (this) {
      b = blocked;
      blocked = null;
      notifyAll();
    }
    if (b != null && b.watch != null) {
      b.watch.cancel(false);
    }
  }

  private synchronized boolean stillBlocked(Blocked b, long nanos) {
    long until = System.nanoTime() + nanos;
    while (blocked == b) {
      long left = until - System.nanoTime();
      if (left <= 0) {
        return true;
      }
      try {
        wait(Math.max(1, left / 1_000_000));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return true;
      }
    }
    return false;
  }

  /** On a daemon thread: unblocks {@code b}'s call in the server, or closes its connection. */
  private void end(Blocked b) {
    // Closed after a second whatever happens to the UNBLOCKs (a pool with no free connection).
    Refresher.later(RETRY_NANOS * UNBLOCKS, () -> {
      if (stillBlocked(b, 0)) {
        b.conn.abort();
      }
    });
    for (int i = 0; i < UNBLOCKS && b.clientId > 0; i++) {
      if (!unblock(b)) {
        break; // refused (an ACL without CLIENT) or unreachable: the connection is closed
      }
      if (!stillBlocked(b, RETRY_NANOS)) {
        return;
      }
    }
    if (stillBlocked(b, 0)) {
      b.conn.abort();
    }
  }

  private boolean unblock(Blocked b) {
    Transport.Conn conn = null;
    boolean broken = false;
    try {
      conn = transport.open(b.node.isEmpty() ? null : b.node, false);
      conn.call(0, List.of("CLIENT", "UNBLOCK", b.clientId));
      return true;
    } catch (RuntimeException e) {
      broken = conn != null && transport.classify(e).broken;
      return false;
    } finally {
      if (conn != null) {
        conn.close(broken);
      }
    }
  }
}
