//! A local Redis Cluster for tests: primaries and replicas on loopback, the module loaded on
//! every node.
