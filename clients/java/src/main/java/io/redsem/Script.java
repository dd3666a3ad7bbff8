package io.redsem;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The script redsem.lua, shipped in the jar (its one source is the repository's
 * clients/scripts/redsem.lua): the module's operations for a server without the module.
 */
final class Script {
  private Script() {}

  /** T_oom: the file as it is ({@code #!lua flags=allow-oom}): runs when memory is full. */
  static final byte[] SOURCE = load();
  static final String SHA = sha1(SOURCE);
  /**
   * T_acq: the same with its first line {@code #!lua}, which the server refuses at maxmemory with
   * its own OOM error, changing nothing: the text of an acquire that may take a new place.
   */
  static final byte[] SOURCE_ACQ = firstAttempt(SOURCE);
  static final String SHA_ACQ = sha1(SOURCE_ACQ);

  private static byte[] firstAttempt(byte[] source) {
    byte[] head = "#!lua flags=allow-oom".getBytes(StandardCharsets.US_ASCII);
    byte[] plain = "#!lua".getBytes(StandardCharsets.US_ASCII);
    if (source.length < head.length
        || !Arrays.equals(source, 0, head.length, head, 0, head.length)) {
      throw new IllegalStateException("io/redsem/redsem.lua does not start with " + new String(
          head, StandardCharsets.US_ASCII));
    }
    byte[] out = new byte[source.length - head.length + plain.length];
    System.arraycopy(plain, 0, out, 0, plain.length);
    System.arraycopy(source, head.length, out, plain.length, source.length - head.length);
    return out;
  }

  private static byte[] load() {
    try (InputStream in = Script.class.getResourceAsStream("redsem.lua")) {
      if (in == null) {
        throw new IllegalStateException("io/redsem/redsem.lua is missing from the jar");
      }
      return in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static String sha1(byte[] source) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-1").digest(source);
      StringBuilder hex = new StringBuilder();
      for (byte b : digest) {
        hex.append(String.format("%02x", b));
      }
      return hex.toString();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  /** {@code SEM.<OP> name rest...} as the script's EVALSHA (or EVAL, which also loads it). */
  static List<Object> args(List<Object> command, boolean load) {
    return args(command, load, false);
  }

  /** As {@link #args(List, boolean)}; {@code acq}: through T_acq (a first attempt). */
  static List<Object> args(List<Object> command, boolean load, boolean acq) {
    String op = Commands.text(command.get(0)).toUpperCase();
    if (!op.startsWith("SEM.")) {
      throw new IllegalArgumentException(op + " is not a redsem command");
    }
    List<Object> out = new ArrayList<>(command.size() + 8);
    out.add(load ? "EVAL" : "EVALSHA");
    out.add(load ? (acq ? SOURCE_ACQ : SOURCE) : (acq ? SHA_ACQ : SHA));
    out.add(6);
    out.addAll(Commands.scriptKeys(Commands.text(command.get(1))));
    out.add(op.substring(4));
    out.addAll(command.subList(2, command.size()));
    return out;
  }
}
