package io.redsem;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.LongFunction;

/**
 * One acquire through the script (a server without the module), waiting as the script's line
 * asks: a place in the server's line (LINE), the grant told on the waiter's own list {@code
 * <name>:wake:<id>} (BLPOP), a TICK sent on another connection when the first in line's lease
 * ends before the BLPOP would, LEAVE when the time is up. Written once for every transport.
 */
final class ScriptWait {
  /** The longest BLPOP: the script holds a place 6 s after its last attempt. */
  static final long NUDGE_NANOS = 2_500_000_000L;
  /** A TICK goes this long after the lease's end: the lease ends at its deadline, not before. */
  private static final long TICK_LATE_NANOS = 2_000_000L;

  private final Redsem redsem;
  private final String name;
  private final String id;
  private final boolean fair;
  private final long waitNanos;
  private final long deadline; // System.nanoTime; unused when waiting without limit
  private final List<Object> attempt; // the script's ACQUIRE[FAIR] ..., with LINE when waiting
  private final LongFunction<List<Object>> moduleCommand; // the module's, waiting ns
  private boolean first = true;
  /** It may have a place in the script's line (left on a failure, by {@link #leave}). */
  private volatile boolean placed;
  private volatile String node = "";

  ScriptWait(Redsem redsem, String name, String id, boolean fair, long waitNanos, long deadline,
      List<Object> scriptCommand, LongFunction<List<Object>> moduleCommand) {
    this.redsem = redsem;
    this.name = name;
    this.id = id;
    this.fair = fair;
    this.waitNanos = waitNanos;
    this.deadline = deadline;
    this.attempt = new ArrayList<>(scriptCommand);
    if (waitNanos != 0) {
      attempt.add("LINE");
    }
    this.moduleCommand = moduleCommand;
  }

  private long left() {
    return waitNanos == Commands.NO_LIMIT ? Long.MAX_VALUE : deadline - System.nanoTime();
  }

  /**
   * Acquires on {@code hop} (again after a move in Cluster: same id, the time left). Returns
   * the module's reply (null: not granted) and when the attempt before the grant was sent (the
   * lease started at or after it).
   */
  Object[] run(Hop hop) {
    try {
      return attempts(hop);
    } catch (RuntimeException e) {
      // Whatever a stop cut short (a connection closed under its BLPOP): the place is left.
      if (!(e instanceof WaitInterrupted) && hop.stop.stopping()) {
        throw hop.stop.stopped(e);
      }
      throw e;
    }
  }

  private Object[] attempts(Hop hop) {
    node = hop.node;
    while (true) {
      long at = System.nanoTime();
      // A first attempt may take a new place: refused when memory is full, as SEM.ACQUIRE.
      placed = waitNanos != 0; // it may be in line once the attempt is sent
      boolean again = !first;
      Object r = first ? hop.sendFirst(attempt) : hop.send(attempt);
      first = false;
      if (!(r instanceof List) || ((List<?>) r).size() != 3) {
        throw new RedsemException("unexpected answer of the redsem script: " + r);
      }
      Object reply = ((List<?>) r).get(0);
      long retryMs = Commands.integer(((List<?>) r).get(1));
      long ahead = Commands.integer(((List<?>) r).get(2));
      if (ahead == -1) { // the module is loaded: its reply, and its wait from now on
        placed = false;
        redsem.moduleLoaded(hop.node);
        if (reply != null || waitNanos == 0) {
          return new Object[] {reply, at};
        }
        return withModule(hop);
      }
      if (reply != null || waitNanos == 0) {
        placed = false;
        if (reply != null && again) {
          forget(hop);
        }
        return new Object[] {reply, at};
      }
      String message;
      // "H<ms>": first in line, a lease ends in ms: block again with a TICK then, while the
      // last attempt keeps the place (held 6 s from it: the next comes within NUDGE).
      while (true) {
        long left = left();
        if (left <= 0) {
          Object kept = hop.send(List.of("SEM.LEAVE", name, id));
          placed = false;
          return new Object[] {kept == null ? null : granted(Commands.text(kept)), at};
        }
        long block = Math.min(left, NUDGE_NANOS);
        AtomicBoolean pending = new AtomicBoolean(true);
        AtomicReference<ScheduledFuture<?>> tick = new AtomicReference<>();
        if (ahead == 0 && retryMs > 0 && retryMs * 1_000_000L < block) {
          arm(retryMs, pending, tick);
        }
        Object popped;
        try {
          popped = hop.blocking(
              List.of("BLPOP", name + Commands.WAKE + ":" + id, Commands.secondsOfNanos(block)),
              Commands.sentMillis(block));
        } finally {
          pending.set(false);
          ScheduledFuture<?> armed = tick.get();
          if (armed != null) {
            armed.cancel(false);
          }
        }
        message = popped == null ? "" : Commands.text(((List<?>) popped).get(1));
        if (hop.stop.stopping()) {
          // The caller will never see a permit granted meanwhile: give it back.
          if (message.startsWith("G")) {
            placed = false;
            try {
              hop.send(List.of("SEM.RELEASE", name, id));
            } catch (RuntimeException ignored) {
              // the lease ends it
            }
          }
          throw hop.stop.stopped(null);
        }
        long nudge = nudgeMillis(message);
        if (nudge <= 0 || System.nanoTime() - at >= NUDGE_NANOS) {
          break;
        }
        retryMs = nudge;
        ahead = 0;
      }
      if (message.startsWith("G") || message.startsWith("E")) {
        placed = false;
        return new Object[] {granted(message), at};
      }
      if (message.equals("M")) {
        placed = false;
        redsem.moduleLoaded(hop.node);
        return withModule(hop);
      }
      // nil: the next attempt renews the place; "H" (or "H<ms>" after NUDGE): it says when a
      // lease ends.
    }
  }

