package io.redsem;

import io.lettuce.core.api.StatefulRedisConnection;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;

/**
 * Lettuce connections of their own (for a call that blocks, binds or follows an ASK), kept
 * for the next such call once given back whole: a waiting acquire does not pay for a new
 * connection each time.
 */
final class LettucePool {
  private static final int MAX_IDLE = 16;

  private final Supplier<StatefulRedisConnection<byte[], byte[]>> connect;
  private final ConcurrentLinkedDeque<StatefulRedisConnection<byte[], byte[]>> idle =
      new ConcurrentLinkedDeque<>();
  private final AtomicInteger idleCount = new AtomicInteger();
  private volatile boolean closed;

  LettucePool(Supplier<StatefulRedisConnection<byte[], byte[]>> connect) {
    this.connect = connect;
  }

  Transport.Conn take() {
    StatefulRedisConnection<byte[], byte[]> c;
    while ((c = idle.pollFirst()) != null) {
      idleCount.decrementAndGet();
      if (c.isOpen()) {
        return conn(c);
      }
      c.closeAsync();
    }
    return conn(connect.get());
  }

  private Transport.Conn conn(StatefulRedisConnection<byte[], byte[]> c) {
    return new LettuceConn(c, true) {
      @Override
      public void close(boolean broken) {
        giveBack(c, broken);
      }
    };
  }

  private void giveBack(StatefulRedisConnection<byte[], byte[]> c, boolean broken) {
    if (!broken && !closed && c.isOpen()) {
      if (idleCount.incrementAndGet() <= MAX_IDLE) {
        idle.addFirst(c);
        if (closed) {
          close();
        }
        return;
      }
      idleCount.decrementAndGet();
    }
    c.closeAsync();
  }

  void close() {
    closed = true;
    StatefulRedisConnection<byte[], byte[]> c;
    while ((c = idle.pollFirst()) != null) {
      idleCount.decrementAndGet();
      c.closeAsync();
    }
  }
}
