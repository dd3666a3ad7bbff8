package io.redsem.bench;

import io.redsem.NotAcquired;
import io.redsem.Permit;
import io.redsem.Redsem;
import io.redsem.Semaphore;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.redisson.Redisson;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * Hand-offs and pairs per second, redsem-client beside Redisson's RPermitExpirableSemaphore, in
 * one run with the contenders interleaved (A B C ... A B C ...), medians of the rounds.
 *
 * <p>Pairs: T threads, each looping acquire (no wait) then release on a semaphore whose limit
 * is never reached (1,000,000); a pair is one granted acquire and its release.
 *
 * <p>With {@code --pair-overhead}: the package's pairs beside the same client sending the same
 * commands itself (1 thread unless {@code --threads}), per client and backend.
 *
 * <p>Hand-off: limit 1, W threads each looping acquire (waiting) then release then acquire; a
 * hand-off is a grant to another thread than the previous holder's.
 */
public final class PeerBench {
  /** One contender: makes its client, and a semaphore of a name and limit. */
  interface Contender extends AutoCloseable {
    String name();

    Sem semaphore(String name, int limit, boolean waits);

    @Override
    void close();
  }

  /** Acquire (waiting up to 10 s when made so) and release. */
  interface Sem {
    Object acquire() throws Exception; // null: not granted

    void release(Object permit) throws Exception;
  }

  static final class RedsemContender implements Contender {
    private final String name;
    private final Redsem redsem;
    private final AutoCloseable client;

    RedsemContender(String name, Redsem redsem, AutoCloseable client) {
      this.name = name;
      this.redsem = redsem;
      this.client = client;
    }

    @Override
    public String name() {
      return name;
    }

    @Override
    public Sem semaphore(String sem, int limit, boolean waits) {
      Semaphore.Builder b = redsem.semaphore(sem).limit(limit).lease(30);
      if (waits) {
        b.waitFor(10);
      }
      Semaphore s = b.build();
      return new Sem() {
        @Override
        public Object acquire() {
          try {
            return s.acquire();
          } catch (NotAcquired e) {
            return null;
          }
        }

        @Override
        public void release(Object permit) {
          ((Permit) permit).release();
        }
      };
    }

    @Override
    public void close() {
      try {
        redsem.close();
        client.close();
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    }
  }

  static final class RedissonContender implements Contender {
    private final RedissonClient redisson;

    RedissonContender(int port) {
      Config config = new Config();
      config.useSingleServer().setAddress("redis://127.0.0.1:" + port)
          .setConnectionPoolSize(64).setConnectionMinimumIdleSize(16);
      redisson = Redisson.create(config);
    }

    @Override
    public String name() {
      return "Redisson RPermitExpirableSemaphore";
    }

    @Override
    public Sem semaphore(String sem, int limit, boolean waits) {
      RPermitExpirableSemaphore s = redisson.getPermitExpirableSemaphore(sem);
      s.trySetPermits(limit);
      return new Sem() {
        @Override
        public Object acquire() throws InterruptedException {
          return waits ? s.tryAcquire(10, 30, TimeUnit.SECONDS) : s.tryAcquire(0, 30, TimeUnit.SECONDS);
        }

        @Override
        public void release(Object permit) {
          s.release((String) permit);
        }
      };
    }

    @Override
    public void close() {
      redisson.shutdown();
    }
  }

  /**
   * The same client sending the package's commands itself: SEM.ACQUIRE / SEM.RELEASE, or the
   * script's EVALSHA (the acquire through the script's first-attempt text, as the package sends
   * it), an identifier of its own per acquire.
   */
  static final class RawContender implements Contender {
    private final String name;
    private final boolean script;
    private final Raw raw;
    private final AutoCloseable client;
    private final AtomicLong ids = new AtomicLong();
    private final String sha;
    private final String shaAcq;

    /** One command on the client, its reply as the library gives it. */
    interface Raw {
      Object call(String... args);
    }

    RawContender(String name, boolean script, Raw raw, AutoCloseable client) throws IOException {
      this.name = name;
      this.script = script;
      this.raw = raw;
      this.client = client;
      byte[] source;
      try (java.io.InputStream in =
          Redsem.class.getClassLoader().getResourceAsStream("io/redsem/redsem.lua")) {
        source = in.readAllBytes();
      }
      String text = new String(source, java.nio.charset.StandardCharsets.UTF_8);
      String acq = "#!lua" + text.substring("#!lua flags=allow-oom".length());
      sha = script ? Commands.text(raw.call("SCRIPT", "LOAD", text)) : null;
      shaAcq = script ? Commands.text(raw.call("SCRIPT", "LOAD", acq)) : null;
    }

