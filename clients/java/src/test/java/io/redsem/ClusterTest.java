package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.OptionalLong;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.condition.EnabledIfEnvironmentVariable;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisCluster;

/**
 * Redis Cluster through JedisCluster and Lettuce's RedisClusterClient, on a local cluster of 3
 * primaries with a replica each (scripts/test-cluster): REDSEM_CLUSTER=module (the module on
 * every node), filter0 (the module without its command filter: only the long form is taken),
 * scripts (no module: the script). Skipped when REDSEM_CLUSTER is unset.
 */
@EnabledIfEnvironmentVariable(named = "REDSEM_CLUSTER", matches = "module|filter0|scripts")
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class ClusterTest {
  private static final String MODE = System.getenv("REDSEM_CLUSTER");
  private static final boolean SCRIPTS = "scripts".equals(MODE);
  private static final AtomicInteger NAMES = new AtomicInteger();
  private static Path dir;
  private static int seedPort;

  enum ClusterKind {
    JEDIS_CLUSTER,
    LETTUCE_CLUSTER;

    Kind.Client connect() {
      if (this == JEDIS_CLUSTER) {
        JedisCluster jedis = new JedisCluster(Set.of(new HostAndPort("127.0.0.1", seedPort)));
        return new Kind.Client(Redsem.of(jedis), jedis);
      }
      RedisClusterClient lettuce = RedisClusterClient.create(RedisURI.builder()
          .withHost("127.0.0.1").withPort(seedPort).withTimeout(Duration.ofSeconds(10)).build());
      Redsem redsem = Redsem.of(lettuce);
      return new Kind.Client(redsem, () -> {
        redsem.close();
        lettuce.shutdown();
      });
    }
  }

  static String cluster(String... args) throws IOException, InterruptedException {
    List<String> command = new ArrayList<>();
    command.add(System.getenv().getOrDefault("REDSEM_TEST_CLUSTER", "../../scripts/test-cluster"));
    command.addAll(List.of(args));
    Process p = new ProcessBuilder(command).redirectErrorStream(false).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    String err = new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8);
    if (p.waitFor() != 0) {
      throw new IOException("test-cluster " + String.join(" ", args) + " failed: " + out + err);
    }
    return out;
  }

  /** The primaries of the cluster as test-cluster describes it: port, and its slot ranges. */
  static List<int[]> primaries(String json) {
    List<int[]> out = new ArrayList<>();
    Matcher node = Pattern.compile("\\{[^{}]*?\"port\": (\\d+)[^{}]*?\"alive\": (true|false)"
        + "[^{}]*?\"primary\": (true|false), \"slots\": \\[((?:\\[\\d+, \\d+\\](?:, )?)*)\\]")
        .matcher(json);
    while (node.find()) {
      if (!node.group(2).equals("true") || !node.group(3).equals("true")) {
        continue;
      }
      List<Integer> fields = new ArrayList<>();
      fields.add(Integer.parseInt(node.group(1)));
      Matcher range = Pattern.compile("\\[(\\d+), (\\d+)\\]").matcher(node.group(4));
      while (range.find()) {
        fields.add(Integer.parseInt(range.group(1)));
        fields.add(Integer.parseInt(range.group(2)));
      }
      out.add(fields.stream().mapToInt(Integer::intValue).toArray());
    }
    return out;
  }

  /** The port of the live primary serving {@code slot}. */
  static int ownerOf(int slot) throws Exception {
    for (int[] p : primaries(cluster("nodes", dir.toString()))) {
      for (int i = 1; i + 1 < p.length; i += 2) {
        if (p[i] <= slot && slot <= p[i + 1]) {
          return p[0];
        }
      }
    }
    throw new IllegalStateException("no primary serves slot " + slot);
  }

  @BeforeAll
  static void start() throws Exception {
    dir = Files.createTempDirectory("redsem-java-cluster-");
    List<String> args = new ArrayList<>(List.of("start", dir.toString(), "--server",
        RedisServer.binary(), "--primaries", "3", "--replicas", "1"));
    if (!SCRIPTS) {
      RedisServer.assumeModule();
    }
    switch (MODE) {
      case "module":
        args.addAll(List.of("--module", RedisServer.module()));
        break;
      case "filter0":
        args.addAll(List.of("--module", RedisServer.module(), "--module-arg", "command-filter",
            "--module-arg", "0"));
        break;
      default:
        args.add("--modules-later");
    }
    String json = cluster(args.toArray(new String[0]));
    seedPort = primaries(json).get(0)[0];
  }

  @AfterAll
  static void stop() throws Exception {
    if (dir != null) {
      cluster("stop", dir.toString());
    }
  }

  private static String name(String what) {
    return "{" + what + "-" + NAMES.incrementAndGet() + "}";
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(1)
  void permitsOnTheSlotsPrimary(ClusterKind kind) throws Exception {
    String jobs = name("jobs");
    try (Kind.Client c = kind.connect()) {
      assertTrue(c.redsem.isCluster());
      Semaphore semaphore = c.redsem.semaphore(jobs).limit(2).lease(10).build();
      Permit a = semaphore.acquire();
      Permit b = semaphore.acquire();
      assertThrows(NotAcquired.class, semaphore::acquire);
      int owner = ownerOf(Commands.slot(jobs));
      assertEquals(2L, SemaphoreTest.raw(owner, "ZCARD", jobs), "the keys on the slot's primary");
      assertTrue(a.refresh());
      assertTrue(a.release());
      // A waiter is served on release.
      Permit c2 = semaphore.acquire();
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Permit> waiter = pool.submit(
            () -> c.redsem.semaphore(jobs).limit(2).lease(10).waitFor(10).acquire());
        Thread.sleep(100);
        assertFalse(waiter.isDone());
        assertTrue(b.release());
        Permit served = waiter.get(10, TimeUnit.SECONDS);
        assertTrue(served.release());
        assertTrue(c2.release());
      } finally {
        pool.shutdownNow();
      }
      // Fair tickets grow.
      Semaphore fair = c.redsem.semaphore(name("fair")).limit(3).fair(true).build();
      long last = 0;
      for (int i = 0; i < 3; i++) {
        try (Permit p = fair.acquire()) {
          assertTrue(p.ticket().getAsLong() > last);
          last = p.ticket().getAsLong();
        }
      }
      // The stored limit.
      String reports = name("reports");
      c.redsem.setLimit(reports, 0);
      assertEquals(OptionalLong.of(0), c.redsem.storedLimit(reports));
      assertThrows(NotAcquired.class, () -> c.redsem.semaphore(reports).limit(5).acquire());
      assertTrue(c.redsem.clearLimit(reports));
      c.redsem.semaphore(reports).limit(5).acquire().close();
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(2)
  void namesMustKeepTheirKeysInOneSlot(ClusterKind kind) throws Exception {
    try (Kind.Client c = kind.connect()) {
      IllegalArgumentException error =
          assertThrows(IllegalArgumentException.class, () -> c.redsem.semaphore("jobs").build());
      assertTrue(error.getMessage().startsWith(
          "in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{jobs}\""),
          error.getMessage());
      error = assertThrows(IllegalArgumentException.class,
          () -> c.redsem.semaphoreSet().semaphore("{a}", 1).semaphore("{b}", 1).build());
      assertTrue(error.getMessage().contains("(\"{a}\" is in slot 15495, \"{b}\" in slot 3300)"),
          error.getMessage());
      assertThrows(IllegalArgumentException.class, () -> c.redsem.waitEmpty("jobs", 0));
      assertThrows(IllegalArgumentException.class, () -> c.redsem.storedLimit("jobs"));
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(3)
  void setsAndWaitEmpty(ClusterKind kind) throws Exception {
    String tag = name("app");
    try (Kind.Client c = kind.connect()) {
      SemaphoreSet.Builder pair = c.redsem.semaphoreSet()
          .semaphore(tag + "gpu", 1).semaphore(tag + "licence", 5, 2).fair(true);
      if (SCRIPTS) {
        assertThrows(ModuleRequired.class, pair::acquire);
        assertThrows(ModuleRequired.class, () -> c.redsem.waitEmpty(tag + "gpu", 0));
        return;
      }
      PermitSet permits = pair.acquire();
      assertEquals(2, permits.tickets().orElseThrow().size());
      assertFalse(c.redsem.waitEmpty(tag + "gpu", 0.1));
      assertTrue(permits.refresh());
      assertTrue(permits.release());
      assertTrue(c.redsem.waitEmpty(tag + "gpu", 1));
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(3)
  void theScriptsLineOnTheSlotsPrimary(ClusterKind kind) throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(SCRIPTS, "the script's line");
    String jobs = name("line");
    int owner = ownerOf(Commands.slot(jobs));
    try (Kind.Client c = kind.connect()) {
      ExecutorService pool = Executors.newFixedThreadPool(4);
      try {
        // First come, first served: the line and the waiters' lists on the slot's primary.
        Permit holder = c.redsem.semaphore(jobs).limit(1).fair(true).acquire();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        List<Future<?>> done = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
          int arrival = i;
          done.add(pool.submit(() -> {
            Permit p = c.redsem.semaphore(jobs).limit(1).fair(true).waitFor(20).acquire();
            order.add(arrival);
            assertTrue(p.release());
            return null;
          }));
          long until = System.nanoTime() + 5_000_000_000L;
          while (!Long.valueOf(i + 1).equals(SemaphoreTest.raw(owner, "ZCARD", jobs + ":line"))) {
            assertTrue(System.nanoTime() < until, "waiter " + i + " not in line within 5 s");
            Thread.sleep(5);
          }
        }
        assertTrue(holder.release());
        for (Future<?> f : done) {
          f.get(30, TimeUnit.SECONDS);
        }
        assertEquals(List.of(0, 1, 2, 3), order, "granted in arrival order");

        // A lease's end: the TICK goes to the slot's primary, on another connection.
        String ends = name("lease-end");
        c.redsem.semaphore(ends).limit(1).lease(0.3).autoRefresh(false).acquire();
        long after = System.nanoTime();
        Future<Long> waiter = pool.submit(() -> {
          Permit p = c.redsem.semaphore(ends).limit(1).waitFor(5).acquire();
          long at = System.nanoTime();
          p.release();
          return at;
        });
        long late = waiter.get(10, TimeUnit.SECONDS) - (after + 300_000_000L);
        assertTrue(late < 150_000_000L, "granted " + late / 1_000_000 + " ms after the lease end");
      } finally {
        pool.shutdownNow();
      }
    }
  }

  private static long connectionsReceived(int port) {
    String stats = Commands.text(SemaphoreTest.raw(port, "INFO", "stats"));
    Matcher m = Pattern.compile("total_connections_received:(\\d+)").matcher(stats);
    assertTrue(m.find(), stats);
    return Long.parseLong(m.group(1));
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(3)
  void waitsReuseTheNodesConnections(ClusterKind kind) throws Exception {
    String jobs = name("pool");
    int owner = ownerOf(Commands.slot(jobs));
    try (Kind.Client c = kind.connect()) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      Semaphore waiting = c.redsem.semaphore(jobs).limit(1).waitFor(0.05).build();
      assertThrows(NotAcquired.class, waiting::acquire); // the node's connections, made
      long before = connectionsReceived(owner);
      for (int i = 0; i < 20; i++) {
        long start = System.nanoTime();
        assertThrows(NotAcquired.class, waiting::acquire);
        assertTrue(System.nanoTime() - start >= 45_000_000L, "each wait really blocks");
      }
      // One connection is the INFO's own; a node's pool holds at most 8 (Jedis's default).
      long made = connectionsReceived(owner) - before - 1;
      assertTrue(made <= 8, made + " connections made for 20 waits");
      assertTrue(holder.release());
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(4)
  void aReshardUnderLoad(ClusterKind kind) throws Exception {
    String moving = name("move");
    int slot = Commands.slot(moving);
    int limit = 2;
    try (Kind.Client c = kind.connect()) {
      // A lease longer than the move: no call gets through while the slot's keys are split.
      Semaphore semaphore = c.redsem.semaphore(moving).limit(limit).fair(true).lease(20)
          .waitFor(Duration.ofSeconds(20)).build();
      // Keys of the slot beside the semaphore's, so the move takes a while key by key.
      int owner = ownerOf(slot);
      for (int i = 0; i < 30; i++) {
        SemaphoreTest.raw(owner, "SET", moving + ":pad" + i, "x");
      }
      AtomicBoolean running = new AtomicBoolean(true);
      AtomicInteger holding = new AtomicInteger();
      AtomicInteger most = new AtomicInteger();
      List<Long> tickets = Collections.synchronizedList(new ArrayList<>());
      ExecutorService pool = Executors.newFixedThreadPool(4);
      List<Future<Integer>> workers = new ArrayList<>();
      try {
        for (int t = 0; t < 4; t++) {
          workers.add(pool.submit(() -> {
            int grants = 0;
            while (running.get()) {
              try (Permit permit = semaphore.acquire()) {
                most.accumulateAndGet(holding.incrementAndGet(), Math::max);
                tickets.add(permit.ticket().getAsLong());
                Thread.sleep(10);
                holding.decrementAndGet();
                grants++;
              }
            }
            return grants;
          }));
        }
        Thread.sleep(300);
        int target = 0;
        for (int[] p : primaries(cluster("nodes", dir.toString()))) {
          if (p[0] != owner) {
            target = p[0];
            break;
          }
        }
        cluster("move", dir.toString(), String.valueOf(slot), String.valueOf(target),
            "--pause-ms", "30");
        assertEquals(target, ownerOf(slot));
        Thread.sleep(300);
        running.set(false);
        int total = 0;
        for (Future<Integer> w : workers) {
          total += w.get(60, TimeUnit.SECONDS); // no worker failed
        }
        assertTrue(total > 0);
      } finally {
        running.set(false);
        pool.shutdownNow();
      }
      assertTrue(most.get() <= limit, "at most " + limit + " at once, saw " + most.get());
      assertEquals(tickets.size(), Set.copyOf(tickets).size(), "no ticket twice");
      assertEquals(0L, SemaphoreTest.raw(ownerOf(slot), "EXISTS", moving), "all given back");
    }
  }

  /** The README's cluster examples (ReadmeTest checks that the README shows these lines). */
  @org.junit.jupiter.api.Test
  @Order(5)
  void readmeExamples() throws Exception {
    JedisCluster cluster = new JedisCluster(Set.of(new HostAndPort("127.0.0.1", seedPort)));
    Redsem redsem = Redsem.of(cluster);
    try (Permit permit = redsem.semaphore("{jobs}").limit(3).acquire()) {
      // every call went to the primary serving the slot of "{jobs}"
      assertEquals(1L, SemaphoreTest.raw(ownerOf(Commands.slot("{jobs}")), "ZCARD", "{jobs}"));
    }
    cluster.close();

    RedisClusterClient lettuce = RedisClusterClient.create("redis://127.0.0.1:" + seedPort);
    try (Redsem lettuceRedsem = Redsem.of(lettuce)) {
      redsem = lettuceRedsem;
      try (Permit permit = redsem.semaphore("app:{jobs}").limit(3).waitFor(5).acquire()) {
        System.out.println("holding " + permit.name());
      }
    }
    lettuce.shutdown();
  }

  /** The id of the client of {@code port} blocked in {@code cmd} (within 5 s). */
  private static String blockedIn(int port, String cmd) throws InterruptedException {
    long end = System.nanoTime() + 5_000_000_000L;
    while (System.nanoTime() < end) {
      for (String line : Commands.text(SemaphoreTest.raw(port, "CLIENT", "LIST")).split("\n")) {
        if (line.contains(" cmd=" + cmd + " ") && line.contains("flags=b")) {
          return line.replaceAll("^id=(\\d+) .*$", "$1").trim();
        }
      }
      Thread.sleep(5);
    }
    throw new AssertionError("no client blocked in " + cmd + " on " + port);
  }

  private static void signal(String sig, long pid) throws Exception {
    assertEquals(0, new ProcessBuilder("kill", "-" + sig, String.valueOf(pid)).start().waitFor());
  }

  /**
   * A durable acquire whose WAIT is cut (its connection lost, as when the primary fails) sends
   * WAIT again on a new connection, which has written nothing: WAIT would count every replica
   * attached, and the permit be called durable while no replica has it (on Valkey and Redis 8,
   * where only writes move a connection's offset; Redis 7.0 moves it at every command). The
   * replica is stopped (SIGSTOP), so no grant reaches it.
   */
  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(50)
  void aDurableWaitCutShortIsNotTakenForAcknowledged(ClusterKind kind) throws Exception {
    String name = name("durable");
    int primary = ownerOf(Commands.slot(name));
    Matcher replica = Pattern.compile("slave0:ip=[^,]+,port=(\\d+)")
        .matcher(Commands.text(SemaphoreTest.raw(primary, "INFO", "replication")));
    assertTrue(replica.find(), "the primary has a replica");
    Matcher pid = Pattern.compile("\"port\": " + replica.group(1) + ", \"pid\": (\\d+)")
        .matcher(cluster("nodes", dir.toString()));
    assertTrue(pid.find(), "the replica's pid");
    long replicaPid = Long.parseLong(pid.group(1));
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try (Kind.Client c = kind.connect()) {
      // The client's map of slots read first (Lettuce asks every node, the stopped one too).
      c.redsem.semaphore(name).limit(1).acquire().close();
      Thread.sleep(1500); // the replica acknowledges every write so far (once a second)
      signal("STOP", replicaPid);
      try {
        Future<Permit> acquire = pool.submit(() -> c.redsem.semaphore(name).limit(1)
            .durableReplicas(1).durableTimeout(Duration.ofSeconds(2)).acquire());
        String waiting;
        try {
          waiting = blockedIn(primary, "wait");
        } catch (AssertionError e) {
          throw new AssertionError(e.getMessage() + "; the acquire: "
              + (acquire.isDone() ? String.valueOf(acquire.get()) : "under way"), e);
        }
        SemaphoreTest.raw(primary, "CLIENT", "KILL", "ID", waiting);
        java.util.concurrent.ExecutionException failed = assertThrows(
            java.util.concurrent.ExecutionException.class, () -> acquire.get(20, TimeUnit.SECONDS));
        assertTrue(failed.getCause() instanceof NotDurable, "NotDurable: " + failed.getCause());
        assertEquals(0L, SemaphoreTest.raw(primary, "EXISTS", name), "the permit was given back");
      } finally {
        signal("CONT", replicaPid);
        pool.shutdownNow();
      }
    }
    cluster("wait", dir.toString());
  }

  /** A wait ended by another client (UNBLOCKED, as CLUSTER FAILOVER sends) waits again. */
  /**
   * A refresh that no primary answers before the permit's confirmed lease ends (its slot moving
   * key by key, slowly: every call on it gets TRYAGAIN) reports the permit lost, not the
   * cluster unavailable: the lease may have run out on the server unconfirmed.
   */
  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(59)
  void aRefreshUnansweredWithinTheLeaseIsALoss(ClusterKind kind) throws Exception {
    // A name of its own, not from name(): the later tests' names hash where they did before.
    String name = "{stall-" + kind + "}";
    int slot = Commands.slot(name);
    try (Kind.Client c = kind.connect()) {
      Permit permit = c.redsem.semaphore(name).limit(1).fair(true).lease(1)
          .autoRefresh(false).acquire();
      int owner = ownerOf(slot);
      int target = 0;
      for (int[] p : primaries(cluster("nodes", dir.toString()))) {
        if (p[0] != owner) {
          target = p[0];
          break;
        }
      }
      String to = String.valueOf(target);
      ExecutorService mover = Executors.newSingleThreadExecutor();
      try {
        Future<?> moved = mover.submit(() -> {
          cluster("move", dir.toString(), String.valueOf(slot), to, "--pause-ms", "1500");
          return null;
        });
        Thread.sleep(300); // the first key moved: the name's keys are split
        assertFalse(permit.refresh(), "lost, not unavailable");
        assertTrue(permit.isLost());
        moved.get(60, TimeUnit.SECONDS);
      } finally {
        mover.shutdownNow();
      }
      assertFalse(permit.release());
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(60)
  void aWaitUnblockedByAnotherClientWaitsAgain(ClusterKind kind) throws Exception {
    String name = name("unblocked");
    int primary = ownerOf(Commands.slot(name));
    String blocked = SCRIPTS ? "blpop" : "sem.acquire";
    try (Kind.Client c = kind.connect()) {
      Permit holder = c.redsem.semaphore(name).limit(1).acquire();
      java.util.concurrent.CompletableFuture<Permit> waiter =
          c.redsem.semaphore(name).limit(1).waitFor(20).build().acquireAsync();
      assertEquals(1L, SemaphoreTest.raw(primary, "CLIENT", "UNBLOCK",
          blockedIn(primary, blocked), "ERROR"));
      Thread.sleep(300);
      if (waiter.isDone()) {
        waiter.get(); // its error
      }
      blockedIn(primary, blocked); // waiting again
      assertTrue(holder.release());
      Permit served = waiter.get(10, TimeUnit.SECONDS);
      assertEquals(1L, SemaphoreTest.raw(primary, "ZCARD", name), "one holder");
      assertTrue(served.release());
    }
  }

  @ParameterizedTest
  @EnumSource(ClusterKind.class)
  @Order(100)
  void aPrimaryKilledUnderAWaiter(ClusterKind kind) throws Exception {
    String name = name("failover");
    int slot = Commands.slot(name);
    try (Kind.Client c = kind.connect()) {
      Permit holder = c.redsem.semaphore(name).limit(1).lease(10).durableReplicas(1)
          .durableTimeout(Duration.ofSeconds(2)).acquire();
      ExecutorService pool = Executors.newSingleThreadExecutor();
      try {
        Future<Permit> waiter = pool.submit(
            () -> c.redsem.semaphore(name).limit(1).lease(10).waitFor(30).acquire());
        Thread.sleep(200);
        cluster("kill", dir.toString(), String.valueOf(ownerOf(slot)));
        cluster("wait", dir.toString());
        // The next client's seed: a live primary (the killed one may have been the seed).
        seedPort = primaries(cluster("nodes", dir.toString())).get(0)[0];
        // The grant reached the replica (WAIT 1): the holder still holds on the new primary.
        assertTrue(holder.refresh(), "the holder survives the failover");
        if (waiter.isDone()) {
          waiter.get(); // the waiter's error, if it failed
        }
        assertFalse(waiter.isDone(), "the waiter waits on the new primary");
        assertTrue(holder.release());
        Permit served = waiter.get(30, TimeUnit.SECONDS);
        assertFalse(served.isLost());
        assertEquals(1L, SemaphoreTest.raw(ownerOf(slot), "ZCARD", name), "one permit, not two");
        assertTrue(served.release());
      } finally {
        pool.shutdownNow();
      }
    }
  }
}
