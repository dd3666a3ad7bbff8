package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
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
import redis.clients.jedis.Jedis;

/**
 * The package against a real server, through Jedis and Lettuce: with the module, or through
 * the script when REDSEM_BACKEND=scripts.
 */
class SemaphoreTest {
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
    return what + "-" + NAMES.incrementAndGet();
  }

  static Object raw(int port, String... args) {
    try (Jedis jedis = new Jedis("127.0.0.1", port)) {
      byte[][] rest = new byte[args.length - 1][];
      for (int i = 1; i < args.length; i++) {
        rest[i - 1] = Commands.bytes(args[i]);
      }
      byte[] command = Commands.bytes(args[0]);
      return jedis.sendCommand(() -> command, rest);
    }
  }

  /** The permits in use: SEM.GET, or the script's GET without the module. */
  private static long inUse(String name) {
    if (!SCRIPTS) {
      return (Long) raw(server.port, "SEM.GET", name);
    }
    List<Object> eval = Script.args(List.of("SEM.GET", name), true);
    try (Jedis jedis = new Jedis("127.0.0.1", server.port)) {
      byte[][] rest = new byte[eval.size() - 1][];
      for (int i = 1; i < eval.size(); i++) {
        rest[i - 1] = Commands.bytes(eval.get(i));
      }
      return (Long) jedis.sendCommand(() -> Commands.bytes("EVAL"), rest);
    }
  }

  private static long zcard(String name) {
    return (Long) raw(server.port, "ZCARD", name);
  }

  private static Object score(String name, String id) {
    return raw(server.port, "ZSCORE", name, id);
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void acquireAndRelease(Kind kind) throws Exception {
    String jobs = name("jobs");
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore semaphore = c.redsem.semaphore(jobs).limit(2).lease(30).build();
      Permit first = semaphore.acquire();
      Permit second = semaphore.acquire();
      assertNotEquals(first.id(), second.id());
      assertEquals(36, first.id().length(), "a UUID v4 made before the first send");
      assertNotNull(score(jobs, first.id()));
      assertEquals(OptionalLong.empty(), first.ticket());
      NotAcquired full = assertThrows(NotAcquired.class, semaphore::acquire);
      assertTrue(full.getMessage().contains(jobs), full.getMessage());
      assertEquals(2, inUse(jobs));
      assertTrue(first.release());
      assertTrue(first.release(), "a second release repeats the answer");
      assertNull(score(jobs, first.id()));
      try (Permit third = semaphore.acquire()) {
        assertFalse(third.isLost());
        third.check();
      }
      second.close();
      assertEquals(0, zcard(jobs));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void tryAcquireTakesAFreePermitOrNoneAndWaitsOnlyWhenAsked(Kind kind) throws Exception {
    String jobs = name("try");
    try (Kind.Client c = kind.connect(server.port)) {
      // The semaphore's own wait is 10 s: tryAcquire() does not wait whatever it says.
      Semaphore semaphore = c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(10))
          .build();
      Optional<Permit> first = semaphore.tryAcquire();
      assertTrue(first.isPresent());
      assertNotNull(score(jobs, first.get().id()));
      long start = System.nanoTime();
      assertEquals(Optional.empty(), semaphore.tryAcquire());
      assertTrue(System.nanoTime() - start < 1_000_000_000L, "no wait");
      start = System.nanoTime();
      assertEquals(Optional.empty(), semaphore.tryAcquire(Duration.ofMillis(300)));
      assertTrue(System.nanoTime() - start >= 250_000_000L, "waited its 300 ms");
      start = System.nanoTime();
      NotAcquired none = assertThrows(NotAcquired.class,
          () -> semaphore.acquire(Duration.ofMillis(200)));
      assertTrue(System.nanoTime() - start >= 150_000_000L, "waited its 200 ms");
      assertTrue(none.getMessage().contains("within 0.200 s"), none.getMessage());
      assertThrows(IllegalArgumentException.class,
          () -> semaphore.tryAcquire(Duration.ofSeconds(-1)));
      assertEquals(1, inUse(jobs), "nothing taken by the refused or empty calls");
      // Released meanwhile: the waiting form takes it.
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Permit held = first.get();
        pool.submit(() -> {
          Thread.sleep(300);
          return held.release();
        });
        Optional<Permit> next = semaphore.tryAcquire(Duration.ofSeconds(5));
        assertTrue(next.isPresent(), "granted at the release");
        assertTrue(next.get().release());
      } finally {
        pool.shutdownNow();
      }
      try (Permit permit = c.redsem.semaphore(name("try-builder")).tryAcquire().orElseThrow()) {
        assertFalse(permit.isLost());
      }
      if (!SCRIPTS) {
        SemaphoreSet set = c.redsem.semaphoreSet().semaphore(name("try-set"), 1)
            .semaphore(jobs, 1).build();
        Optional<PermitSet> both = set.tryAcquire();
        assertTrue(both.isPresent());
        assertEquals(Optional.empty(), set.tryAcquire());
        assertEquals(Optional.empty(), set.tryAcquire(Duration.ofMillis(100)));
        assertThrows(NotAcquired.class, () -> set.acquire(Duration.ofMillis(100)));
        assertTrue(both.get().release());
      }
      assertEquals(0, inUse(jobs));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void anIdentifierGivenRenewsItsPermit(Kind kind) throws Exception {
    String jobs = name("renew");
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore worker = c.redsem.semaphore(jobs).limit(1).id("worker-7").autoRefresh(false).build();
      Permit permit = worker.acquire();
      assertEquals("worker-7", permit.id());
      // A resent acquire with the same identifier renews the holder, no second permit.
      Permit again = worker.acquire();
      assertEquals(1, inUse(jobs));
      assertTrue(again.release());
      assertFalse(permit.release(), "the same holder, already given back");
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void countTakesSeveralPermitsAndReleasesSome(Kind kind) throws Exception {
    String jobs = name("count");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit permit = c.redsem.semaphore(jobs).limit(5).count(3).acquire();
      assertEquals(3, permit.count());
      assertEquals(3, inUse(jobs));
      assertThrows(NotAcquired.class, () -> c.redsem.semaphore(jobs).limit(5).count(3).acquire());
      assertTrue(permit.releaseSome(2));
      assertEquals(1, permit.count());
      assertEquals(1, inUse(jobs));
      assertTrue(permit.release());
      assertEquals(0, inUse(jobs));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void fairTicketsGrowInGrantOrder(Kind kind) throws Exception {
    String printers = name("printers");
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore semaphore =
          c.redsem.semaphore(printers).limit(1).fair(true).lease(10).waitFor(20).build();
      int threads = 6;
      List<Long> grants = new ArrayList<>(); // tickets, in the order the permits were granted
      ExecutorService pool = Executors.newFixedThreadPool(threads);
      try {
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
          done.add(pool.submit(() -> {
            try (Permit permit = semaphore.acquire()) {
              synchronized (grants) {
                grants.add(permit.ticket().getAsLong());
              }
              Thread.sleep(20);
            }
            return null;
          }));
        }
        for (Future<?> f : done) {
          f.get(60, TimeUnit.SECONDS);
        }
      } finally {
        pool.shutdownNow();
      }
      assertEquals(threads, grants.size());
      for (int i = 1; i < grants.size(); i++) {
        assertTrue(grants.get(i) > grants.get(i - 1), "tickets in grant order: " + grants);
      }
    }
  }

  /**
   * A name whose keys went between two fair grants (a DEL of the name, its owner set and its
   * counter, or FLUSHDB), the two most often within one millisecond, still gives the second a
   * ticket above the first, in every round: the script starts again from the server's clock in
   * microseconds, the module above every ticket the node handed out.
   */
  @ParameterizedTest
  @EnumSource(Kind.class)
  void aFairTicketAfterItsKeysWentIsAboveTheOneBefore(Kind kind) throws Exception {
    String fence = name("fence");
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore semaphore = c.redsem.semaphore(fence).limit(1).fair(true).autoRefresh(false).build();
      List<String> repeats = new ArrayList<>();
      for (int round = 0; round < 200; round++) {
        Permit first = semaphore.acquire();
        if (round % 2 == 1) {
          raw(server.port, "FLUSHDB");
        } else {
          raw(server.port, "DEL", fence, fence + ":owner", fence + ":counter");
        }
        Permit second = semaphore.acquire();
        long one = first.ticket().getAsLong();
        long two = second.ticket().getAsLong();
        if (two <= one) {
          repeats.add(round + ": " + one + " then " + two);
        }
        assertFalse(first.release(), "its keys went: lost");
        assertTrue(second.release());
      }
      assertTrue(repeats.isEmpty(), repeats.size() + " of 200 rounds: "
          + repeats.subList(0, Math.min(repeats.size(), 5)));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aWaiterIsServedOnRelease(Kind kind) throws Exception {
    String jobs = name("wait");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).lease(30).acquire();
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Long> waited = pool.submit(() -> {
          long start = System.nanoTime();
          try (Permit permit = c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(20))
              .acquire()) {
            assertFalse(permit.isLost());
            return System.nanoTime() - start;
          }
        });
        Thread.sleep(300);
        assertFalse(waited.isDone(), "the waiter waits while the permit is held");
        long released = System.nanoTime();
        assertTrue(holder.release());
        waited.get(10, TimeUnit.SECONDS);
        long served = System.nanoTime() - released;
        assertTrue(served < 2_000_000_000L, "served " + served / 1_000_000 + " ms after release");
      } finally {
        pool.shutdownNow();
      }
      // A wait that runs out answers NotAcquired.
      try (Permit holder2 = c.redsem.semaphore(jobs).limit(1).acquire()) {
        long start = System.nanoTime();
        assertThrows(NotAcquired.class,
            () -> c.redsem.semaphore(jobs).limit(1).waitFor(0.3).acquire());
        assertTrue(System.nanoTime() - start >= 250_000_000L);
      }
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void threadsNeverOverAdmit(Kind kind) throws Exception {
    String jobs = name("busy");
    int limit = 3;
    int threads = 8;
    int rounds = 8;
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore semaphore =
          c.redsem.semaphore(jobs).limit(limit).lease(10).waitFor(Duration.ofSeconds(30)).build();
      AtomicInteger holding = new AtomicInteger();
      AtomicInteger most = new AtomicInteger();
      AtomicInteger granted = new AtomicInteger();
      ExecutorService pool = Executors.newFixedThreadPool(threads);
      try {
        List<Future<?>> done = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
          done.add(pool.submit(() -> {
            for (int r = 0; r < rounds; r++) {
              try (Permit permit = semaphore.acquire()) {
                int now = holding.incrementAndGet();
                most.accumulateAndGet(now, Math::max);
                assertTrue(inUse(jobs) <= limit);
                Thread.sleep(5);
                holding.decrementAndGet();
                granted.incrementAndGet();
              }
            }
            return null;
          }));
        }
        for (Future<?> f : done) {
          f.get(120, TimeUnit.SECONDS);
        }
      } finally {
        pool.shutdownNow();
      }
      assertEquals(threads * rounds, granted.get());
      assertTrue(most.get() <= limit, "at most " + limit + " at once, saw " + most.get());
      assertEquals(0, zcard(jobs));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void theAsyncFormsComplete(Kind kind) throws Exception {
    String jobs = name("async");
    try (Kind.Client c = kind.connect(server.port)) {
      Semaphore one = c.redsem.semaphore(jobs).limit(1).waitFor(10).build();
      Permit holder = one.acquireAsync().get(10, TimeUnit.SECONDS);
      java.util.concurrent.CompletableFuture<Permit> waiter = one.acquireAsync();
      Thread.sleep(200);
      assertFalse(waiter.isDone());
      assertTrue(holder.releaseAsync().get(10, TimeUnit.SECONDS));
      Permit next = waiter.get(10, TimeUnit.SECONDS);
      assertTrue(next.refreshAsync().get(10, TimeUnit.SECONDS));
      java.util.concurrent.ExecutionException full = assertThrows(
          java.util.concurrent.ExecutionException.class,
          () -> c.redsem.semaphore(jobs).limit(1).build().acquireAsync().get(10, TimeUnit.SECONDS));
      assertTrue(full.getCause() instanceof NotAcquired, full.toString());
      if (!SCRIPTS) {
        java.util.concurrent.CompletableFuture<Boolean> drained =
            c.redsem.waitEmptyAsync(jobs, Duration.ofSeconds(10));
        assertTrue(next.release());
        assertTrue(drained.get(10, TimeUnit.SECONDS));
      } else {
        assertTrue(next.release());
      }
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aPermitRemovedByHandIsReportedLost(Kind kind) throws Exception {
    String jobs = name("lost");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit permit = c.redsem.semaphore(jobs).limit(1).lease(0.9).acquire();
      CountDownLatch heard = new CountDownLatch(1);
      AtomicReference<PermitLost> told = new AtomicReference<>();
      permit.onLost(lost -> {
        told.set(lost);
        heard.countDown();
      });
      assertFalse(permit.isLost());
      assertEquals(1L, raw(server.port, "ZREM", jobs, permit.id()));
      assertTrue(heard.await(5, TimeUnit.SECONDS), "the background refresh finds it lost");
      assertTrue(told.get().getMessage().contains(permit.id()), told.get().getMessage());
      assertTrue(permit.isLost());
      assertThrows(PermitLost.class, permit::check);
      // A listener added later hears it at once.
      AtomicInteger late = new AtomicInteger();
      permit.onLost(lost -> late.incrementAndGet());
      assertEquals(1, late.get());
      assertThrows(PermitLost.class, permit::close);
      assertFalse(permit.release());
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void refreshMovesTheDeadline(Kind kind) throws Exception {
    String jobs = name("refresh");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit manual = c.redsem.semaphore(jobs).limit(2).lease(1).autoRefresh(false).acquire();
      double before = Double.parseDouble(Commands.text(score(jobs, manual.id())));
      Thread.sleep(50);
      assertTrue(manual.refresh());
      double after = Double.parseDouble(Commands.text(score(jobs, manual.id())));
      assertTrue(after > before, "the deadline moved: " + before + " -> " + after);
      // The background refresh keeps a short lease alive for longer than the lease.
      Permit kept = c.redsem.semaphore(jobs).limit(2).lease(0.6).acquire();
      Thread.sleep(1500);
      assertFalse(kept.isLost());
      assertNotNull(score(jobs, kept.id()));
      assertTrue(kept.release());
      // Without refreshes the manual one ran out.
      assertFalse(manual.refresh());
      assertTrue(manual.isLost());
      assertFalse(manual.release());
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void setsAndWaitEmpty(Kind kind) throws Exception {
    String gpu = name("gpu");
    String licence = name("licence");
    try (Kind.Client c = kind.connect(server.port)) {
      SemaphoreSet.Builder pair = c.redsem.semaphoreSet()
          .semaphore(gpu, 1).semaphore(licence, 5, 2).lease(30).fair(true);
      if (SCRIPTS) {
        ModuleRequired set = assertThrows(ModuleRequired.class, pair::acquire);
        assertEquals("SEM.ACQUIREALL", set.what());
        assertThrows(ModuleRequired.class, () -> c.redsem.waitEmpty(gpu, 1));
        assertThrows(ModuleRequired.class,
            () -> c.redsem.semaphore(gpu).bound(true).acquire());
        assertEquals(0, zcard(gpu), "nothing was taken");
        return;
      }
      PermitSet permits = pair.acquire();
      assertEquals(List.of(gpu, licence), permits.names());
      assertEquals(List.of(1L, 2L), permits.counts());
      List<Long> tickets = permits.tickets().orElseThrow();
      assertEquals(2, tickets.size());
      assertEquals(2L, inUse(licence));
      assertThrows(NotAcquired.class, () -> c.redsem.semaphoreSet()
          .semaphore(gpu, 1).semaphore(licence, 5).fair(true).acquire());
      assertEquals(2L, inUse(licence), "all or none");
      assertFalse(c.redsem.waitEmpty(gpu, 0.2), "held: the wait times out");
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Boolean> drained = pool.submit(() -> c.redsem.waitEmpty(gpu, Duration.ofSeconds(10)));
        Thread.sleep(200);
        assertFalse(drained.isDone());
        assertTrue(permits.release());
        assertTrue(drained.get(5, TimeUnit.SECONDS));
      } finally {
        pool.shutdownNow();
      }
      assertTrue(c.redsem.waitEmpty(gpu, 0), "empty: true at once");
      // A bound permit: given back when its connection closes; here, released.
      try (Permit bound = c.redsem.semaphore(gpu).bound(true).acquire()) {
        assertEquals(1L, inUse(gpu));
      }
      assertEquals(0L, inUse(gpu));
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void theStoredLimitRulesEveryAcquire(Kind kind) throws Exception {
    String reports = name("reports");
    try (Kind.Client c = kind.connect(server.port)) {
      assertEquals(OptionalLong.empty(), c.redsem.storedLimit(reports));
      c.redsem.setLimit(reports, 0);
      assertThrows(NotAcquired.class, () -> c.redsem.semaphore(reports).limit(10).acquire());
      assertEquals(OptionalLong.of(0), c.redsem.storedLimit(reports));
      c.redsem.setLimit(reports, 2);
      Semaphore ten = c.redsem.semaphore(reports).limit(10).build();
      Permit a = ten.acquire();
      Permit b = ten.acquire();
      assertThrows(NotAcquired.class, ten::acquire);
      assertTrue(c.redsem.clearLimit(reports));
      assertFalse(c.redsem.clearLimit(reports));
      assertEquals(OptionalLong.empty(), c.redsem.storedLimit(reports));
      ten.acquire().close();
      a.close();
      b.close();
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void tooFewReplicasGiveThePermitBack(Kind kind) throws Exception {
    String jobs = name("durable");
    try (Kind.Client c = kind.connect(server.port)) {
      NotDurable error = assertThrows(NotDurable.class, () -> c.redsem.semaphore(jobs).limit(1)
          .durableReplicas(1).durableTimeout(Duration.ofMillis(100)).acquire());
      assertEquals(0, error.acked());
      assertEquals(1, error.wanted());
      assertEquals(0, zcard(jobs), "the permit was given back");
      // With no replica wanted, the same acquire is granted.
      c.redsem.semaphore(jobs).limit(1).acquire().close();
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void badInputIsRefusedBeforeAnythingIsSent(Kind kind) throws Exception {
    // Nothing listens on this port: a command sent would fail with a connection error.
    int nobody = RedisServer.freePort();
    try (Kind.Client c = kind.connect(nobody)) {
      Redsem r = c.redsem;
      Map<String, Runnable> refused = new java.util.LinkedHashMap<>();
      refused.put("lease", () -> r.semaphore("a").lease(0));
      refused.put("lease ", () -> r.semaphore("a").lease(-1));
      refused.put("lease  ", () -> r.semaphore("a").lease(Double.NaN));
      refused.put("lease   ", () -> r.semaphore("a").lease(Double.POSITIVE_INFINITY));
      refused.put("lease    ", () -> r.semaphore("a").lease(Duration.ZERO));
      refused.put("limit", () -> r.semaphore("a").limit(0));
      refused.put("limit ", () -> r.semaphore("a").limit(4294967296L));
      refused.put("count", () -> r.semaphore("a").count(0));
      refused.put("count ", () -> r.semaphore("a").limit(2).count(3).build());
      refused.put("wait", () -> r.semaphore("a").waitFor(-1));
      refused.put("wait ", () -> r.semaphore("a").waitFor(Double.NaN));
      refused.put("wait  ", () -> r.semaphore("a").waitFor(Duration.ofSeconds(-1)));
      refused.put("name", () -> r.semaphore(""));
      refused.put("id", () -> r.semaphore("a").id(""));
      refused.put("durableReplicas", () -> r.semaphore("a").durableReplicas(-1));
      refused.put("timeout", () -> r.waitEmpty("a", -1));
      refused.put("limit  ", () -> r.setLimit("a", -1));
      refused.put("name ", () -> r.storedLimit(""));
      refused.put("count  ", () -> r.semaphoreSet().semaphore("a", 2, 3));
      refused.put("twice", () -> r.semaphoreSet().semaphore("a", 2).semaphore("a", 2));
      refused.put("semaphores", () -> r.semaphoreSet().build());
      for (Map.Entry<String, Runnable> e : refused.entrySet()) {
        IllegalArgumentException error =
            assertThrows(IllegalArgumentException.class, e.getValue()::run, e.getKey());
        assertTrue(error.getMessage().contains(e.getKey().trim()),
            "the message names " + e.getKey().trim() + ": " + error.getMessage());
      }
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void absurdDurationsAreRefusedByName(Kind kind) throws Exception {
    // Nothing listens on this port: a command sent would fail with a connection error.
    int nobody = RedisServer.freePort();
    Duration forever = Duration.ofSeconds(Long.MAX_VALUE);
    try (Kind.Client c = kind.connect(nobody)) {
      Redsem r = c.redsem;
      Map<String, Runnable> refused = new java.util.LinkedHashMap<>();
      refused.put("lease", () -> r.semaphore("a").lease(Double.NEGATIVE_INFINITY));
      refused.put("lease ", () -> r.semaphore("a").lease(31536000.001));
      refused.put("lease  ", () -> r.semaphore("a").lease(Duration.ofDays(366)));
      refused.put("lease   ", () -> r.semaphore("a").lease(forever));
      refused.put("lease    ", () -> r.semaphore("a").lease(Duration.ofSeconds(-1)));
      refused.put("lease     ", () -> r.semaphoreSet().lease(Double.NaN));
      refused.put("wait", () -> r.semaphore("a").waitFor(Double.NEGATIVE_INFINITY));
      refused.put("wait ", () -> r.semaphore("a").waitFor(1e12));
      refused.put("wait  ", () -> r.semaphore("a").waitFor(forever));
      refused.put("wait   ", () -> r.semaphoreSet().waitFor(Double.NaN));
      refused.put("durableTimeout", () -> r.semaphore("a").durableTimeout(forever));
      refused.put("durableTimeout ", () -> r.semaphore("a").durableTimeout(Duration.ofMillis(-1)));
      refused.put("retryFor", () -> r.semaphore("a").retryFor(forever));
      refused.put("retryFor ", () -> r.semaphoreSet().retryFor(Duration.ofSeconds(-1)));
      refused.put("retryFor  ", () -> r.withRetryFor(forever));
      refused.put("retryFor   ", () -> r.withRetryFor(null));
      refused.put("timeout", () -> r.waitEmpty("a", Double.NaN));
      refused.put("timeout ", () -> r.waitEmpty("a", Duration.ofSeconds(-1)));
      refused.put("timeout  ", () -> r.waitEmptyAsync("a", forever));
      for (Map.Entry<String, Runnable> e : refused.entrySet()) {
        IllegalArgumentException error =
            assertThrows(IllegalArgumentException.class, e.getValue()::run, e.getKey());
        assertTrue(error.getMessage().contains(e.getKey().trim()),
            "the message names " + e.getKey().trim() + ": " + error.getMessage());
      }
      // The longest of each, and waiting without limit, are taken.
      r.semaphore("a").lease(31536000).lease(Duration.ofDays(365)).waitFor(31536000)
          .waitFor(Double.POSITIVE_INFINITY).durableTimeout(Duration.ofDays(365))
          .retryFor(Duration.ofDays(365)).build();
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aNewClientAfterModuleLoadUsesTheModule(Kind kind) throws Exception {
    RedisServer.assumeModule();
    try (RedisServer plain = RedisServer.start(false, "--enable-module-command", "yes")) {
      String jobs = name("migrate");
      try (Kind.Client before = kind.connect(plain.port)) {
        Permit old = before.redsem.semaphore(jobs).limit(2).acquire();
        assertThrows(ModuleRequired.class, () -> before.redsem.waitEmpty(jobs, 0));
        assertEquals("OK", Commands.text(raw(plain.port, "MODULE", "LOAD", RedisServer.module())));
        try (Kind.Client after = kind.connect(plain.port)) {
          // The module reads the keys the script wrote: the old permit counts.
          assertEquals(1L, raw(plain.port, "SEM.GET", jobs));
          assertFalse(after.redsem.waitEmpty(jobs, 0.1), "the new client speaks to the module");
          Permit fresh = after.redsem.semaphore(jobs).limit(2).bound(true).acquire();
          assertThrows(NotAcquired.class, () -> after.redsem.semaphore(jobs).limit(2).acquire());
          assertTrue(old.release());
          assertTrue(fresh.release());
          assertTrue(after.redsem.waitEmpty(jobs, 0));
        }
      }
    }
  }
}
