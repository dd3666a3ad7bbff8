package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Waits ended from outside, with the module or through the script (REDSEM_BACKEND=scripts): a
 * cancelled or timed-out acquireAsync, an interrupted thread, and a blocked call another client
 * ends (CLIENT UNBLOCK ... ERROR, as a failover does). The holders are counted on the server.
 */
class StopTest {
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
    return "stop-" + what + "-" + NAMES.incrementAndGet();
  }

  private static Object raw(String... args) {
    return SemaphoreTest.raw(server.port, args);
  }

  /** The waiting call in the server: the module's blocked acquire, or the script's BLPOP. */
  private static final String BLOCKED = SCRIPTS ? "cmd=blpop" : "cmd=sem.acquire";

  /** The server's clients blocked in a wait of this package. */
  private static List<String> blocked() {
    return blocked(BLOCKED);
  }

  private static List<String> blocked(String cmd) {
    List<String> out = new java.util.ArrayList<>();
    for (String line : Commands.text(raw("CLIENT", "LIST")).split("\n")) {
      if (line.contains(cmd + " ") && line.contains("flags=b")) {
        out.add(line);
      }
    }
    return out;
  }

  private static void until(java.util.function.BooleanSupplier done, String what)
      throws InterruptedException {
    long end = System.nanoTime() + 5_000_000_000L;
    while (!done.getAsBoolean()) {
      assertTrue(System.nanoTime() < end, "not within 5 s: " + what);
      Thread.sleep(5);
    }
  }

  /** The holder releases: nobody else holds then, nor a lease (1 s) later. */
  private static void nobodyHoldsAfter(Permit holder, String jobs) throws Exception {
    assertTrue(holder.release());
    Thread.sleep(300);
    assertEquals(0L, raw("EXISTS", jobs), "nobody holds a permit after the release");
    Thread.sleep(1200);
    assertEquals(0L, raw("EXISTS", jobs), "nor a lease later (no refresh of a lost grant)");
    if (SCRIPTS) {
      assertEquals(0L, raw("EXISTS", jobs + ":line"), "the line is empty");
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aCancelledAcquireAsyncEndsItsWait(Kind kind) throws Exception {
    for (boolean timeout : new boolean[] {false, true}) {
      String jobs = name(timeout ? "or-timeout" : "cancel");
      try (Kind.Client c = kind.connect(server.port)) {
        Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
        Semaphore waiting =
            c.redsem.semaphore(jobs).limit(1).lease(1).waitFor(Duration.ofSeconds(20)).build();
        CompletableFuture<Permit> future = waiting.acquireAsync();
        if (timeout) {
          future.orTimeout(300, TimeUnit.MILLISECONDS);
        }
        until(() -> blocked().size() == 1, "the waiter blocked in the server");
        if (!timeout) {
          assertTrue(future.cancel(true));
        }
        ExecutionException failed = null;
        try {
          future.get(5, TimeUnit.SECONDS);
        } catch (ExecutionException e) {
          failed = e;
        } catch (CancellationException e) {
          assertFalse(timeout);
        }
        if (timeout) {
          assertInstanceOf(TimeoutException.class, failed.getCause());
        }
        until(() -> blocked().isEmpty(), "the wait ended in the server");
        nobodyHoldsAfter(holder, jobs);
      }
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aCancelledSetOrWaitEmptyEndsItsWait(Kind kind) throws Exception {
    org.junit.jupiter.api.Assumptions.assumeFalse(SCRIPTS, "sets and waitEmpty need the module");
    String gpu = name("set-gpu");
    String licence = name("set-licence");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(gpu).limit(1).acquire();
      CompletableFuture<PermitSet> set = c.redsem.semaphoreSet().semaphore(gpu, 1)
          .semaphore(licence, 5).lease(1).waitFor(20).build().acquireAsync();
      until(() -> blocked("cmd=sem.acquireall").size() == 1, "the set's wait in the server");
      CompletableFuture<Boolean> empty = c.redsem.waitEmptyAsync(gpu, Duration.ofSeconds(20));
      until(() -> blocked("cmd=sem.waitempty").size() == 1, "waitEmpty in the server");
      assertTrue(set.cancel(true));
      assertTrue(empty.cancel(true));
      until(() -> blocked("cmd=sem.acquireall").isEmpty(), "the set's wait ended in the server");
      until(() -> blocked("cmd=sem.waitempty").isEmpty(), "waitEmpty ended in the server");
      nobodyHoldsAfter(holder, gpu);
      assertEquals(0L, raw("EXISTS", licence), "nor of the set's other semaphore");
    }
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void anInterruptedWaitEndsAtOnce(Kind kind) throws Exception {
    String jobs = name("interrupt");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      AtomicReference<Throwable> failure = new AtomicReference<>();
      AtomicBoolean stillInterrupted = new AtomicBoolean();
      Thread waiter = new Thread(() -> {
        try {
          c.redsem.semaphore(jobs).limit(1).lease(1).waitFor(Duration.ofSeconds(10)).acquire();
        } catch (Throwable e) {
          failure.set(e);
          stillInterrupted.set(Thread.currentThread().isInterrupted());
        }
      });
      waiter.start();
      until(() -> blocked().size() == 1, "the waiter blocked in the server");
      long interrupted = System.nanoTime();
      waiter.interrupt();
      waiter.join(10_000);
      long took = (System.nanoTime() - interrupted) / 1_000_000;
      assertFalse(waiter.isAlive());
      assertTrue(took < 1500, "the wait ended " + took + " ms after the interrupt");
      assertInstanceOf(WaitInterrupted.class, failure.get(), String.valueOf(failure.get()));
      assertTrue(failure.get().getMessage().contains("interrupted"), failure.get().getMessage());
      assertTrue(stillInterrupted.get(), "the thread's interrupt status stays set");
      until(() -> blocked().isEmpty(), "the wait ended in the server");
      nobodyHoldsAfter(holder, jobs);

      // Interrupted before it starts: nothing is sent, nothing is held.
      Permit again = c.redsem.semaphore(jobs).limit(1).acquire();
      Thread.currentThread().interrupt();
      try {
        assertThrows(WaitInterrupted.class,
            () -> c.redsem.semaphore(jobs).limit(1).waitFor(10).acquire());
      } finally {
        assertTrue(Thread.interrupted());
      }
      assertEquals(1L, raw("ZCARD", jobs));
      assertTrue(again.release());
    }
  }

  /**
   * The release and the interrupt at once, many times: whichever wins, no permit is left held
   * (a grant that raced the interrupt is given back, or the acquire returns it).
   */
  @ParameterizedTest
  @EnumSource(Kind.class)
  void aGrantThatRacesTheInterruptIsNotLeftHeld(Kind kind) throws Exception {
    String jobs = name("race");
    int returned = 0;
    int interrupted = 0;
    try (Kind.Client c = kind.connect(server.port)) {
      for (int i = 0; i < 20; i++) {
        Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
        AtomicReference<Object> outcome = new AtomicReference<>();
        Thread waiter = new Thread(() -> {
          try {
            outcome.set(c.redsem.semaphore(jobs).limit(1).waitFor(10).acquire());
          } catch (Throwable e) {
            outcome.set(e);
          }
        });
        waiter.start();
        until(() -> blocked().size() == 1, "the waiter blocked in the server");
        Thread release = new Thread(holder::release);
        release.start();
        Thread.sleep(i % 3); // the interrupt before, with or after the release
        waiter.interrupt();
        release.join(10_000);
        waiter.join(10_000);
        assertFalse(waiter.isAlive());
        if (outcome.get() instanceof Permit) {
          returned++;
          assertTrue(((Permit) outcome.get()).release());
        } else {
          interrupted++;
          assertInstanceOf(WaitInterrupted.class, outcome.get(), String.valueOf(outcome.get()));
        }
        until(() -> Long.valueOf(0).equals(raw("EXISTS", jobs)), "no permit left held");
        until(() -> blocked().isEmpty(), "no wait left in the server");
      }
    }
    System.out.println(kind + ": " + returned + " granted, " + interrupted + " interrupted");
  }

  @ParameterizedTest
  @EnumSource(Kind.class)
  void aWaitUnblockedByAnotherClientWaitsAgain(Kind kind) throws Exception {
    String jobs = name("unblocked");
    try (Kind.Client c = kind.connect(server.port)) {
      Permit holder = c.redsem.semaphore(jobs).limit(1).acquire();
      CompletableFuture<Permit> future =
          c.redsem.semaphore(jobs).limit(1).waitFor(Duration.ofSeconds(20)).build().acquireAsync();
      until(() -> blocked().size() == 1, "the waiter blocked in the server");
      String id = blocked().get(0).replaceAll("^id=(\\d+) .*$", "$1");
      assertEquals(1L, raw("CLIENT", "UNBLOCK", id, "ERROR"));
      Thread.sleep(300);
      if (future.isDone()) {
        future.get(); // its error
      }
      assertFalse(future.isDone(), "the waiter waits again");
      until(() -> blocked().size() == 1, "the waiter blocked in the server again");
      assertTrue(holder.release());
      Permit served = future.get(5, TimeUnit.SECONDS);
      assertEquals(1L, raw("ZCARD", jobs));
      assertTrue(served.release());
    }
  }
}
