package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLongArray;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import redis.clients.jedis.Jedis;

/**
 * The package at an application's scale, with each client's default settings (Jedis: a pool
 * of 8): 10,000 permits held at once cost no connection and no thread, and are refreshed
 * through a lease; 200 waiters of one name are served in arrival order while a holder's
 * release and the application's own calls answer at once.
 */
class ScaleTest {
  private static RedisServer server;
  private static Jedis admin; // the test's own connection, for INFO
  private static final AtomicInteger RUNS = new AtomicInteger();

  @BeforeAll
  static void start() throws Exception {
    server = RedisServer.start();
    admin = new Jedis("127.0.0.1", server.port);
  }

  @AfterAll
  static void stop() {
    if (admin != null) {
      admin.close();
    }
    if (server != null) {
      server.close();
    }
  }

  private static long info(String section, String field) {
    for (String line : admin.info(section).split("\r\n")) {
      if (line.startsWith(field + ":")) {
        return Long.parseLong(line.substring(field.length() + 1).trim());
      }
    }
    throw new AssertionError("no " + field + " in INFO " + section);
  }

  private static long heapUsed() throws InterruptedException {
    for (int i = 0; i < 3; i++) {
      System.gc();
      Thread.sleep(50);
    }
    return ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed();
  }

  /** The threads of redsem's refresh: its timer and its refresh threads. */
  private static int refreshThreads() {
    int count = 0;
    for (Thread t : Thread.getAllStackTraces().keySet()) {
      if (t.getName().startsWith("redsem-refresh")) {
        count++;
      }
    }
    return count;
  }

  private static long median(List<Long> xs) {
    List<Long> sorted = new ArrayList<>(xs);
    Collections.sort(sorted);
    return sorted.get(sorted.size() / 2);
  }

