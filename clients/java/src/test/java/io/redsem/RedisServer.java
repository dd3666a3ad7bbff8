package io.redsem;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Assumptions;

/**
 * A real redis-server for a test class: the binary REDIS_SERVER (default redis-server) on a
 * free port, with the module REDSEM_MODULE loaded unless REDSEM_BACKEND=scripts (or the test
 * asks for none).
 */
final class RedisServer implements AutoCloseable {
  final int port;
  private final Process process;
  private final Path dir;

  private RedisServer(int port, Process process, Path dir) {
    this.port = port;
    this.process = process;
    this.dir = dir;
  }

  static String binary() {
    String server = System.getenv("REDIS_SERVER");
    return server == null || server.isEmpty() ? "redis-server" : server;
  }

  /** The module's .so: REDSEM_MODULE, else the checkout's debug build, else its release build. */
  static String module() {
    String module = System.getenv("REDSEM_MODULE");
    if (module != null && !module.isEmpty()) {
      return module;
    }
    Path debug = Path.of("../../target/debug/libredsem.so").toAbsolutePath().normalize();
    Path release = Path.of("../../target/release/libredsem.so").toAbsolutePath().normalize();
    return (Files.exists(debug) || !Files.exists(release) ? debug : release).toString();
  }

  /**
   * Skips the calling test (class, from a BeforeAll) when it needs the module and no build of
   * it is at hand: REDSEM_MODULE unset and the checkout has neither target/debug nor
   * target/release/libredsem.so. A REDSEM_MODULE that names a missing file fails instead.
   */
  static void assumeModule() {
    String module = module();
    String set = System.getenv("REDSEM_MODULE");
    if ((set == null || set.isEmpty()) && !Files.exists(Path.of(module))) {
      String message = "redsem-client tests that need the module are skipped: " + module
          + " is missing; build it with `cargo build -p redsem` at the repository's root, or set"
          + " REDSEM_MODULE to a libredsem.so (REDSEM_BACKEND=scripts tests without the module)";
      System.err.println(message);
      Assumptions.abort(message);
    }
  }

  /** Whether this run tests the script backend (no module loaded). */
  static boolean scriptsBackend() {
    return "scripts".equals(System.getenv("REDSEM_BACKEND"));
  }

  /** A server as the run configures it: with the module unless REDSEM_BACKEND=scripts. */
  static RedisServer start(String... extra) throws IOException {
    return start(!scriptsBackend(), extra);
  }

  static RedisServer start(boolean withModule, String... extra) throws IOException {
    IOException last = null;
    for (int attempt = 0; attempt < 5; attempt++) {
      int port = freePort();
      Path dir = Files.createTempDirectory("redsem-java-");
      List<String> command = new ArrayList<>(List.of(binary(), "--port", String.valueOf(port),
          "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir.toString()));
      if (withModule) {
        assumeModule();
        command.add("--loadmodule");
        command.add(module());
      }
      command.addAll(List.of(extra));
      Process process = new ProcessBuilder(command)
          .redirectErrorStream(true)
          .redirectOutput(dir.resolve("server.log").toFile())
          .start();
      RedisServer server = new RedisServer(port, process, dir);
      if (server.awaitReady()) {
        return server;
      }
      last = new IOException("redis-server did not start: " + server.log());
      server.close();
    }
    throw last;
  }

  static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }

  private boolean awaitReady() {
    long until = System.nanoTime() + 10_000_000_000L;
    while (System.nanoTime() < until && process.isAlive()) {
      try (Socket socket = new Socket("127.0.0.1", port)) {
        OutputStream out = socket.getOutputStream();
        out.write("PING\r\n".getBytes(StandardCharsets.US_ASCII));
        out.flush();
        InputStream in = socket.getInputStream();
        byte[] buf = new byte[64];
        int n = in.read(buf);
        if (n > 0 && new String(buf, 0, n, StandardCharsets.US_ASCII).startsWith("+PONG")) {
          return true;
        }
      } catch (IOException e) {
        // not yet
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    }
    return false;
  }

  String log() {
    try {
      return Files.readString(dir.resolve("server.log"));
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  @Override
  public void close() {
    process.destroyForcibly();
    try {
      process.waitFor();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    try (Stream<Path> files = Files.walk(dir)) {
      files.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    } catch (IOException e) {
      // a temporary directory left behind
    }
  }
}
