package io.redsem;

import java.util.Comparator;
import java.util.NoSuchElementException;
import java.util.concurrent.ConcurrentSkipListSet;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The background refresh of every permit of the process: one timer thread sweeps the permits
 * due every 10 ms (a permit is an entry in a sorted set, no thread or task of its own) and
 * hands their refreshes to a fixed set of {@link #REFRESH_THREADS} daemon threads (a refresh
 * may wait out a failover), each borrowing a connection for the call only. A permit has at
 * most one refresh queued or running.
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

  /** How often the sweep looks for permits due: their refreshes come this late at most. */
  private static final long SWEEP_NANOS = 10_000_000L;
  /** The sweep stops once no permit has been held for this long. */
  private static final long IDLE_NANOS = 1_000_000_000L;

  /**
   * Every permit refreshed in the background, by when its refresh is due: a permit is added
   * and removed without waking the timer thread (a task per permit would, at every acquire
   * and release), which sweeps the ones due every 10 ms while any is held.
   */
  private static final ConcurrentSkipListSet<Held> DUE = new ConcurrentSkipListSet<>(
      Comparator.<Held>comparingLong(h -> h.due).thenComparingLong(h -> h.seq));
  private static final AtomicBoolean SWEEPING = new AtomicBoolean();
  private static ScheduledFuture<?> sweep; // the timer thread's
  private static long emptySince; // the timer thread's

  /**
   * Refreshes {@code held} every {@code held.period} from now; false when its period is too
   * short for the sweep (under 30 ms: it needs a task of its own).
   */
  static boolean hold(Held held) {
    if (held.period < 3 * SWEEP_NANOS) {
      return false;
    }
    held.due = System.nanoTime() + held.period;
    DUE.add(held);
    if (!SWEEPING.get() && SWEEPING.compareAndSet(false, true)) {
      TIMER.execute(Refresher::startSweep);
    }
    return true;
  }

  /** No more refreshes of {@code held} (its {@code stopped} is set before). */
  static void drop(Held held) {
    DUE.remove(held);
  }

  private static void startSweep() {
    emptySince = 0;
    sweep = TIMER.scheduleWithFixedDelay(Refresher::sweep, SWEEP_NANOS, SWEEP_NANOS,
        TimeUnit.NANOSECONDS);
  }

  private static void sweep() {
    long now = System.nanoTime();
    while (true) {
      Held first;
      try {
        first = DUE.first();
      } catch (NoSuchElementException empty) {
        break;
      }
      if (first.due - now > 0) {
        break;
      }
      if (!DUE.remove(first)) {
        continue; // dropped meanwhile
      }
      if (first.tick()) {
        first.due = now + first.period;
        DUE.add(first);
        if (first.stopped) {
          DUE.remove(first); // released as it was ticked
        }
      }
    }
    if (!DUE.isEmpty()) {
      emptySince = 0;
      return;
    }
    if (emptySince == 0) {
      emptySince = now;
      return;
    }
    if (now - emptySince < IDLE_NANOS) {
      return;
    }
    sweep.cancel(false);
    SWEEPING.set(false);
    // A permit added as the sweep stopped: it starts again.
    if (!DUE.isEmpty() && SWEEPING.compareAndSet(false, true)) {
      startSweep();
    }
  }

  /** A refresh, on the refresh threads (queued while they are all busy). */
  static void refresh(Runnable refresh) {
    WORKERS.execute(refresh);
  }
}
