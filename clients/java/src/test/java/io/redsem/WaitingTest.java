package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Waiting for a permit: first come first served, how late a grant comes after a lease's end or
 * a release, memory full, the module loaded while clients wait, the connections a wait takes,
 * and a waiter that dies in line. With the module, or through the script (REDSEM_BACKEND=scripts:
 * a place in the server's line, the waiter's own list, TICK and LEAVE).
 */
class WaitingTest {
  private static RedisServer server;
  private static final AtomicInteger NAMES = new AtomicInteger();
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

  private static String name(String what) {
    return "wait-" + what + "-" + NAMES.incrementAndGet();
  }

  private static Object raw(String... args) {
    return SemaphoreTest.raw(server.port, args);
  }

  private static long ms(long nanos) {
    return nanos / 1_000_000;
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void firstComeFirstServed(Kind kind) throws Exception {
    for (boolean fair : new boolean[] {true, false}) {
      String jobs = name(fair ? "fcfs-fair" : "fcfs-plain");
      try (Kind.Client c = kind.connect(server.port)) {
        Permit holder = c.redsem.semaphore(jobs).limit(1).fair(fair).acquire();
        Semaphore waiting = c.redsem.semaphore(jobs).limit(1).fair(fair)
            .waitFor(Duration.ofSeconds(20)).build();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        ExecutorService pool = Executors.newFixedThreadPool(6);
        try {
          warmUp(c.redsem, pool, 6);
          List<Future<?>> done = new ArrayList<>();
          for (int i = 0; i < 6; i++) {
            int arrival = i;
            done.add(pool.submit(() -> {
              Permit permit = waiting.acquire();
              order.add(arrival);
              assertTrue(permit.release()); // at once: the next one's turn
              return null;
            }));
            Thread.sleep(30);
            if (SCRIPTS) { // arrived: in the script's line (a loaded machine may lag a thread)
              int in = i + 1;
              until(() -> Long.valueOf(in).equals(raw("ZCARD", jobs + ":line")), "waiter " + i);
            }
          }
          Thread.sleep(200);
          assertTrue(order.isEmpty(), "nobody is granted while the permit is held");
          assertTrue(holder.release());
          for (Future<?> f : done) {
            f.get(30, TimeUnit.SECONDS);
          }
        } finally {
          pool.shutdownNow();
        }
        assertEquals(List.of(0, 1, 2, 3, 4, 5), order, (fair ? "fair" : "plain")
            + ": granted in arrival order");
      }
    }
  }

  /**
   * {@code n} waits at once on another name, that time out: the threads and the connections
   * they take are made, so that arrivals 30 ms apart reach the server in that order.
   */
  private static void warmUp(Redsem redsem, ExecutorService pool, int n) throws Exception {
    String busy = name("warm-up");
    try (Permit held = redsem.semaphore(busy).acquire()) {
      List<Future<?>> waits = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        waits.add(pool.submit(() -> assertThrows(NotAcquired.class,
            () -> redsem.semaphore(busy).waitFor(0.2).acquire())));
      }
      for (Future<?> f : waits) {
        f.get(10, TimeUnit.SECONDS);
      }
    }
  }