  /** The milliseconds an "H<ms>" message gives until a lease ends (0: the message is another). */
  static long nudgeMillis(String message) {
    if (message.length() < 2 || message.charAt(0) != 'H') {
      return 0;
    }
    try {
      return Math.max(Long.parseLong(message.substring(1)), 0);
    } catch (NumberFormatException e) {
      return 0;
    }
  }

  /**
   * A waiter granted by its own attempt may have a grant told on its list as well (told just as
   * its BLPOP ended, or behind an "H"): the script leaves that list when the line is gone, and a
   * later wait with the same id would take the old "G" for its own (script-bugs.md). Best effort.
   */
  private void forget(Hop hop) {
    try {
      hop.blocking(List.of("DEL", name + Commands.WAKE + ":" + id), 0);
    } catch (RuntimeException ignored) {
      // it expires with its place (6 s)
    }
  }

  /** The module's reply for a grant the script told ("G", "G<ticket>"), or its error ("E..."). */
  private Object granted(String message) {
    if (message.startsWith("E")) {
      throw redsem.transport.serverError(message.substring(1));
    }
    if (!message.startsWith("G")) {
      throw new RedsemException("unexpected message of the redsem script: " + message);
    }
    byte[] identifier = Commands.bytes(id);
    if (!fair) {
      return identifier;
    }
    return List.of(identifier, Long.parseLong(message.substring(1)));
  }

  /** The module was found loaded: the rest of the wait in the server, as with it from the start. */
  private Object[] withModule(Hop hop) {
    Hop module = hop.module();
    long at = System.nanoTime();
    long wait = waitNanos == Commands.NO_LIMIT ? Commands.NO_LIMIT : Math.max(left(), 0);
    List<Object> command = moduleCommand.apply(wait);
    return new Object[] {module.blocking(command, wait == 0 ? 0 : Commands.blockMillis(wait)), at};
  }

  /** A TICK in {@code retryMs} (and again while the BLPOP is pending and a lease is live). */
  private void arm(long retryMs, AtomicBoolean pending, AtomicReference<ScheduledFuture<?>> tick) {
    String at = node;
    tick.set(Refresher.later(retryMs * 1_000_000L + TICK_LATE_NANOS, () -> {
      if (!pending.get()) {
        return;
      }
      long next;
      Transport.Conn conn = null;
      boolean broken = false;
      try {
        // Not the blocked connection: the client's normal one.
        conn = redsem.transport.open(at.isEmpty() ? null : at, false);
        next = Commands.integer(Hop.script(conn, List.of("SEM.TICK", name), false));
      } catch (RuntimeException e) {
        broken = conn != null && redsem.transport.classify(e).broken;
        return; // the waiter's next attempt serves the line anyway
      } finally {
        if (conn != null) {
          conn.close(broken);
        }
      }
      if (next > 0 && pending.get()) {
        arm(next, pending, tick);
      }
    }));
  }

  /**
   * Best effort, after a failure or an interrupt while in line: leaves it, and gives back a
   * permit granted meanwhile (the caller will never see it). {@code releaseHeld}: release the
   * id even when LEAVE tells of no grant, as a BLPOP cut short by an interrupt may have taken
   * the grant's message from the list (only for an id made for this acquire: a given one may
   * be held by another permit).
   */
  void leave(long retryForNanos, boolean releaseHeld) {
    if (!placed) {
      return;
    }
    placed = false;
    boolean interrupted = Thread.interrupted(); // Lettuce would not send while it is set
    try (Line line = new Line(redsem, List.of(name), false, Math.min(retryForNanos, NUDGE_NANOS))) {
      line.run(hop -> {
        Object message = Hop.script(hop.conn, List.of("SEM.LEAVE", name, id), false);
        if (message != null ? Commands.text(message).startsWith("G") : releaseHeld) {
          Hop.script(hop.conn, List.of("SEM.RELEASE", name, id), false);
        }
        return null;
      });
    } catch (RuntimeException ignored) {
      // its place runs out within 6 s, a permit with its lease
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
