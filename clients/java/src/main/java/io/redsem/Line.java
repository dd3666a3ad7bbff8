package io.redsem;

import java.util.List;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Where the calls of one semaphore or set go: on a plain client, a connection of the client (a
 * dedicated one while the line needs it); on a cluster client, a connection to the primary
 * serving the names' slot, opened again on the slot's new owner after a move or a failover.
 * Each call on a line is an operation given a {@link Hop}.
 */
final class Line implements AutoCloseable {
  /** An operation on one connection. */
  interface Op<T> {
    T run(Hop hop);
  }

  private static final long FIRST_PAUSE_MS = 50;
  private static final long LONGEST_PAUSE_MS = 1000;

  private final Redsem redsem;
  private final Transport transport;
  private final List<String> names;
  private final int slot; // -1 on a plain client
  private final long retryForNanos;
  private final ReentrantLock lock = new ReentrantLock();
  private boolean dedicated;
  private Transport.Conn conn;
  private String connNode;
  private String movedTo; // the owner a MOVED named, until the next topology is read
  /** Whether the server of the last call runs the script (it has no module). */
  volatile boolean scripts;
  /** What ends the line's waits from outside. */
  final Stop stop;

  Line(Redsem redsem, List<String> names, boolean dedicated, long retryForNanos) {
    this(redsem, names, dedicated, retryForNanos,
        new Stop(redsem.transport, "\"" + String.join("\", \"", names) + "\""));
  }

  Line(Redsem redsem, List<String> names, boolean dedicated, long retryForNanos, Stop stop) {
    this.stop = stop;
    this.redsem = redsem;
    this.transport = redsem.transport;
    this.names = names;
    this.dedicated = dedicated;
    this.retryForNanos = retryForNanos;
    this.slot = transport.cluster() ? Commands.clusterSlot(names) : -1;
  }

  /** Finds out the server's backend; ModuleRequired(needs) when it runs the script. */
  void open(String needs) {
    run(hop -> null, Long.MAX_VALUE);
    if (needs != null && scripts) {
      throw new ModuleRequired(needs);
    }
  }

  /** From now on the line needs no connection of its own (one may be shared per call). */
  void shed() {
    lock.lock();
    try {
      dedicated = false;
      closeConn(false);
    } finally {
      lock.unlock();
    }
  }

  <T> T run(Op<T> op) {
    return run(op, Long.MAX_VALUE);
  }

  /**
   * Runs {@code op}; in Cluster, again after a move or a failure (until the System.nanoTime
   * {@code until} at the latest, Long.MAX_VALUE: the retry budget only).
   */
  <T> T run(Op<T> op, long until) {
    lock.lock();
    try {
      return slot < 0 ? runPlain(op) : runCluster(op, until);
    } finally {
      lock.unlock();
    }
  }

  private <T> T runPlain(Op<T> op) {
    while (true) {
      if (conn == null) {
        conn = transport.open(null, dedicated);
        connNode = "";
      }
      boolean broken = true;
      try {
        scripts = !redsem.hasModule("", conn);
        T reply = op.run(new Hop(conn, scripts, "", null, stop));
        broken = false;
        return reply;
      } catch (RuntimeException e) {
        broken = broken(e);
        // Another client ended the blocked call (CLIENT UNBLOCK ... ERROR): the op waits again
        // for what is left of its time; a stop of its own ends it before it is sent.
        if (broken || transport.classify(e) != Transport.Failure.UNBLOCKED) {
          throw e;
        }
      } finally {
        if (!dedicated || broken) {
          closeConn(broken);
        }
      }
      pause(FIRST_PAUSE_MS);
    }
  }

