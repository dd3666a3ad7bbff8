package io.redsem;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;

/**
 * The script redsem.lua, shipped in the jar (its one source is the repository's
 * clients/scripts/redsem.lua): the module's operations for a server without the module.
 */
final class Script {
  private Script() {}

  static final byte[] SOURCE = load();
  static final String SHA = sha1(SOURCE);

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
    String op = Commands.text(command.get(0)).toUpperCase();
    if (!op.startsWith("SEM.")) {
      throw new IllegalArgumentException(op + " is not a redsem command");
    }
    List<Object> out = new ArrayList<>(command.size() + 8);
    out.add(load ? "EVAL" : "EVALSHA");
    out.add(load ? SOURCE : SHA);
    out.add(6);
    out.addAll(Commands.scriptKeys(Commands.text(command.get(1))));
    out.add(op.substring(4));
    out.addAll(command.subList(2, command.size()));
    return out;
  }
}
