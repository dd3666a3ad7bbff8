package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The README's examples, run against a real server (its address in place of 127.0.0.1:6379),
 * and a check that every line of the README's Java examples is a line of these tests.
 */
class ReadmeTest {
  private static RedisServer server;
  private static final boolean SCRIPTS = RedisServer.scriptsBackend();

  @BeforeAll
  static void start() throws Exception {
    server = RedisServer.start();
  }

  @AfterAll
  static void stop() {
    if (server != null) {
      server.close();
    }
  }

  @Test
  void jedis() throws Exception {
    redis.clients.jedis.RedisClient jedis =
        redis.clients.jedis.RedisClient.builder().hostAndPort("127.0.0.1", server.port).build();
    Redsem redsem = Redsem.of(jedis);

    // At most 3 holders of "jobs"; wait up to 10 s for a permit.
    Semaphore jobs = redsem.semaphore("jobs").limit(3).lease(Duration.ofSeconds(30))
        .waitFor(Duration.ofSeconds(10)).build();
    try (Permit permit = jobs.acquire()) {
      for (int item = 0; item < 3; item++) {
        permit.check(); // throws PermitLost once the permit is lost: stop early
        System.out.println("working on " + item + " as " + permit.id());
      }
    }

    // Fair: first come, first served, and each holder gets a fencing ticket.
    try (Permit permit = redsem.semaphore("printers").limit(1).lease(10).fair(true).acquire()) {
      System.out.println("holder " + permit.id() + " has ticket " + permit.ticket().getAsLong());
    } catch (NotAcquired busy) {
      System.out.println("the printer is busy");
    }
    assertEquals(0L, SemaphoreTest.raw(server.port, "EXISTS", "jobs", "printers"));

    Optional<Permit> maybe = redsem.semaphore("reports").limit(2).build().tryAcquire();
    if (maybe.isPresent()) {
      try (Permit permit = maybe.get()) {
        System.out.println("running the report as " + permit.id());
      }
    }
    assertTrue(maybe.isPresent());
    assertEquals(0L, SemaphoreTest.raw(server.port, "EXISTS", "reports"));
    jedis.close();
  }

  @Test
  void lettuce() throws Exception {
    if (SCRIPTS) {
      return; // bound(true) needs the module
    }
    RedisClient lettuce = RedisClient.create("redis://127.0.0.1:" + server.port);
    try (Redsem redsem = Redsem.of(lettuce)) {
      try (Permit permit = redsem.semaphore("gpus").limit(16).lease(600).count(4).bound(true)
          .acquire()) {
        permit.onLost(lost -> System.err.println(lost.getMessage())); // e.g. cancel the work
        System.out.println(permit.count() + " GPU slots held; lost: " + permit.isLost());
        assertEquals(4L, SemaphoreTest.raw(server.port, "SEM.GET", "gpus"));
      }
    }
    lettuce.shutdown();
  }

  @Test
  void setsAndWaitEmpty() throws Exception {
    if (SCRIPTS) {
      return; // sets and waitEmpty need the module
    }
    redis.clients.jedis.RedisClient jedis =
        redis.clients.jedis.RedisClient.builder().hostAndPort("127.0.0.1", server.port).build();
    Redsem redsem = Redsem.of(jedis);
    try (PermitSet permits = redsem.semaphoreSet().semaphore("gpu", 1).semaphore("licence", 5, 2)
        .waitFor(10).fair(true).acquire()) {
      System.out.println("holding " + permits.names() + " with tickets " + permits.tickets().get());
    }
    boolean drained = redsem.waitEmpty("deploys", Duration.ofSeconds(60));
    assertTrue(drained);
    jedis.close();
  }

  /** The README's async example, whose work is this (and removes the holder when asked to). */
  private static CompletableFuture<String> work(Permit permit) {
    return CompletableFuture.supplyAsync(() -> {
      if (permit.id().startsWith(LOSE)) {
        SemaphoreTest.raw(server.port, "DEL", permit.name());
      }
      return "done as " + permit.id();
    });
  }

  private static final String LOSE = "lose-";

  @Test
  void async() throws Exception {
    redis.clients.jedis.RedisClient jedis =
        redis.clients.jedis.RedisClient.builder().hostAndPort("127.0.0.1", server.port).build();
    Redsem redsem = Redsem.of(jedis);
    CompletableFuture<String> done = redsem.semaphore("jobs").limit(3).waitFor(10).build()
        .acquireAsync()
        .thenCompose(permit -> work(permit)
            .handle((result, error) -> permit.releaseAsync().thenApply(held -> {
              if (error != null) {
                throw new CompletionException(error); // the work's own failure comes first
              }
              if (!held) { // lost during the work: another holder may have overlapped it
                throw new PermitLost("the permit " + permit.id() + " was lost during the work");
              }
              return result;
            }))
            .thenCompose(released -> released));
    assertTrue(done.get(10, TimeUnit.SECONDS).startsWith("done as "));
    assertEquals(0L, SemaphoreTest.raw(server.port, "EXISTS", "jobs"), "released");

    // A permit lost during the work: the future says so.
    CompletableFuture<String> lost = redsem.semaphore("jobs").limit(3).id(LOSE + "1").build()
        .acquireAsync()
        .thenCompose(permit -> work(permit)
            .handle((result, error) -> permit.releaseAsync().thenApply(held -> {
              if (!held) {
                throw new PermitLost("the permit " + permit.id() + " was lost during the work");
              }
              return result;
            }))
            .thenCompose(released -> released));
    ExecutionException failed =
        assertThrows(ExecutionException.class, () -> lost.get(10, TimeUnit.SECONDS));
    assertInstanceOf(PermitLost.class, failed.getCause());
    jedis.close();
  }

  /** Every line of the README's Java examples (imports and addresses aside) is a test's line. */
  @Test
  void theReadmeShowsTheseExamples() throws Exception {
    String readme = Files.readString(Path.of("README.md"));
    String tests = Files.readString(Path.of("src/test/java/io/redsem/ReadmeTest.java"))
        + Files.readString(Path.of("src/test/java/io/redsem/ClusterTest.java"));
    List<String> tested = new ArrayList<>();
    for (String line : tests.split("\n")) {
      tested.add(line.trim());
    }
    boolean inJava = false;
    List<String> missing = new ArrayList<>();
    for (String line : readme.split("\n")) {
      if (line.startsWith("```")) {
        inJava = line.equals("```java");
        continue;
      }
      String code = line.trim();
      if (!inJava || code.isEmpty() || code.startsWith("import ") || code.contains("127.0.0.1")) {
        continue;
      }
      if (!tested.contains(code)) {
        missing.add(code);
      }
    }
    assertTrue(missing.isEmpty(), "README lines no test runs: " + missing);
  }
}
