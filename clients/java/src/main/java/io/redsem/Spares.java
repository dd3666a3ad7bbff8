package io.redsem;

import java.util.ArrayDeque;
import java.util.Deque;

/**
 * Connections of redsem's own, outside the application's pool, for the calls that block or
 * bind (a waiting acquire, BOUND, WAIT numreplicas, ASKING): one per such call while it runs,
 * as BLPOP takes one, so that a release or the application's own calls never queue behind a
 * wait that only they could end. Up to {@link #MAX_IDLE} are kept for the next such call once
 * given back whole (for a minute at most): a waiting acquire does not pay for a new
 * connection each time.
 */
final class Spares<C> {
  /** How a connection of this library is made, looked at and closed. */
  interface Maker<C> {
    C connect();

    boolean usable(C connection);

    void close(C connection);
  }

  static final int MAX_IDLE = 16;
  private static final long IDLE_NANOS = 60_000_000_000L;

  private final Maker<C> maker;
  private final Deque<C> idle = new ArrayDeque<>();
  private final Deque<Long> since = new ArrayDeque<>();
  private boolean closed;

  Spares(Maker<C> maker) {
    this.maker = maker;
  }

  /** A connection nobody else uses until it is given back. */
  C take() {
    long now = System.nanoTime();
    while (true) {
      C c;
      synchronized (this) {
        c = idle.pollFirst();
        if (c == null) {
          break;
        }
        long at = since.pollFirst();
        if (now - at < IDLE_NANOS && maker.usable(c)) {
          return c;
        }
      }
      maker.close(c);
    }
    return maker.connect();
  }

  /** Back for the next call; {@code broken}: a reply may still come, so it is closed. */
  void giveBack(C c, boolean broken) {
    if (!broken && maker.usable(c)) {
      synchronized (this) {
        if (!closed && idle.size() < MAX_IDLE) {
          idle.addFirst(c);
          since.addFirst(System.nanoTime());
          return;
        }
      }
    }
    maker.close(c);
  }

  /** Closes the idle ones; those in use are closed as they come back. */
  void close() {
    Deque<C> out;
    synchronized (this) {
      closed = true;
      out = new ArrayDeque<>(idle);
      idle.clear();
      since.clear();
    }
    for (C c : out) {
      maker.close(c);
    }
  }
}