    @Override
    public String name() {
      return name;
    }

    @Override
    public Sem semaphore(String sem, int limit, boolean waits) {
      String lim = String.valueOf(limit);
      String[] keys = {sem, sem + ":owner", sem + ":counter", sem + ":permits", sem + ":limit",
          sem + ":wake"};
      return new Sem() {
        @Override
        public Object acquire() {
          String id = "raw-" + ids.incrementAndGet();
          Object reply = script
              ? raw.call("EVALSHA", shaAcq, "6", keys[0], keys[1], keys[2], keys[3], keys[4],
                  keys[5], "ACQUIRE", lim, "30", "ID", id)
              : raw.call("SEM.ACQUIRE", sem, lim, "30", "ID", id);
          if (script ? ((List<?>) reply).get(0) == null : reply == null) {
            return null;
          }
          return id;
        }

        @Override
        public void release(Object permit) {
          String id = (String) permit;
          if (script) {
            raw.call("EVALSHA", sha, "6", keys[0], keys[1], keys[2], keys[3], keys[4], keys[5],
                "RELEASE", id);
          } else {
            raw.call("SEM.RELEASE", sem, id);
          }
        }
      };
    }

    @Override
    public void close() {
      try {
        client.close();
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    }
  }

  /** Reply text of either library. */
  static final class Commands {
    static String text(Object reply) {
      return reply instanceof byte[]
          ? new String((byte[]) reply, java.nio.charset.StandardCharsets.UTF_8)
          : String.valueOf(reply);
    }
  }

  static RawContender.Raw jedisRaw(redis.clients.jedis.UnifiedJedis jedis) {
    return args -> {
      byte[] name = args[0].getBytes(java.nio.charset.StandardCharsets.UTF_8);
      String[] rest = Arrays.copyOfRange(args, 1, args.length);
      return jedis.sendCommand(() -> name, rest);
    };
  }

  static RawContender.Raw lettuceRaw(
      io.lettuce.core.api.StatefulRedisConnection<String, String> connection) {
    return args -> {
      byte[] name = args[0].getBytes(java.nio.charset.StandardCharsets.UTF_8);
      io.lettuce.core.protocol.ProtocolKeyword keyword = () -> name;
      io.lettuce.core.protocol.CommandArgs<String, String> rest =
          new io.lettuce.core.protocol.CommandArgs<>(io.lettuce.core.codec.StringCodec.UTF8);
      for (int i = 1; i < args.length; i++) {
        rest.add(args[i]);
      }
      io.lettuce.core.codec.StringCodec codec = io.lettuce.core.codec.StringCodec.UTF8;
      // The output each reply's type needs, as an application would pick it.
      io.lettuce.core.output.CommandOutput<String, String, ?> output =
          args[0].equals("EVALSHA") ? new io.lettuce.core.output.NestedMultiOutput<>(codec)
              : args[0].equals("SEM.RELEASE") ? new io.lettuce.core.output.IntegerOutput<>(codec)
              : new io.lettuce.core.output.ValueOutput<>(codec);
      return connection.sync().dispatch(keyword, output, rest);
    };
  }

  private static final AtomicInteger NAMES = new AtomicInteger();

  /** Pairs per second of {@code threads} threads over {@code seconds}. */
  static double pairs(Contender c, int threads, double seconds) throws Exception {
    Sem sem = c.semaphore("pairs-" + NAMES.incrementAndGet(), 1_000_000, false);
    return loop(sem, threads, seconds, null);
  }

  /** Hand-offs per second of {@code waiters} threads on a semaphore of limit 1. */
  static double handoffs(Contender c, int waiters, double seconds) throws Exception {
    Sem sem = c.semaphore("handoff-" + NAMES.incrementAndGet(), 1, true);
    AtomicLong last = new AtomicLong(-1);
    return loop(sem, waiters, seconds, last);
  }