  private static long ms(long nanos) {
    return nanos / 1_000_000;
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void tenThousandPermitsHeldCostNoConnectionNorThread(Kind kind) throws Exception {
    int n = 10_000;
    Duration lease = Duration.ofSeconds(6); // refreshed every 2 s: rounds within the test
    String prefix = "scale-held-" + RUNS.incrementAndGet() + "-";
    ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    try (Kind.Client c = kind.connect(server.port)) {
      // The client's own connections and redsem's threads, made before counting.
      c.redsem.semaphore(prefix + "warm").acquire().release();
      c.get("scale-key");
      Thread.sleep(200); // the threads of an earlier test gone
      long clients = info("clients", "connected_clients");
      int threadsBefore = threads.getThreadCount();
      long heapBefore = heapUsed();

      List<Permit> held = new ArrayList<>(n);
      long started = System.nanoTime();
      for (int i = 0; i < n; i++) {
        held.add(c.redsem.semaphore(prefix + i).limit(5).lease(lease).acquire());
      }
      long lastAcquired = System.nanoTime();
      long heapHeld = heapUsed();
      System.err.printf("scale %s: %d permits acquired in %d ms, %d bytes per held permit%n",
          kind, n, ms(lastAcquired - started), (heapHeld - heapBefore) / n);

      // Hold through a lease and more after the last acquire: every permit is refreshed.
      long until = lastAcquired + lease.toNanos() + 1_000_000_000L;
      long slowest = 0;
      int calls = 0;
      long mostClients = 0;
      int mostThreads = 0;
      int mostRefreshThreads = 0;
      while (System.nanoTime() < until) {
        long at = System.nanoTime();
        c.get("scale-key");
        slowest = Math.max(slowest, System.nanoTime() - at);
        calls++;
        mostClients = Math.max(mostClients, info("clients", "connected_clients"));
        mostThreads = Math.max(mostThreads, threads.getThreadCount());
        mostRefreshThreads = Math.max(mostRefreshThreads, refreshThreads());
        Thread.sleep(50);
      }
      System.err.printf("scale %s: %d app GETs while holding, slowest %d ms; connections %d -> "
          + "at most %d; threads %d -> at most %d, of which refresh threads %d%n", kind, calls,
          ms(slowest), clients, mostClients, threadsBefore, mostThreads, mostRefreshThreads);
      assertTrue(slowest < 1_000_000_000L, "the app's GET took " + ms(slowest) + " ms");
      // The Jedis pool may open the rest of its 8; Lettuce adds none.
      assertTrue(mostClients <= clients + 8,
          "connections " + clients + " -> " + mostClients + " while holding " + n + " permits");
      // One timer and the fixed refresh threads, whatever the number of permits.
      assertTrue(mostRefreshThreads <= 1 + Refresher.REFRESH_THREADS,
          mostRefreshThreads + " refresh threads while holding " + n + " permits");
      assertTrue(mostThreads <= threadsBefore + Refresher.REFRESH_THREADS + 2,
          "threads " + threadsBefore + " -> " + mostThreads + " while holding " + n + " permits");
      long perPermit = (heapHeld - heapBefore) / n;
      assertTrue(perPermit <= 4096, perPermit + " bytes per held permit");

      int lost = 0;
      for (Permit p : held) {
        if (!p.release()) {
          lost++;
        }
      }
      assertEquals(0, lost, "permits lost through " + ms(System.nanoTime() - started) + " ms");
      assertEquals(0, admin.keys(prefix + "*").size(), "nothing left held");
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void twoHundredWaitersAreServedInOrder(Kind kind) throws Exception {
    int n = 200;
    String jobs = "scale-wait-" + RUNS.incrementAndGet();
    ExecutorService pool = Executors.newFixedThreadPool(n);
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      Semaphore waiting = c.redsem.semaphore(jobs).limit(1)
          .waitFor(Duration.ofSeconds(10)).build();
      AtomicInteger served = new AtomicInteger();
      AtomicLongArray order = new AtomicLongArray(n);
      List<Long> releases = Collections.synchronizedList(new ArrayList<>());
      long blocked = info("clients", "blocked_clients");
      List<Future<?>> done = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        int arrival = i;
        done.add(pool.submit(() -> {
          Permit permit = waiting.acquire();
          order.set(served.getAndIncrement(), arrival);
          Thread.sleep(20);
          long at = System.nanoTime();
          assertTrue(permit.release());
          releases.add(System.nanoTime() - at);
          return null;
        }));
        // The next arrives once this one waits in the server.
        long deadline = System.nanoTime() + 5_000_000_000L;
        while (info("clients", "blocked_clients") < blocked + i + 1) {
          if (System.nanoTime() > deadline) {
            fail("waiter " + i + " never reached the server: "
                + info("clients", "blocked_clients") + " blocked");
          }
          Thread.sleep(1);
        }
      }
      // The holder's release and the application's GETs answer while 200 wait.
      List<Long> gets = new ArrayList<>();
      for (int i = 0; i < 20; i++) {
        long at = System.nanoTime();
        c.get("scale-key");
        gets.add(System.nanoTime() - at);
      }
      long at = System.nanoTime();
      assertTrue(holder.release());
      long holderRelease = System.nanoTime() - at;
      // And while they are served.
      while (served.get() < n && System.nanoTime() - at < 15_000_000_000L) {
        long t = System.nanoTime();
        c.get("scale-key");
        gets.add(System.nanoTime() - t);
        Thread.sleep(10);
      }
      for (Future<?> f : done) {
        f.get(15, TimeUnit.SECONDS);
      }
      List<Long> released = new ArrayList<>(releases);
      System.err.printf("waiters %s: %d served in %d ms; the holder's release %d ms; the "
          + "waiters' releases: median %d ms, slowest %d ms; %d app GETs: median %d ms, slowest "
          + "%d ms%n", kind, served.get(), ms(System.nanoTime() - at), ms(holderRelease),
          ms(median(released)), ms(Collections.max(released)), gets.size(), ms(median(gets)),
          ms(Collections.max(gets)));
      assertEquals(n, served.get());
      for (int i = 0; i < n; i++) {
        assertEquals(i, order.get(i), "the " + i + "th grant went to arrival " + order.get(i));
      }
      // Milliseconds as a rule; a busy machine may stall one call, never for a wait's time.
      assertTrue(holderRelease < 1_000_000_000L, "the holder's release: " + ms(holderRelease));
      assertTrue(median(released) < 50_000_000L, "releases: median " + ms(median(released)));
      assertTrue(Collections.max(released) < 1_000_000_000L,
          "a release: " + ms(Collections.max(released)) + " ms");
      assertTrue(median(gets) < 50_000_000L, "the app's GETs: median " + ms(median(gets)));
      assertTrue(Collections.max(gets) < 1_000_000_000L,
          "the app's GET: " + ms(Collections.max(gets)) + " ms");
    } finally {
      pool.shutdownNow();
    }
  }
}