  /** Each acquire of {@code semaphore} in {@code pool}: the System.nanoTime of its grant. */
  private static Future<Long> grantTime(ExecutorService pool, Semaphore semaphore) {
    return pool.submit(() -> {
      Permit permit = semaphore.acquire();
      long at = System.nanoTime();
      permit.release();
      return at;
    });
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aGrantFollowsTheLeaseEndAndTheReleaseAtHz1(Kind kind) throws Exception {
    assumeTrue(SCRIPTS, "the script's waiting: TICK at the lease's end");
    String hz = Commands.text(((List<?>) raw("CONFIG", "GET", "hz")).get(1));
    raw("CONFIG", "SET", "hz", "1");
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try (Kind.Client c = kind.connect(server.port)) {
      // A lease that ends, never refreshed nor released: BLPOP alone would wake up to 1 s late.
      String jobs = name("lease-end");
      long before = System.nanoTime();
      c.redsem.semaphore(jobs).limit(1).lease(0.3).autoRefresh(false).acquire();
      long after = System.nanoTime();
      long granted = grantTime(pool,
          c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(5)).build())
          .get(10, TimeUnit.SECONDS);
      assertTrue(granted - before >= 300_000_000L,
          "not before the lease's end: " + ms(granted - before) + " ms after the acquire");
      long late = granted - (after + 300_000_000L);
      assertTrue(late < 150_000_000L, "granted " + ms(late) + " ms after the lease's end");

      // A release: the waiter is told at once.
      String other = name("release");
      Permit holder = c.redsem.semaphore(other).limit(1).acquire();
      Future<Long> waiter = grantTime(pool,
          c.redsem.semaphore(other).limit(1).waitFor(Duration.ofSeconds(5)).build());
      Thread.sleep(300);
      assertFalse(waiter.isDone());
      assertTrue(holder.release());
      long released = System.nanoTime();
      long slow = waiter.get(10, TimeUnit.SECONDS) - released;
      assertTrue(slow < 50_000_000L, "granted " + ms(slow) + " ms after the release's reply");
    } finally {
      pool.shutdownNow();
      raw("CONFIG", "SET", "hz", hz);
    }
  }

  /** The semaphore's keys and the script's, serialized (DUMP), in name order. */
  private static List<String> snapshot(String name) {
    List<String> out = new ArrayList<>();
    List<?> keys = (List<?>) raw("KEYS", name + "*");
    List<String> names = new ArrayList<>();
    for (Object k : keys) {
      names.add(Commands.text(k));
    }
    Collections.sort(names);
    for (String k : names) {
      byte[] dump = (byte[]) raw("DUMP", k);
      out.add(k + "=" + java.util.Base64.getEncoder().encodeToString(dump));
    }
    return out;
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void memoryFullRefusesNewcomersOnly(Kind kind) throws Exception {
    assumeTrue(SCRIPTS, "the script's two texts (the module flags its own commands)");
    String jobs = name("oom");
    String policy = Commands.text(((List<?>) raw("CONFIG", "GET", "maxmemory-policy")).get(1));
    String most = Commands.text(((List<?>) raw("CONFIG", "GET", "maxmemory")).get(1));
    try (Kind.Client c = kind.connect(server.port)) {
      Permit permit = c.redsem.semaphore(jobs).limit(2).autoRefresh(false).acquire();
      try {
        raw("CONFIG", "SET", "maxmemory-policy", "noeviction");
        raw("CONFIG", "SET", "maxmemory", "1");
        assertTrue(permit.refresh(), "a refresh works when memory is full");
        List<String> before = snapshot(jobs);
        for (double wait : new double[] {0, 0.5}) {
          RuntimeException refused = assertThrows(RuntimeException.class,
              () -> c.redsem.semaphore(jobs).limit(2).waitFor(wait).acquire());
          assertFalse(refused instanceof RedsemException, "the server's error: " + refused);
          assertTrue(refused.getMessage().contains(
              "OOM command not allowed when used memory > 'maxmemory'"), refused.getMessage());
        }
        assertEquals(before, snapshot(jobs), "a refused acquire changes nothing");
        assertTrue(permit.release(), "a release works when memory is full");
      } finally {
        raw("CONFIG", "SET", "maxmemory", most);
        raw("CONFIG", "SET", "maxmemory-policy", policy);
      }
      assertEquals(0L, raw("EXISTS", jobs));
    }
  }

  private static long commandCalls(int port, String command) {
    String stats = Commands.text(SemaphoreTest.raw(port, "INFO", "commandstats"));
    for (String line : stats.split("\r\n")) {
      if (line.startsWith("cmdstat_" + command + ":calls=")) {
        return Long.parseLong(line.split("calls=")[1].split(",")[0]);
      }
    }
    return 0;
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void theModuleIsPickedUpLive(Kind kind) throws Exception {
    assumeTrue(SCRIPTS && System.getenv("REDSEM_MODULE") != null,
        "the script's clients, with the module's .so at hand (REDSEM_MODULE)");
    try (RedisServer plain = RedisServer.start(false, "--enable-module-command", "yes")) {
      String jobs = name("live");
      ExecutorService pool = Executors.newFixedThreadPool(2);
      try (Kind.Client a = kind.connect(plain.port)) {
        Permit holder = a.redsem.semaphore(jobs).limit(1).acquire();
        Future<Permit> scriptWaiter = pool.submit(
            () -> a.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(20)).acquire());
        until(() -> Long.valueOf(1).equals(
            SemaphoreTest.raw(plain.port, "ZCARD", jobs + ":line")), "A's waiter in the line");
        assertEquals("OK", Commands.text(
            SemaphoreTest.raw(plain.port, "MODULE", "LOAD", RedisServer.module())));
        try (Kind.Client b = kind.connect(plain.port)) {
          Future<Long> moduleWaiter = pool.submit(() -> {
            Permit permit = b.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(20))
                .acquire();
            long at = System.nanoTime();
            Thread.sleep(200); // A's waiter, told M, waits in the module meanwhile
            permit.release();
            return at;
          });
          // B blocks in the module (a client whose last command is SEM.ACQUIRE, blocked).
          until(() -> Commands.text(SemaphoreTest.raw(plain.port, "CLIENT", "LIST"))
              .contains("cmd=sem.acquire"), "B's wait in the module");
          // (a) A's release goes through the script (A asked less than 10 s ago) and serves
          // B's wait in the module at once.
          long releases = commandCalls(plain.port, "evalsha");
          assertTrue(holder.release());
          long released = System.nanoTime();
          assertTrue(commandCalls(plain.port, "evalsha") > releases, "A's release is a script's");
          long late = moduleWaiter.get(10, TimeUnit.SECONDS) - released;
          assertTrue(late < 100_000_000L, "B granted " + ms(late) + " ms after A's release");
          // (b) A's script waiter is told M and granted by the module after B's release; A is
          // on the module from then on: a BOUND acquire, the module's only, works through A.
          try (Permit granted = scriptWaiter.get(10, TimeUnit.SECONDS)) {
            assertFalse(granted.isLost());
          }
          try (Permit bound = a.redsem.semaphore(name("bound")).bound(true).acquire()) {
            assertFalse(bound.isLost());
          }
        }
      } finally {
        pool.shutdownNow();
      }
    }
  }

