package io.redsem;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.models.partitions.Partitions;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.ByteArrayCodec;

/**
 * Lettuce, Redis Cluster: the slots' owners from the cluster client's view of the topology, and
 * redsem's connections to each node ({@link LettuceTransport}) made with the cluster client's
 * resources and each node's URI (its credentials and TLS included).
 */
final class LettuceClusterTransport extends LettuceTransport {
  private final RedisClusterClient cluster;
  private final RedisClient nodes;

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

  @Override
  StatefulRedisConnection<byte[], byte[]> connect(String node) {
    return nodes.connect(ByteArrayCodec.INSTANCE, uri(node));
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
  public void close() {
    super.close();
    nodes.shutdown();
  }
}
