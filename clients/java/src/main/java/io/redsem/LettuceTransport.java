package io.redsem;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;

/**
 * Lettuce, one server: one connection shared by the calls that do not block (Lettuce
 * multiplexes it), and a connection of its own for a call that blocks or binds.
 */
final class LettuceTransport implements Transport {
  private final RedisClient client;
  private final Spares<StatefulRedisConnection<byte[], byte[]>> own;
  private StatefulRedisConnection<byte[], byte[]> shared;

  LettuceTransport(RedisClient client) {
    if (client == null) {
      throw new IllegalArgumentException("the Lettuce client must not be null");
    }
    this.client = client;
    this.own = LettuceConn.spares(() -> client.connect(ByteArrayCodec.INSTANCE));
  }

  @Override
  public boolean cluster() {
    return false;
  }

  @Override
  public Conn open(String node, boolean dedicated) {
    if (dedicated) {
      return LettuceConn.take(own);
    }
    return shared();
  }

  private synchronized Conn shared() {
    if (shared == null || !shared.isOpen()) {
      shared = client.connect(ByteArrayCodec.INSTANCE);
    }
    return new LettuceConn(shared, false);
  }

  @Override
  public String ownerOf(int slot) {
    throw new UnsupportedOperationException("not a cluster");
  }

  @Override
  public void refreshTopology() {
    throw new UnsupportedOperationException("not a cluster");
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
  public synchronized void close() {
    own.close();
    if (shared != null) {
      shared.close();
      shared = null;
    }
  }
}