  private static double loop(Sem sem, int threads, double seconds, AtomicLong lastHolder)
      throws Exception {
    AtomicBoolean measuring = new AtomicBoolean(false);
    AtomicBoolean running = new AtomicBoolean(true);
    AtomicLong count = new AtomicLong();
    AtomicInteger failures = new AtomicInteger();
    CountDownLatch done = new CountDownLatch(threads);
    for (int t = 0; t < threads; t++) {
      long me = t;
      Thread thread = new Thread(() -> {
        try {
          while (running.get()) {
            Object permit = sem.acquire();
            if (permit == null) {
              continue;
            }
            if (measuring.get()) {
              if (lastHolder == null || lastHolder.getAndSet(me) != me) {
                count.incrementAndGet();
              }
            } else if (lastHolder != null) {
              lastHolder.set(me);
            }
            sem.release(permit);
          }
        } catch (Exception e) {
          if (failures.getAndIncrement() == 0) {
            e.printStackTrace();
          }
        } finally {
          done.countDown();
        }
      });
      thread.setDaemon(true);
      thread.start();
    }
    Thread.sleep(300); // warm-up
    count.set(0);
    measuring.set(true);
    long start = System.nanoTime();
    Thread.sleep((long) (seconds * 1000));
    long n = count.get();
    double elapsed = (System.nanoTime() - start) / 1e9;
    running.set(false);
    done.await(30, TimeUnit.SECONDS);
    if (failures.get() > 0) {
      throw new IllegalStateException(failures.get() + " threads failed");
    }
    return n / elapsed;
  }

  static Process server(String binary, int port, String module, String pin, Path dir)
      throws Exception {
    List<String> cmd = new ArrayList<>();
    if (!pin.isEmpty()) {
      cmd.addAll(Arrays.asList(pin.split(" ")));
    }
    cmd.addAll(List.of(binary, "--port", String.valueOf(port), "--bind", "127.0.0.1", "--save",
        "", "--appendonly", "no", "--dir", dir.toString()));
    if (module != null) {
      cmd.addAll(List.of("--loadmodule", module));
    }
    Process p = new ProcessBuilder(cmd).redirectErrorStream(true)
        .redirectOutput(dir.resolve("server.log").toFile()).start();
    long until = System.nanoTime() + 10_000_000_000L;
    while (System.nanoTime() < until) {
      try (Socket s = new Socket("127.0.0.1", port)) {
        return p;
      } catch (IOException e) {
        Thread.sleep(50);
      }
    }
    throw new IllegalStateException("the server did not start");
  }

  static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      return s.getLocalPort();
    }
  }

  static double median(List<Double> xs) {
    List<Double> sorted = new ArrayList<>(xs);
    sorted.sort(Double::compare);
    int n = sorted.size();
    return n % 2 == 1 ? sorted.get(n / 2) : (sorted.get(n / 2 - 1) + sorted.get(n / 2)) / 2;
  }

  /**
   * Seconds of {@code pairs} acquire + release pairs in each of {@code threads} threads (a
   * limit never reached: every acquire is granted).
   */
  static double pairSeconds(Contender c, int threads, int pairs) throws Exception {
    Sem sem = c.semaphore("overhead", 1_000_000, false);
    if (threads == 1) { // on this thread: no thread's start in the time
      long start = System.nanoTime();
      for (int i = 0; i < pairs; i++) {
        Object permit = sem.acquire();
        if (permit == null) {
          throw new IllegalStateException("not granted");
        }
        sem.release(permit);
      }
      return (System.nanoTime() - start) / 1e9;
    }
    CountDownLatch ready = new CountDownLatch(threads);
    CountDownLatch go = new CountDownLatch(1);
    CountDownLatch done = new CountDownLatch(threads);
    AtomicInteger failures = new AtomicInteger();
    for (int t = 0; t < threads; t++) {
      Thread thread = new Thread(() -> {
        try {
          ready.countDown();
          go.await();
          for (int i = 0; i < pairs; i++) {
            Object permit = sem.acquire();
            if (permit == null) {
              throw new IllegalStateException("not granted");
            }
            sem.release(permit);
          }
        } catch (Exception e) {
          if (failures.getAndIncrement() == 0) {
            e.printStackTrace();
          }
        } finally {
          done.countDown();
        }
      });
      thread.setDaemon(true);
      thread.start();
    }
    ready.await();
    long start = System.nanoTime();
    go.countDown();
    done.await();
    if (failures.get() > 0) {
      throw new IllegalStateException(failures.get() + " threads failed");
    }
    return (System.nanoTime() - start) / 1e9;
  }

