package io.redsem;

import java.util.List;

/**
 * What the semaphore logic needs of a client library: connections to the server (or to a node
 * of a Redis Cluster), raw commands on them, and what an error means. One implementation per
 * library and kind of client; everything else is written once.
 */
interface Transport extends AutoCloseable {
  /** Whether the client speaks to a Redis Cluster (the long form, a node per slot). */
  boolean cluster();

  /**
   * A connection to the server, or to the node {@code node} ("host:port") of a cluster.
   * {@code dedicated}: a connection nobody else sends on until it is closed (a blocking
   * command, BOUND, WAIT numreplicas, ASKING); otherwise one that may be shared.
   */
  Conn open(String node, boolean dedicated);

  /** The primary serving {@code slot}, as "host:port" (cluster only). */
  String ownerOf(int slot);

  /** Learns the slots' owners anew (cluster only); errors are the caller's to ignore. */
  void refreshTopology();

  /** A server's error {@code message} as the library throws the server's errors. */
  RuntimeException serverError(String message);

  /** What an error thrown by a call means for a call in Cluster. */
  Failure classify(RuntimeException error);

  /** Closes the connections this transport opened (never the application's client). */
  @Override
  void close();

  /** One connection. */
  interface Conn {
    /**
     * Sends a command and returns its reply: byte[] for a bulk or status string, Long for an
     * integer, List for an array, null for nil. The server's errors are thrown as the library
     * throws them. {@code blockMillis}: how long the command may block in the server (0: it does
     * not block, -1: without limit); the reply is read for that long plus the connection's own
     * timeout.
     */
    default Object call(long blockMillis, List<Object> args) {
      return call(blockMillis, args, null);
    }

    /**
     * As {@link #call(long, List)}, for a call that may be ended from another thread: {@code
     * watch} (when not null) is given the connection's CLIENT ID, asked in the same write before
     * the call (-1 when the server refuses it), and told when the waiting thread is interrupted.
     * The interrupt does not end the call: its answer is read (the thread's interrupt status is
     * set again after).
     */
    Object call(long blockMillis, List<Object> args, Watch watch);

    /** Closes the connection at once, under a call another thread is blocked in. */
    void abort();

    /** Gives the connection back; {@code broken}: a call failed and its reply may still come. */
    void close(boolean broken);
  }

  /** What a call that may be ended from another thread tells of itself. */
  interface Watch {
    void blocked(long clientId);

    void interrupted();
  }

  /** What an error means: a redirection, a pause, a script to load, or none of these. */
  final class Failure {
    enum Kind {
      MOVED,
      ASK,
      PAUSE,
      NOSCRIPT,
      OTHER
    }

    final Kind kind;
    final String node;
    /** The connection failed (its reply may still come): it must not be used again. */
    final boolean broken;

    Failure(Kind kind, String node, boolean broken) {
      this.kind = kind;
      this.node = node;
      this.broken = broken;
    }

    static final Failure OTHER = new Failure(Kind.OTHER, null, false);
    /** A server's answer to wait and resend (TRYAGAIN, CLUSTERDOWN, LOADING, ...). */
    static final Failure PAUSE = new Failure(Kind.PAUSE, null, false);
    /** The connection's failure: refused, reset, closed, timed out. */
    static final Failure BROKEN = new Failure(Kind.PAUSE, null, true);
    static final Failure NOSCRIPT = new Failure(Kind.NOSCRIPT, null, false);
    /** TRYAGAIN: the slot is moving, its owner unchanged (no need to read the topology). */
    static final Failure TRYAGAIN = new Failure(Kind.PAUSE, null, false);
    /**
     * UNBLOCKED: another client (CLIENT UNBLOCK ... ERROR) or a failover (CLUSTER FAILOVER, the
     * server turned replica) ended a blocked call: it waits again for the time it has left.
     */
    static final Failure UNBLOCKED = new Failure(Kind.PAUSE, null, false);

    /** The meaning of a server's error text (the same for every library). */
    static Failure ofServerError(String message) {
      if (message == null) {
        return OTHER;
      }
      String m = message.startsWith("-") ? message.substring(1) : message;
      if (m.startsWith("MOVED ") || m.startsWith("ASK ")) {
        String[] parts = m.split(" ");
        if (parts.length >= 3) {
          return new Failure(m.startsWith("MOVED") ? Kind.MOVED : Kind.ASK, parts[2], false);
        }
      }
      if (m.startsWith("NOSCRIPT")) {
        return NOSCRIPT;
      }
      if (m.startsWith("TRYAGAIN")) {
        return TRYAGAIN;
      }
      if (m.startsWith("UNBLOCKED")) {
        return UNBLOCKED;
      }
      for (String paused : new String[] {"CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"}) {
        if (m.startsWith(paused)) {
          return PAUSE;
        }
      }
      // A durable grant's WAIT on a node that became a replica since (a failover): as a cut
      // WAIT, the holder is refreshed on the primary of now and WAIT sent there.
      if (m.startsWith("ERR WAIT cannot be used with replica instances")) {
        return PAUSE;
      }
      return OTHER;
    }
  }
}
