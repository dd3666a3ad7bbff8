package io.redsem;

import java.util.List;

/** One connection an operation runs on, and how commands are sent there. */
final class Hop {
  final Transport.Conn conn;
  /** The server runs the script (it has no module). */
  final boolean scripts;
  /** The node ("host:port") in Cluster, "" on one server: the key of its backend. */
  final String node;
  private final List<String> names; // in Cluster: the long form's names
  /** What ends the line's waits from outside (a cancelled future, an interrupt). */
  final Stop stop;

  Hop(Transport.Conn conn, boolean scripts, String node, List<String> names, Stop stop) {
    this.conn = conn;
    this.scripts = scripts;
    this.node = node;
    this.names = names;
    this.stop = stop;
  }

  /** The same connection, speaking to the module (found loaded in the middle of a call). */
  Hop module() {
    return new Hop(conn, false, node, names, stop);
  }

  private List<Object> form(List<Object> args) {
    // The script names its 6 keys itself.
    return names == null || scripts ? args : Commands.longForm(args, names);
  }

  /** A SEM.* command, as itself or through the script (T_oom). */
  Object send(List<Object> args) {
    return scripts ? script(conn, args, false) : conn.call(0, form(args));
  }

  /** An acquire that may take a new place: through T_acq (refused when memory is full). */
  Object sendFirst(List<Object> args) {
    return scripts ? script(conn, args, true) : conn.call(0, form(args));
  }

  /** A SEM.* command through the script on {@code conn}; {@code acq}: T_acq, else T_oom. */
  static Object script(Transport.Conn conn, List<Object> args, boolean acq) {
    try {
      return conn.call(0, Script.args(args, false, acq));
    } catch (RuntimeException e) {
      if (Transport.Failure.ofServerError(e.getMessage()).kind
          != Transport.Failure.Kind.NOSCRIPT) {
        throw e;
      }
      // Not loaded yet (or flushed): EVAL loads it.
      return conn.call(0, Script.args(args, true, acq));
    }
  }

  /**
   * A command that may block {@code blockMillis} in the server (-1: without limit), ended by
   * the line's {@link Stop}: WaitInterrupted before it is sent when the wait was stopped; once
   * sent, a stop unblocks it in the server and its answer is returned.
   */
  Object blocking(List<Object> args, long blockMillis) {
    if (blockMillis == 0) {
      return conn.call(0, form(args));
    }
    stop.check();
    try {
      return conn.call(blockMillis, form(args), new Transport.Watch() {
        @Override
        public void blocked(long clientId) {
          stop.enter(node, conn, clientId);
        }

        @Override
        public void interrupted() {
          stop.request(true);
        }
      });
    } finally {
      stop.leave();
    }
  }
}
