package io.redsem;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;

/** What the commands look like: arguments, times, keys, the long form and slots. */
final class Commands {
  private Commands() {}

  /** The module's four derived keys of a semaphore. */
  static final String[] DERIVED = {":owner", ":counter", ":permits", ":limit"};

  /** The script's sixth key; a waiter's own list is this and ":<id>". */
  static final String WAKE = ":wake";

  /** The commands on a set of semaphores: their keys follow every argument in the long form. */
  private static final List<String> SET_COMMANDS =
      List.of("SEM.ACQUIREALL", "SEM.RELEASEALL", "SEM.REFRESHALL");

  /** The largest limit the module takes (an unsigned 32-bit number). */
  static final long MAX_LIMIT = 4294967295L;

  /** A wait without limit, in nanoseconds. */
  static final long NO_LIMIT = Long.MAX_VALUE;

  static byte[] bytes(Object arg) {
    if (arg instanceof byte[]) {
      return (byte[]) arg;
    }
    return String.valueOf(arg).getBytes(StandardCharsets.UTF_8);
  }

  static byte[][] encode(List<Object> args) {
    byte[][] out = new byte[args.size()][];
    for (int i = 0; i < out.length; i++) {
      out[i] = bytes(args.get(i));
    }
    return out;
  }

  static String text(Object reply) {
    if (reply instanceof byte[]) {
      return new String((byte[]) reply, StandardCharsets.UTF_8);
    }
    return String.valueOf(reply);
  }

  static long integer(Object reply) {
    if (reply instanceof Number) {
      return ((Number) reply).longValue();
    }
    return Long.parseLong(text(reply));
  }

  private static final long ID_HIGH;
  private static final AtomicLong ID_LOW;

  static {
    java.security.SecureRandom random = new java.security.SecureRandom();
    // Version 4 and the IETF variant, as UUID.randomUUID() sets them.
    ID_HIGH = (random.nextLong() & ~0xF000L) | 0x4000L;
    ID_LOW = new AtomicLong(random.nextLong());
  }

  /**
   * A new holder's identifier in the form of a UUID v4: 64 random bits drawn once per process,
   * then 62 bits counted from a random start, so that no two acquires of the process ever
   * share one (and two processes share none but by a 1 in 2^60 chance) without a SecureRandom
   * draw on every acquire.
   */
  static String newId() {
    long low = (ID_LOW.getAndIncrement() & 0x3FFFFFFFFFFFFFFFL) | 0x8000000000000000L;
    return new UUID(ID_HIGH, low).toString();
  }

  /** Milliseconds as the module reads seconds: digits, a dot and 3 decimals. */
  static String seconds(long ms) {
    long frac = ms % 1000; // without String.format: it is on every acquire's path
    return (ms / 1000) + (frac < 10 ? ".00" : frac < 100 ? ".0" : ".") + frac;
  }

  /** Nanoseconds as the module reads seconds; a positive time never rounds down to none. */
  static String secondsOfNanos(long nanos) {
    long ms = Math.round(nanos / 1_000_000.0);
    if (ms == 0 && nanos > 0) {
      ms = 1;
    }
    return seconds(ms);
  }

  /** The milliseconds {@link #secondsOfNanos} sends. */
  static long sentMillis(long nanos) {
    long ms = Math.round(nanos / 1_000_000.0);
    return ms == 0 && nanos > 0 ? 1 : ms;
  }

  /** The script's 6 keys: the semaphore's, the module's derived keys, and the wake-up list. */
  static List<Object> scriptKeys(String name) {
    List<Object> keys = new ArrayList<>(6);
    keys.add(name);
    for (String suffix : DERIVED) {
      keys.add(name + suffix);
    }
    keys.add(name + WAKE);
    return keys;
  }

  /**
   * A SEM.* command with every key named (what Redis Cluster routes by): a semaphore's four keys
   * after its name, a set's after every argument; other commands as they are.
   */
  static List<Object> longForm(List<Object> args, List<String> names) {
    String command = text(args.get(0)).toUpperCase();
    List<Object> out = new ArrayList<>(args.size() + 4 * names.size());
    if (SET_COMMANDS.contains(command)) {
      out.addAll(args);
      for (String name : names) {
        for (String suffix : DERIVED) {
          out.add(name + suffix);
        }
      }
      return out;
    }
    if (command.startsWith("SEM.")) {
      String name = text(args.get(1));
      out.add(args.get(0));
      out.add(args.get(1));
      for (String suffix : DERIVED) {
        out.add(name + suffix);
      }
      out.addAll(args.subList(2, args.size()));
      return out;
    }
    return args;
  }

  /** Redis's rule: the bytes between the first '{' and the first '}' after it, if not empty. */
  static byte[] hashTag(byte[] key) {
    int start = indexOf(key, (byte) '{', 0);
    if (start < 0) {
      return null;
    }
    int end = indexOf(key, (byte) '}', start + 1);
    if (end <= start + 1) {
      return null;
    }
    return Arrays.copyOfRange(key, start + 1, end);
  }

  private static int indexOf(byte[] bytes, byte b, int from) {
    for (int i = from; i < bytes.length; i++) {
      if (bytes[i] == b) {
        return i;
      }
    }
    return -1;
  }

