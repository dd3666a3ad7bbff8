package io.redsem;

import java.util.List;

/** One connection an operation runs on, and how commands are sent there. */
final class Hop {
  final Transport.Conn conn;
  /** The server runs the script (it has no module). */
  final boolean scripts;
  private final List<String> names; // in Cluster: the long form's names

  Hop(Transport.Conn conn, boolean scripts, List<String> names) {
    this.conn = conn;
    this.scripts = scripts;
    this.names = names;
  }

  private List<Object> form(List<Object> args) {
    // The script names its 6 keys itself.
    return names == null || scripts ? args : Commands.longForm(args, names);
  }

  /** A SEM.* command, as itself or through the script. */
  Object send(List<Object> args) {
    return send(args, 0);
  }

  private Object send(List<Object> args, long block) {
    if (!scripts) {
      return conn.call(block, form(args));
    }
    try {
      return conn.call(block, Script.args(args, false));
    } catch (RuntimeException e) {
      if (Transport.Failure.ofServerError(e.getMessage()).kind
          != Transport.Failure.Kind.NOSCRIPT) {
        throw e;
      }
      // Not loaded yet (or flushed): EVAL loads it.
      return conn.call(block, Script.args(args, true));
    }
  }

  /** A command that may block {@code blockMillis} in the server (-1: without limit). */
  Object blocking(List<Object> args, long blockMillis) {
    return conn.call(blockMillis, form(args));
  }
}