  /**
   * The package's acquire + release pair beside the same client sending the same commands
   * itself: per client and backend, rounds of {@code pairs} pairs per thread, package and raw
   * in turn; the median time per pair of each and the median of the rounds' ratios.
   */
  static void pairOverhead(int withModule, int without, int threads, int pairs, int rounds)
      throws Exception {
    List<Contender[]> duos = new ArrayList<>();
    List<String> labels = new ArrayList<>();
    for (int port : new int[] {withModule, without}) {
      boolean script = port == without;
      String backend = script ? "script" : "module";
      redis.clients.jedis.RedisClient jedis = redis.clients.jedis.RedisClient.builder()
          .hostAndPort("127.0.0.1", port).build(); // Jedis's default pool
      duos.add(new Contender[] {
        new RedsemContender("package", Redsem.of(jedis), () -> {}),
        new RawContender("raw", script, jedisRaw(jedis), jedis)
      });
      labels.add("Jedis, " + backend);
      io.lettuce.core.RedisClient lettuce =
          io.lettuce.core.RedisClient.create("redis://127.0.0.1:" + port);
      io.lettuce.core.api.StatefulRedisConnection<String, String> connection = lettuce.connect();
      duos.add(new Contender[] {
        new RedsemContender("package", Redsem.of(lettuce), () -> {}),
        new RawContender("raw", script, lettuceRaw(connection), () -> {
          connection.close();
          lettuce.shutdown();
        })
      });
      labels.add("Lettuce, " + backend);
    }
    try {
      for (Contender[] duo : duos) { // warm-up (JIT, connections, scripts), not counted
        for (int i = 0; i < 3; i++) {
          pairSeconds(duo[0], threads, pairs);
          pairSeconds(duo[1], threads, pairs);
        }
      }
      System.out.printf("acquire (no wait) + release pairs: %d thread(s) x %d pairs per round, "
          + "%d rounds, package and raw client in turn every 100 pairs; median per pair (min-max)%n%n",
          threads, pairs, rounds);
      System.out.println("| client, backend | package µs/pair | raw client µs/pair | package ÷ raw |");
      System.out.println("| --- | ---: | ---: | ---: |");
      for (int d = 0; d < duos.size(); d++) {
        List<Double> pkg = new ArrayList<>();
        List<Double> raw = new ArrayList<>();
        List<Double> ratio = new ArrayList<>();
        for (int r = 0; r < rounds; r++) {
          // In blocks of 100 pairs, package and raw in turn, which goes first alternating: a
          // change of the machine's load falls on both alike.
          double a = 0;
          double b = 0;
          for (int block = 0; block < pairs / 100; block++) {
            for (int k = 0; k < 2; k++) {
              boolean pkgTurn = (block + k) % 2 == 0;
              double t = pairSeconds(duos.get(d)[pkgTurn ? 0 : 1], threads, 100);
              if (pkgTurn) {
                a += t;
              } else {
                b += t;
              }
            }
          }
          int done = pairs / 100 * 100;
          pkg.add(a * 1e6 / done);
          raw.add(b * 1e6 / done);
          ratio.add(a / b);
        }
        System.out.printf("| %s | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.2f (%.2f-%.2f) |%n",
            labels.get(d), median(pkg), min(pkg), max(pkg), median(raw), min(raw), max(raw),
            median(ratio), min(ratio), max(ratio));
      }
    } finally {
      for (Contender[] duo : duos) {
        duo[0].close();
        duo[1].close();
      }
    }
  }

  static double min(List<Double> xs) {
    return xs.stream().mapToDouble(x -> x).min().orElse(0);
  }

  static double max(List<Double> xs) {
    return xs.stream().mapToDouble(x -> x).max().orElse(0);
  }

