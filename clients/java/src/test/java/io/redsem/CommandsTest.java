package io.redsem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

/** The rules of Redis Cluster as the package applies them, before anything is sent, and the
 * script line's messages. */
class CommandsTest {
  @Test
  void anHMessageGivesTheMillisecondsToALeasesEnd() {
    assertEquals(120, ScriptWait.nudgeMillis("H120"));
    // "H" alone (an older script's): try again, which says when.
    assertEquals(0, ScriptWait.nudgeMillis("H"));
    assertEquals(0, ScriptWait.nudgeMillis("Hx"));
    assertEquals(0, ScriptWait.nudgeMillis("H-5"));
    assertEquals(0, ScriptWait.nudgeMillis("G17"));
    assertEquals(0, ScriptWait.nudgeMillis(""));
  }

  @Test
  void aWaitRefusedByANodeThatBecameAReplicaIsAPauseAsACutWait() {
    assertEquals(Transport.Failure.Kind.PAUSE, Transport.Failure.ofServerError(
        "ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 "
        + "if a replica is configured to be writable (which is not the default) writes to "
        + "replicas are just local and are not propagated.").kind);
    assertEquals(Transport.Failure.Kind.PAUSE,
        Transport.Failure.ofServerError("UNBLOCKED force unblock").kind);
    assertEquals(Transport.Failure.Kind.OTHER,
        Transport.Failure.ofServerError("ERR syntax error").kind);
  }

  @Test
  void slotsAreRedisClusters() {
    assertEquals(15495, Commands.slot("a"));
    assertEquals(3300, Commands.slot("b"));
    assertEquals(12182, Commands.slot("foo"));
    for (String key : List.of("jobs", "{x}y", "app:{jobs}:owner", "\u00e9t\u00e9", "")) {
      assertEquals(io.lettuce.core.cluster.SlotHash.getSlot(key), Commands.slot(key), key);
    }
    assertEquals(Commands.slot("jobs"), Commands.slot("{jobs}:owner"));
    assertEquals(Commands.slot("jobs"), Commands.slot("app:{jobs}"));
    // An empty tag is no tag: the whole key is hashed.
    assertEquals(Commands.slot("{}jobs"), Commands.slot("{}jobs"));
    assertEquals(null, Commands.hashTag(Commands.bytes("{}jobs")));
  }

  @Test
  void aNameWithoutAHashTagIsRefusedInCluster() {
    IllegalArgumentException error = assertThrows(IllegalArgumentException.class,
        () -> Commands.clusterSlot(List.of("jobs")));
    assertEquals("in Redis Cluster a semaphore's name needs a hash tag, e.g. \"{jobs}\" or "
        + "\"app:{jobs}\": the keys of \"jobs\" (jobs, jobs:owner, jobs:counter, jobs:permits, "
        + "jobs:limit) would fall in different slots", error.getMessage());
    assertEquals(Commands.slot("jobs"), Commands.clusterSlot(List.of("{jobs}")));
  }

  @Test
  void aSetAcrossSlotsIsRefusedInCluster() {
    IllegalArgumentException error = assertThrows(IllegalArgumentException.class,
        () -> Commands.clusterSlot(List.of("{a}", "{b}")));
    assertEquals("in Redis Cluster the semaphores of a set must share a slot: give their names "
        + "one hash tag, e.g. \"{app}a\" and \"{app}b\" (\"{a}\" is in slot 15495, \"{b}\" in "
        + "slot 3300)", error.getMessage());
    assertEquals(Commands.slot("app"), Commands.clusterSlot(List.of("{app}a", "{app}b")));
  }

  @Test
  void theLongFormNamesEveryKey() {
    assertEquals(List.of("SEM.ACQUIRE", "{j}", "{j}:owner", "{j}:counter", "{j}:permits",
            "{j}:limit", 3, "30.000"),
        Commands.longForm(List.of("SEM.ACQUIRE", "{j}", 3, "30.000"), List.of("{j}")));
    assertEquals(List.of("SEM.RELEASEALL", 2, "{a}x", "{a}y", "id", "{a}x:owner", "{a}x:counter",
            "{a}x:permits", "{a}x:limit", "{a}y:owner", "{a}y:counter", "{a}y:permits",
            "{a}y:limit"),
        Commands.longForm(List.of("SEM.RELEASEALL", 2, "{a}x", "{a}y", "id"),
            List.of("{a}x", "{a}y")));
    assertEquals(List.of("WAIT", 1, 100), Commands.longForm(List.of("WAIT", 1, 100), List.of("{j}")));
  }

  @Test
  void timesAreSentInMilliseconds() {
    assertEquals("30.000", Commands.secondsOfNanos(30_000_000_000L));
    assertEquals("0.250", Commands.secondsOfNanos(250_000_000L));
    assertEquals("0.001", Commands.secondsOfNanos(1), "a positive time never rounds to none");
  }

  @Test
  void timesAreSentWithThreeDecimals() {
    assertEquals("0.007", Commands.seconds(7));
    assertEquals("0.070", Commands.seconds(70));
    assertEquals("12.345", Commands.seconds(12_345));
    assertEquals("31536000.000", Commands.seconds(31_536_000_000L));
  }

  @Test
  void identifiersAreUuidV4FormsNeverRepeated() {
    java.util.Set<String> seen = new java.util.HashSet<>();
    java.util.regex.Pattern v4 = java.util.regex.Pattern.compile(
        "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
    for (int i = 0; i < 100_000; i++) {
      String id = Commands.newId();
      assertTrue(v4.matcher(id).matches(), id);
      assertTrue(seen.add(id), "repeated: " + id);
      assertEquals(4, java.util.UUID.fromString(id).version());
    }
  }
}
