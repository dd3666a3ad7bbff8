package io.redsem;

import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The background refresh of every permit of the process: one timer thread ticks each permit
 * every lease/3 (a task in its queue, no thread of its own) and hands its refresh to a fixed
 * set of {@link #REFRESH_THREADS} daemon threads (a refresh may wait out a failover), each
 * borrowing a connection for the call only. A permit has at most one refresh queued or running.
 */
final class Refresher {
  private Refresher() {}

  /** The threads that run the refreshes of every permit of the process. */
  static final int REFRESH_THREADS = 4;

  private static final AtomicInteger THREADS = new AtomicInteger();

  private static ThreadFactory daemons(String prefix) {
    return task -> {
      Thread t = new Thread(task, prefix + THREADS.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  private static final ScheduledExecutorService TIMER = timer();
  private static final ThreadPoolExecutor WORKERS = workers();

  private static ScheduledExecutorService timer() {
    ScheduledThreadPoolExecutor timer =
        new ScheduledThreadPoolExecutor(1, daemons("redsem-refresh-timer-"));
    // A released permit's tick leaves the queue at once (many short permits would fill it).
    timer.setRemoveOnCancelPolicy(true);
    return timer;
  }

  private static ThreadPoolExecutor workers() {
    ThreadPoolExecutor workers = new ThreadPoolExecutor(REFRESH_THREADS, REFRESH_THREADS,
        30, TimeUnit.SECONDS, new LinkedBlockingQueue<>(), daemons("redsem-refresh-"));
    workers.allowCoreThreadTimeOut(true); // none while nothing is held
    return workers;
  }

  private static final ExecutorService ASYNC = Executors.newCachedThreadPool(daemons("redsem-async-"));

  /** The threads the async forms run on by default (daemon, made as needed). */
  static ExecutorService async() {
    return ASYNC;
  }

  /**
   * {@code task} once, in {@code delayNanos}, on the async threads (it may wait on a node; it
   * serves a wait under way, not a held permit, and must not queue behind refreshes).
   */
  static ScheduledFuture<?> later(long delayNanos, Runnable task) {
    return TIMER.schedule(() -> ASYNC.execute(task), delayNanos, TimeUnit.NANOSECONDS);
  }

  /** {@code look} every {@code periodNanos} on the timer thread itself: it must not block. */
  static ScheduledFuture<?> watch(long periodNanos, Runnable look) {
    return TIMER.scheduleWithFixedDelay(look, periodNanos, periodNanos, TimeUnit.NANOSECONDS);
  }

  /** A refresh, on the refresh threads (queued while they are all busy). */
  static void refresh(Runnable refresh) {
    WORKERS.execute(refresh);
  }
}