  /** The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of the whole key. */
  static int slot(byte[] key) {
    byte[] tag = hashTag(key);
    byte[] hashed = tag == null ? key : tag;
    int crc = 0;
    for (byte b : hashed) {
      crc ^= (b & 0xff) << 8;
      for (int i = 0; i < 8; i++) {
        crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
      }
    }
    return (crc & 0xffff) % 16384;
  }

  static int slot(String key) {
    return slot(bytes(key));
  }

  /**
   * The one slot of the names' keys in Redis Cluster, or IllegalArgumentException before
   * anything is sent: a name without a hash tag, or names in different slots.
   */
  static int clusterSlot(List<String> names) {
    int first = -1;
    for (String n : names) {
      if (hashTag(bytes(n)) == null) {
        throw new IllegalArgumentException(
            "in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{" + n + "}\" or \"app:{"
                + n + "}\": the keys of \"" + n + "\" (" + n + ", " + n + ":owner, " + n
                + ":counter, " + n + ":permits, " + n + ":limit) would fall in different slots");
      }
      int s = slot(n);
      if (first < 0) {
        first = s;
      } else if (s != first) {
        throw new IllegalArgumentException(
            "in Redis Cluster the semaphores of a set must share a slot: give their names one "
                + "hash tag, e.g. \"{app}a\" and \"{app}b\" (\"" + names.get(0) + "\" is in slot "
                + first + ", \"" + n + "\" in slot " + s + ")");
      }
    }
    return first;
  }

  static String checkName(String name, String what) {
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException(what + " must not be empty");
    }
    return name;
  }

  static void checkLimit(long limit, String what) {
    if (limit < 1 || limit > MAX_LIMIT) {
      throw new IllegalArgumentException(
          what + " must be an integer from 1 to " + MAX_LIMIT + " (got " + limit + ")");
    }
  }

  /**
   * The longest lease, wait or timeout the module takes: one year (sem.max-lease cannot be set
   * above it). Longer is refused here, by name, rather than by the server after a send.
   */
  static final long MAX_SECONDS = 31_536_000L;

  private static final long MAX_NANOS = MAX_SECONDS * 1_000_000_000L;

  /** A lease in seconds, checked: finite, greater than 0, at most a year; in nanoseconds. */
  static long leaseNanos(double seconds) {
    if (!(seconds > 0) || !(seconds <= MAX_SECONDS)) {
      throw new IllegalArgumentException("lease must be a finite number of seconds greater than 0"
          + " and at most " + MAX_SECONDS + " (a year; got " + seconds + ")");
    }
    return Math.max(1, (long) (seconds * 1e9));
  }

  static long leaseNanos(java.time.Duration lease) {
    if (lease == null || lease.isNegative() || lease.isZero()
        || lease.compareTo(java.time.Duration.ofSeconds(MAX_SECONDS)) > 0) {
      throw new IllegalArgumentException(
          "lease must be a duration greater than 0 and at most a year (got " + lease + ")");
    }
    return lease.toNanos();
  }

  /**
   * A wait in seconds: 0 does not wait, +infinity waits without limit, else at most a year; in
   * nanoseconds.
   */
  static long waitNanos(double seconds, String what) {
    if (seconds == Double.POSITIVE_INFINITY) {
      return NO_LIMIT;
    }
    if (!(seconds >= 0) || !(seconds <= MAX_SECONDS)) {
      throw new IllegalArgumentException(what + " must be a number of seconds from 0 to "
          + MAX_SECONDS + " (a year), or Double.POSITIVE_INFINITY for no limit (got " + seconds
          + ")");
    }
    return (long) (seconds * 1e9);
  }

  /** A wait as a Duration: null or zero do not wait; at most a year. */
  static long waitNanos(java.time.Duration wait, String what) {
    if (wait == null) {
      return 0;
    }
    return durationNanos(wait, what);
  }

  /**
   * A duration from 0 to a year, in nanoseconds; anything else (null, negative, longer) is
   * refused naming {@code what}.
   */
  static long durationNanos(java.time.Duration d, String what) {
    if (d == null || d.isNegative() || d.compareTo(java.time.Duration.ofSeconds(MAX_SECONDS)) > 0) {
      throw new IllegalArgumentException(
          what + " must be a duration from 0 to a year (got " + d + ")");
    }
    return Math.min(d.toNanos(), MAX_NANOS);
  }

  /** What is left, at this send, of a wait that ends at {@code deadline} (System.nanoTime). */
  static long waitLeft(long wait, long deadline) {
    if (wait == 0 || wait == NO_LIMIT) {
      return wait;
    }
    return Math.max(deadline - System.nanoTime(), 0);
  }

  static long deadline(long wait) {
    if (wait == NO_LIMIT) {
      return Long.MAX_VALUE;
    }
    return System.nanoTime() + wait;
  }

  /** How long (ms) a command with this wait may block in the server: -1 without limit. */
  static long blockMillis(long waitNanos) {
    if (waitNanos == NO_LIMIT) {
      return -1;
    }
    return sentMillis(waitNanos);
  }

  static String describeWait(long waitNanos) {
    if (waitNanos == 0) {
      return "";
    }
    if (waitNanos == NO_LIMIT) {
      return " (waiting without limit)";
    }
    return " within " + seconds(sentMillis(waitNanos)) + " s";
  }
}