  /** Waits (up to 5 s) until {@code done}. */
  private static void until(java.util.function.BooleanSupplier done, String what)
      throws InterruptedException {
    long end = System.nanoTime() + 5_000_000_000L;
    while (!done.getAsBoolean()) {
      assertTrue(System.nanoTime() < end, "not within 5 s: " + what);
      Thread.sleep(5);
    }
  }

  @org.junit.jupiter.api.Test
  void aServerWithoutTheModuleIsAskedAgainAfter10s() throws Exception {
    assumeTrue(SCRIPTS && System.getenv("REDSEM_MODULE") != null,
        "the script's clients, with the module's .so at hand (REDSEM_MODULE)");
    try (RedisServer plain = RedisServer.start(false, "--enable-module-command", "yes");
        Kind.Client jedis = Kind.JEDIS.connect(plain.port);
        Kind.Client lettuce = Kind.LETTUCE.connect(plain.port)) {
      for (Kind.Client c : List.of(jedis, lettuce)) {
        c.redsem.semaphore(name("asked")).acquire().close(); // asked: no module
      }
      long asked = System.nanoTime();
      assertEquals("OK", Commands.text(
          SemaphoreTest.raw(plain.port, "MODULE", "LOAD", RedisServer.module())));
      for (Kind.Client c : List.of(jedis, lettuce)) {
        // Within 10 s the answer stands (BOUND is the module's only).
        assertThrows(ModuleRequired.class,
            () -> c.redsem.semaphore(name("bound")).bound(true).acquire());
      }
      Thread.sleep(Math.max(0, 10_100 - ms(System.nanoTime() - asked)));
      for (Kind.Client c : List.of(jedis, lettuce)) {
        try (Permit bound = c.redsem.semaphore(name("bound")).bound(true).acquire()) {
          assertFalse(bound.isLost());
        }
      }
    }
  }

