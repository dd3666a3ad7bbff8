package io.redsem;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Lettuce, what one server and a Redis Cluster share: per server (per node in Cluster) one
 * connection of redsem's own shared by the calls that do not block (Lettuce multiplexes it),
 * and connections of its own for the calls that block or bind ({@link Spares}). The
 * application's connections are never used. {@link #of} gives the one-server form; {@link
 * LettuceClusterTransport} the cluster's.
 */
abstract class LettuceTransport implements Transport {
  private final Map<String, StatefulRedisConnection<byte[], byte[]>> shared =
      new ConcurrentHashMap<>();
  private final Map<String, Spares<StatefulRedisConnection<byte[], byte[]>>> own =
      new ConcurrentHashMap<>();

  /** The transport of a client to one server (its URI names it). */
  static LettuceTransport of(RedisClient client) {
    if (client == null) {
      throw new IllegalArgumentException("the Lettuce client must not be null");
    }
    return new LettuceTransport() {
      @Override
      StatefulRedisConnection<byte[], byte[]> connect(String node) {
        return client.connect(ByteArrayCodec.INSTANCE);
      }

      @Override
      public boolean cluster() {
        return false;
      }

      @Override
      public String ownerOf(int slot) {
        throw new UnsupportedOperationException("not a cluster");
      }

      @Override
      public void refreshTopology() {
        throw new UnsupportedOperationException("not a cluster");
      }
    };
  }

  /** A new connection to {@code node} ("" on one server). */
  abstract StatefulRedisConnection<byte[], byte[]> connect(String node);

  @Override
  public Conn open(String node, boolean dedicated) {
    String key = node == null ? "" : node;
    if (dedicated) {
      return LettuceConn.take(
          own.computeIfAbsent(key, k -> LettuceConn.spares(() -> connect(k))));
    }
    // One that failed is replaced here, at the next call.
    StatefulRedisConnection<byte[], byte[]> c = shared.compute(key,
        (k, old) -> old != null && old.isOpen() ? old : connect(k));
    return new LettuceConn(c, false);
  }

  @Override
  public RuntimeException serverError(String message) {
    return new RedisCommandExecutionException(message);
  }

  @Override
  public Failure classify(RuntimeException error) {
    return LettuceConn.classify(error);
  }

  @Override
  public void close() {
    for (Spares<StatefulRedisConnection<byte[], byte[]>> spares : own.values()) {
      spares.close();
    }
    own.clear();
    for (StatefulRedisConnection<byte[], byte[]> c : shared.values()) {
      c.close();
    }
    shared.clear();
  }
}
