// The soak's Java worker: SOAK_THREADS threads, each with its own JedisCluster, take permits of
// the soak's names through redsem-client and log every call as one JSON line (the protocol of
// tests/soak/README.md; the environment as for worker.py).

import io.redsem.NotAcquired;
import io.redsem.NotDurable;
import io.redsem.Permit;
import io.redsem.PermitLost;
import io.redsem.Redsem;
import io.redsem.Semaphore;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.function.Supplier;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisCluster;

public final class Main {
  private static OutputStream out;

  record Name(String name, long limit, boolean fair) {}

  static long nowUs() {
    Instant now = Instant.now();
    return now.getEpochSecond() * 1_000_000L + now.getNano() / 1000;
  }

  static String quote(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        b.append('\\').append(c);
      } else if (c < 0x20) {
        b.append(String.format("\\u%04x", (int) c));
      } else {
        b.append(c);
      }
    }
    return b.append('"').toString();
  }

  static void log(Map<String, Object> r) {
    StringBuilder b = new StringBuilder("{");
    for (Map.Entry<String, Object> e : r.entrySet()) {
      if (b.length() > 1) b.append(',');
      Object v = e.getValue();
      b.append(quote(e.getKey())).append(':');
      b.append(v instanceof String s ? quote(s) : String.valueOf(v));
    }
    b.append("}\n");
    synchronized (Main.class) {
      try {
        out.write(b.toString().getBytes(StandardCharsets.UTF_8));
        out.flush();
      } catch (IOException e) {
        throw new RuntimeException(e);
      }
    }
  }

  /** Runs fn, filling the record's times and outcome; returns fn's value or null. */
  static <T> T call(Map<String, Object> r, Supplier<T> fn) {
    r.put("t0", nowUs());
    T value = null;
    try {
      value = fn.get();
    } catch (NotAcquired e) {
      r.put("out", "not-acquired");
    } catch (NotDurable e) {
      r.put("out", "not-durable");
      r.put("err", String.valueOf(e.getMessage()));
    } catch (PermitLost e) {
      r.put("out", "lost");
      r.put("err", String.valueOf(e.getMessage()));
    } catch (RuntimeException e) {
      r.put("out", "error");
      r.put("err", e.getClass().getName() + ": " + e.getMessage());
    }
    r.put("t1", nowUs());
    return value;
  }

  public static void main(String[] args) throws Exception {
    Map<String, String> env = System.getenv();
    out = new FileOutputStream(env.get("SOAK_OUT"), true);
    List<Name> names = new ArrayList<>();
    for (String n : env.get("SOAK_NAMES").split(",")) {
      String[] p = n.split("=");
      names.add(new Name(p[0], Long.parseLong(p[1]), p[2].equals("fair")));
    }
    double seconds = Double.parseDouble(env.get("SOAK_SECONDS"));
    int threads = Integer.parseInt(env.getOrDefault("SOAK_THREADS", "2"));
    long seed = Long.parseLong(env.getOrDefault("SOAK_SEED", "1"));
    double retryFor = Double.parseDouble(env.getOrDefault("SOAK_RETRY_FOR", "10"));
    boolean durableAllowed = "1".equals(env.get("SOAK_DURABLE"));
    Set<HostAndPort> nodes = new HashSet<>();
    for (String n : env.get("SOAK_NODES").split(",")) {
      String[] p = n.split(":");
      nodes.add(new HostAndPort(p[0], Integer.parseInt(p[1])));
    }
    String worker = env.get("SOAK_WORKER");
    long end = System.nanoTime() + (long) (seconds * 1e9);

    List<Thread> all = new ArrayList<>();
    for (int i = 0; i < threads; i++) {
      final int index = i;
      Thread t =
          new Thread(
              () -> {
                Random rng = new Random(seed * 1000 + index);
                String me = worker + "." + index;
                try (JedisCluster jedis = new JedisCluster(nodes, 5000)) {
                  Redsem redsem =
                      Redsem.of(jedis).withRetryFor(Duration.ofMillis((long) (retryFor * 1000)));
                  for (int seq = 1; System.nanoTime() < end; seq++) {
                    Name n = names.get(rng.nextInt(names.size()));
                    double lease = rng.nextBoolean() ? 2.0 : 3.0;
                    double wait = new double[] {0, 0, 1, 3}[rng.nextInt(4)];
                    boolean durable = durableAllowed && rng.nextDouble() < 0.2;
                    Map<String, Object> base = new LinkedHashMap<>();
                    base.put("w", me);
                    base.put("p", me + "#" + seq);
                    base.put("name", n.name());
                    base.put("limit", n.limit());
                    base.put("lease", (long) (lease * 1000));
                    base.put("retry_for", (long) (retryFor * 1000));
                    Semaphore.Builder b =
                        redsem.semaphore(n.name()).limit(n.limit()).lease(lease).fair(n.fair())
                            .autoRefresh(false);
                    if (wait > 0) b = b.waitFor(wait);
                    if (durable) {
                      b = b.durableReplicas(1).durableTimeout(Duration.ofMillis(500));
                    }
                    Semaphore sem = b.build();
                    Map<String, Object> rec = new LinkedHashMap<>(base);
                    rec.put("op", "acquire");
                    rec.put("fair", n.fair());
                    rec.put("wait", (long) (wait * 1000));
                    rec.put("durable", durable);
                    Permit permit = call(rec, sem::acquire);
                    if (permit != null) {
                      rec.put("out", "ok");
                      if (permit.ticket().isPresent()) rec.put("ticket", permit.ticket().getAsLong());
                      rec.put("id", permit.id());
                    }
                    log(rec);
                    if (permit == null) {
                      Thread.sleep((long) (rng.nextDouble() * 200));
                      continue;
                    }
                    long leaseMs = (long) (lease * 1000);
                    Supplier<Boolean> refresh =
                        () -> {
                          Map<String, Object> r = new LinkedHashMap<>(base);
                          r.put("op", "refresh");
                          Boolean held = call(r, permit::refresh);
                          if (held != null) r.put("out", held ? "ok" : "lost");
                          log(r);
                          return "ok".equals(r.get("out"));
                        };
                    Supplier<Boolean> check =
                        () -> {
                          Map<String, Object> r = new LinkedHashMap<>(base);
                          r.put("op", "check");
                          call(
                              r,
                              () -> {
                                permit.check();
                                return Boolean.TRUE;
                              });
                          r.putIfAbsent("out", "ok");
                          log(r);
                          return "ok".equals(r.get("out"));
                        };
                    // A wait for the grant leaves the lease's start unknown: confirm it, as the
                    // package does.
                    boolean held = true;
                    if (((long) rec.get("t1") - (long) rec.get("t0")) / 1000 > leaseMs / 3) {
                      held = refresh.get();
                    }
                    if (rng.nextDouble() < 0.15) {
                      Thread.sleep(leaseMs + 300); // overstay: the release should report the loss
                    } else {
                      long holdEnd = System.nanoTime() + (long) (rng.nextDouble() * 1.6 * leaseMs * 1e6);
                      while (held && System.nanoTime() < holdEnd) {
                        long left = Math.max((holdEnd - System.nanoTime()) / 1_000_000, 0);
                        Thread.sleep(Math.min(leaseMs / 3, left));
                        if (System.nanoTime() < holdEnd) held = check.get() && refresh.get();
                      }
                    }
                    Map<String, Object> r = new LinkedHashMap<>(base);
                    r.put("op", "release");
                    Boolean released = call(r, permit::release);
                    if (released != null) r.put("out", released ? "ok" : "lost");
                    log(r);
                    Thread.sleep((long) (rng.nextDouble() * 100));
                  }
                } catch (InterruptedException e) {
                  Thread.currentThread().interrupt();
                }
              });
      t.start();
      all.add(t);
    }
    for (Thread t : all) t.join();
    out.close();
  }
}