  private static void pause(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException ie) {
      Thread.currentThread().interrupt(); // the op's stop sees it
    }
  }

  private <T> T runCluster(Op<T> op, long until) {
    // The budget runs from the first failure: a wait may have gone on long before it.
    long giveUp = 0;
    boolean failed = false;
    long pause = FIRST_PAUSE_MS;
    String asked = null;
    int redirections = 0; // in a row: nodes that disagree for a moment send a call back and forth
    while (true) {
      long sleep = 0;
      boolean reread = true;
      try {
        if (asked != null) {
          String node = asked;
          asked = null;
          Transport.Conn askConn = transport.open(node, true);
          boolean broken = true;
          try {
            boolean script = !redsem.hasModule(node, askConn);
            askConn.call(0, List.of("ASKING"));
            T reply = op.run(new Hop(askConn, script, node, names, stop));
            broken = false;
            return reply;
          } catch (RuntimeException e) {
            broken = broken(e);
            throw e;
          } finally {
            askConn.close(broken);
          }
        }
        if (conn == null) {
          String node = movedTo != null ? movedTo : transport.ownerOf(slot);
          conn = transport.open(node, dedicated);
          connNode = node;
        }
        scripts = !redsem.hasModule(connNode, conn);
        T reply = op.run(new Hop(conn, scripts, connNode, names, stop));
        if (!dedicated) {
          closeConn(false);
        }
        return reply;
      } catch (RuntimeException e) {
        if (e instanceof WaitInterrupted) {
          closeConn(true);
          throw e;
        }
        if (!failed) {
          failed = true;
          long now = System.nanoTime();
          giveUp = until == Long.MAX_VALUE ? now + retryForNanos
              : Math.min(now + retryForNanos, until);
        }
        Transport.Failure failure = transport.classify(e);
        switch (failure.kind) {
          case MOVED:
            closeConn(false);
            check(giveUp, e);
            movedTo = failure.node;
            if (++redirections > 4) {
              sleep = Math.min(pause, Math.max(1, (giveUp - System.nanoTime()) / 1_000_000));
              pause = Math.min(pause * 2, LONGEST_PAUSE_MS);
              reread = false;
            }
            try {
              transport.refreshTopology();
            } catch (RuntimeException ignored) {
              // the node a MOVED named is followed anyway
            }
            break;
          case ASK:
            check(giveUp, e);
            asked = failure.node;
            if (++redirections > 4) {
              sleep = Math.min(pause, Math.max(1, (giveUp - System.nanoTime()) / 1_000_000));
              pause = Math.min(pause * 2, LONGEST_PAUSE_MS);
              reread = false;
            }
            break;
          case PAUSE:
            redirections = 0;
            closeConn(failure.broken);
            movedTo = null;
            check(giveUp, e);
            sleep = Math.min(pause, Math.max(1, (giveUp - System.nanoTime()) / 1_000_000));
            reread = failure != Transport.Failure.TRYAGAIN;
            pause = Math.min(pause * 2, LONGEST_PAUSE_MS);
            break;
          default:
            if (!dedicated) {
              closeConn(false);
            }
            throw e;
        }
      }
      if (sleep > 0) {
        try {
          Thread.sleep(sleep);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw new RedsemException("interrupted while waiting out a move or a failover", ie);
        }
        if (reread) {
          try {
            transport.refreshTopology(); // the slot's owner, anew
          } catch (RuntimeException ignored) {
            // no node answered: the next send finds out
          }
        }
      }
    }
  }

  /** Whether the connection of a call that threw {@code e} must not be used again. */
  private boolean broken(RuntimeException e) {
    // A BLPOP cut short by an interrupt may still answer on its connection.
    return e instanceof WaitInterrupted || transport.classify(e).broken;
  }

  private void check(long giveUp, RuntimeException e) {
    if (System.nanoTime() - giveUp >= 0) {
      throw new Unanswered(
          "no answer from the primary of slot " + slot + " within "
              + Commands.seconds(retryForNanos / 1_000_000)
              + " s of retries through moves and failovers: " + e,
          e);
    }
  }

  /** No primary of the slot answered before the retries' end (the budget, or the caller's). */
  static final class Unanswered extends RedsemException {
    private static final long serialVersionUID = 1L;

    Unanswered(String message, Throwable cause) {
      super(message, cause);
    }
  }

  private void closeConn(boolean broken) {
    if (conn != null) {
      Transport.Conn c = conn;
      conn = null;
      c.close(broken);
    }
  }

  @Override
  public void close() {
    lock.lock();
    try {
      closeConn(false);
    } finally {
      lock.unlock();
    }
  }
}