  public static void main(String[] args) throws Exception {
    String module = null;
    String pin = "";
    String binary = "redis-server";
    double seconds = 2;
    int rounds = 3;
    int threads = 8;
    int waiters = 4;
    boolean overhead = false;
    boolean threadsGiven = false;
    int pairCount = 2000;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--module": module = args[++i]; break;
        case "--server-pin": pin = args[++i]; break;
        case "--server": binary = args[++i]; break;
        case "--seconds": seconds = Double.parseDouble(args[++i]); break;
        case "--rounds": rounds = Integer.parseInt(args[++i]); break;
        case "--threads": threads = Integer.parseInt(args[++i]); threadsGiven = true; break;
        case "--waiters": waiters = Integer.parseInt(args[++i]); break;
        case "--pair-overhead": overhead = true; break;
        case "--pairs": pairCount = Integer.parseInt(args[++i]); break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    Path dir = Files.createTempDirectory("redsem-bench-");
    int withModule = freePort();
    Files.createDirectories(dir.resolve("m"));
    Process a = server(binary, withModule, module, pin, dir.resolve("m"));
    int without = freePort();
    Files.createDirectories(dir.resolve("s"));
    Process b = server(binary, without, null, pin, dir.resolve("s"));
    if (overhead) {
      try {
        pairOverhead(withModule, without, threadsGiven ? threads : 1, pairCount, rounds);
      } finally {
        a.destroyForcibly();
        b.destroyForcibly();
      }
      System.exit(0);
    }
    List<Contender> contenders = new ArrayList<>();
    try {
      redis.clients.jedis.RedisClient jedis = jedis(withModule, threads + waiters + 8);
      contenders.add(new RedsemContender("redsem-client, Jedis, module", Redsem.of(jedis), jedis));
      io.lettuce.core.RedisClient lettuce =
          io.lettuce.core.RedisClient.create("redis://127.0.0.1:" + withModule);
      contenders.add(new RedsemContender("redsem-client, Lettuce, module", Redsem.of(lettuce),
          lettuce::shutdown));
      redis.clients.jedis.RedisClient jedisScripts = jedis(without, threads + waiters + 8);
      contenders.add(new RedsemContender("redsem-client, Jedis, script (no module)",
          Redsem.of(jedisScripts), jedisScripts));
      contenders.add(new RedissonContender(withModule));
      Map<String, List<Double>> pairs = new LinkedHashMap<>();
      Map<String, List<Double>> handoffs = new LinkedHashMap<>();
      for (Contender c : contenders) {
        pairs.put(c.name(), new ArrayList<>());
        handoffs.put(c.name(), new ArrayList<>());
      }
      for (Contender c : contenders) { // warm-up (JIT, connections), not counted
        pairs(c, threads, 1);
        handoffs(c, waiters, 1);
      }
      for (int r = 0; r < rounds; r++) {
        for (Contender c : contenders) {
          pairs.get(c.name()).add(pairs(c, threads, seconds));
        }
        for (Contender c : contenders) {
          handoffs.get(c.name()).add(handoffs(c, waiters, seconds));
        }
      }
      System.out.printf("%d rounds x %.1f s per contender, interleaved, after a warm-up; pairs: "
          + "%d threads, limit 1,000,000; hand-offs: %d threads, limit 1, lease 30 s, wait 10 s;"
          + " median (min-max)%n%n", rounds, seconds, threads, waiters);
      System.out.println("| contender | pairs/s | hand-offs/s |");
      System.out.println("| --- | ---: | ---: |");
      for (Contender c : contenders) {
        List<Double> p = pairs.get(c.name());
        List<Double> h = handoffs.get(c.name());
        System.out.printf("| %s | %,.0f (%,.0f-%,.0f) | %,.0f (%,.0f-%,.0f) |%n", c.name(),
            median(p), p.stream().mapToDouble(x -> x).min().orElse(0),
            p.stream().mapToDouble(x -> x).max().orElse(0), median(h),
            h.stream().mapToDouble(x -> x).min().orElse(0),
            h.stream().mapToDouble(x -> x).max().orElse(0));
      }
    } finally {
      for (Contender c : contenders) {
        try {
          c.close();
        } catch (RuntimeException e) {
          // closing
        }
      }
      a.destroyForcibly();
      b.destroyForcibly();
    }
    System.exit(0);
  }

  static redis.clients.jedis.RedisClient jedis(int port, int connections) {
    org.apache.commons.pool2.impl.GenericObjectPoolConfig<redis.clients.jedis.Connection> pool =
        new org.apache.commons.pool2.impl.GenericObjectPoolConfig<>();
    pool.setMaxTotal(connections);
    pool.setMaxIdle(connections);
    return redis.clients.jedis.RedisClient.builder().hostAndPort("127.0.0.1", port)
        .poolConfig(pool).build();
  }
}