  private static long connectionsReceived() {
    String stats = Commands.text(raw("INFO", "stats"));
    for (String line : stats.split("\r\n")) {
      if (line.startsWith("total_connections_received:")) {
        return Long.parseLong(line.substring(line.indexOf(':') + 1).trim());
      }
    }
    throw new AssertionError("no total_connections_received in INFO stats");
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void waitsReuseTheirConnections(Kind kind) throws Exception {
    String jobs = name("pool");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      Semaphore waiting = c.redsem.semaphore(jobs).limit(1).waitFor(0.05).build();
      assertThrows(NotAcquired.class, waiting::acquire); // the client's connections, made
      long before = connectionsReceived();
      for (int i = 0; i < 50; i++) {
        long start = System.nanoTime();
        assertThrows(NotAcquired.class, waiting::acquire);
        assertTrue(System.nanoTime() - start >= 45_000_000L, "each wait really blocks");
      }
      // One connection is the INFO's own; the pool holds at most 8 (Jedis's default).
      long made = connectionsReceived() - before - 1;
      assertTrue(made <= 8, made + " connections made for 50 waits");
      assertTrue(holder.release());
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void anInterruptedWaiterLeavesTheLine(Kind kind) throws Exception {
    assumeTrue(SCRIPTS, "the script's line");
    String jobs = name("interrupted");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      AtomicReference<Throwable> failure = new AtomicReference<>();
      Thread waiter = new Thread(() -> {
        try {
          c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(20)).acquire();
        } catch (Throwable e) {
          failure.set(e);
        }
      });
      waiter.start();
      until(() -> Long.valueOf(1).equals(raw("ZCARD", jobs + ":line")), "the waiter in line");
      waiter.interrupt();
      waiter.join(10_000); // Jedis reads on until its BLPOP ends (2.5 s at most)
      assertFalse(waiter.isAlive());
      assertTrue(failure.get() instanceof RedsemException, "the acquire says so: " + failure);
      assertTrue(failure.get().getMessage().contains("interrupted"), failure.get().getMessage());
      assertEquals(0L, raw("EXISTS", jobs + ":line"), "it left the line");
      // The next waiter is served at the release, not after a dead place.
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Long> next = grantTime(pool,
            c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(10)).build());
        until(() -> Long.valueOf(1).equals(raw("ZCARD", jobs + ":line")), "the next in line");
        assertTrue(holder.release());
        long released = System.nanoTime();
        long late = next.get(10, TimeUnit.SECONDS) - released;
        assertTrue(late < 100_000_000L, "granted " + ms(late) + " ms after the release");
      } finally {
        pool.shutdownNow();
      }
      assertEquals(0L, raw("EXISTS", jobs), "nobody holds a permit");
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aWaiterThatDiesLeavesTheLine(Kind kind) throws Exception {
    assumeTrue(SCRIPTS, "the script's line");
    String jobs = name("dead");
    try (Kind.Client c = kind.connect(server.port)) {
      // A lease that ends after the dead waiter's place: it never renews it.
      c.redsem.semaphore(jobs).limit(1).lease(7).autoRefresh(false).acquire();
      List<Object> eval = Script.args(
          List.of("SEM.ACQUIRE", jobs, 1, "30", "ID", "dead", "LINE"), true);
      String[] args = new String[eval.size()];
      for (int i = 0; i < args.length; i++) {
        args[i] = Commands.text(eval.get(i));
      }
      long placed = System.nanoTime();
      List<?> reply = (List<?>) raw(args);
      assertNull(reply.get(0));
      assertEquals(0L, reply.get(2), "the dead waiter is first in line");
      Permit permit = c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(15)).acquire();
      long waited = System.nanoTime() - placed;
      assertTrue(waited < 8_500_000_000L + 300_000_000L,
          "granted " + ms(waited) + " ms after the dead waiter's last attempt");
      assertNull(raw("ZSCORE", jobs, "dead"), "the dead waiter was never granted");
      assertTrue(permit.release());
    }
  }
}
