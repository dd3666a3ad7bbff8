package io.redsem;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.models.partitions.Partitions;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.ByteArrayCodec;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Lettuce, Redis Cluster: the slots' owners from the cluster client's view of the topology, and
 * connections of redsem's own to each node (one shared per node for the calls that do not
 * block, one of its own for a call that blocks, binds or follows an ASK), made with the cluster
 * client's resources and each node's URI (its credentials and TLS included).
 */
final class LettuceClusterTransport implements Transport {
  private final RedisClusterClient cluster;
  private final RedisClient nodes;
  private final Map<String, StatefulRedisConnection<byte[], byte[]>> shared =
      new ConcurrentHashMap<>();
  private final Map<String, Spares<StatefulRedisConnection<byte[], byte[]>>> own = new ConcurrentHashMap<>();

  LettuceClusterTransport(RedisClusterClient cluster) {
    if (cluster == null) {
      throw new IllegalArgumentException("the Lettuce cluster client must not be null");
    }
    this.cluster = cluster;
    this.nodes = RedisClient.create(cluster.getResources());
    // A call on a node that went away fails at once (and is resent to the slot's new owner).
    this.nodes.setOptions(ClientOptions.builder()
        .autoReconnect(false)
        .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
        .build());
  }

  @Override
  public boolean cluster() {
    return true;
  }

  private RedisURI uri(String node) {
    int colon = node.lastIndexOf(':');
    String host = node.substring(0, colon);
    int port = Integer.parseInt(node.substring(colon + 1));
    Partitions partitions = cluster.getPartitions();
    RedisURI template = null;
    for (RedisClusterNode n : partitions) {
      RedisURI u = n.getUri();
      if (u.getHost().equals(host) && u.getPort() == port) {
        return u;
      }
      template = u;
    }
    if (template == null) {
      return RedisURI.create(host, port);
    }
    return RedisURI.builder(template).withHost(host).withPort(port).build();
  }

  @Override
  public Conn open(String node, boolean dedicated) {
    if (dedicated) {
      return LettuceConn.take(own.computeIfAbsent(node,
          key -> LettuceConn.spares(() -> nodes.connect(ByteArrayCodec.INSTANCE, uri(key)))));
    }
    StatefulRedisConnection<byte[], byte[]> c = shared.compute(node, (key, old) -> {
      if (old != null && old.isOpen()) {
        return old;
      }
      return nodes.connect(ByteArrayCodec.INSTANCE, uri(key));
    });
    return new LettuceConn(c, false);
  }

  @Override
  public String ownerOf(int slot) {
    RedisClusterNode node = cluster.getPartitions().getMasterBySlot(slot);
    if (node == null) {
      throw new RedisConnectionException("no primary serves slot " + slot + " yet");
    }
    return node.getUri().getHost() + ":" + node.getUri().getPort();
  }

  @Override
  public void refreshTopology() {
    // In the background: a MOVED is followed at once, and a pause waits anyway.
    cluster.refreshPartitionsAsync();
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
    for (Spares<StatefulRedisConnection<byte[], byte[]>> pool : own.values()) {
      pool.close();
    }
    for (StatefulRedisConnection<byte[], byte[]> c : shared.values()) {
      c.close();
    }
    shared.clear();
    nodes.shutdown();
  }
}
