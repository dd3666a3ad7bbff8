package io.redsem;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The background refresh of every permit: one timer thread ticks each permit every lease/3 and
 * hands the refresh to a pool of daemon threads (a refresh may wait out a failover).
 */
final class Refresher {
  private Refresher() {}

  private static final AtomicInteger THREADS = new AtomicInteger();

  private static ThreadFactory daemons(String prefix) {
    return task -> {
      Thread t = new Thread(task, prefix + THREADS.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  private static final ScheduledExecutorService TIMER = timer();
  private static final ExecutorService WORKERS =
      Executors.newCachedThreadPool(daemons("redsem-refresh-"));

  private static ScheduledExecutorService timer() {
    ScheduledThreadPoolExecutor timer =
        new ScheduledThreadPoolExecutor(1, daemons("redsem-refresh-timer-"));
    // A released permit's tick leaves the queue at once (many short permits would fill it).
    timer.setRemoveOnCancelPolicy(true);
    return timer;
  }

  private static final ExecutorService ASYNC = Executors.newCachedThreadPool(daemons("redsem-async-"));

  /** The threads the async forms run on by default (daemon, made as needed). */
  static ExecutorService async() {
    return ASYNC;
  }

  /** {@code task} once, in {@code delayNanos}, on the daemon threads (it may wait on a node). */
  static ScheduledFuture<?> later(long delayNanos, Runnable task) {
    return TIMER.schedule(() -> WORKERS.execute(task), delayNanos, TimeUnit.NANOSECONDS);
  }

  /** {@code look} every {@code periodNanos} on the timer thread itself: it must not block. */
  static ScheduledFuture<?> watch(long periodNanos, Runnable look) {
    return TIMER.scheduleWithFixedDelay(look, periodNanos, periodNanos, TimeUnit.NANOSECONDS);
  }

  static ScheduledFuture<?> every(long periodNanos, Runnable refresh) {
    return TIMER.scheduleWithFixedDelay(
        () -> WORKERS.execute(refresh), periodNanos, periodNanos, TimeUnit.NANOSECONDS);
  }
}
