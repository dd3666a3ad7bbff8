package io.redsem;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

/**
 * Permits of several semaphores taken at once ({@code SEM.ACQUIREALL}): refreshed together
 * ({@code SEM.REFRESHALL}) every lease/3, and lost as soon as any one of them is; given back
 * together ({@code SEM.RELEASEALL}) by {@link #release()} or at the end of its
 * try-with-resources block.
 */
public final class PermitSet extends Held {
  private final List<String> names;
  private final List<Long> counts;
  private final Optional<List<Long>> tickets;

  PermitSet(List<String> names, List<Long> counts, String id, Optional<List<Long>> tickets,
      long leaseNanos, Line line, long sent) {
    super(id, leaseNanos, line, sent);
    this.names = List.copyOf(names);
    this.counts = List.copyOf(counts);
    this.tickets = tickets;
  }

  /** The semaphores' names, in the order given. */
  public List<String> names() {
    return names;
  }

  /** The permits held of each, in the same order. */
  public List<Long> counts() {
    return counts;
  }

  /** With {@code fair}: the fencing ticket of each semaphore, in the same order. */
  public Optional<List<Long>> tickets() {
    return tickets;
  }

  @Override
  String what() {
    return "the set " + String.join(", ", names);
  }

  @Override
  int wanted() {
    return names.size();
  }

  @Override
  List<Object> refreshArgs() {
    List<Object> args = new ArrayList<>();
    args.add("SEM.REFRESHALL");
    args.add(names.size());
    args.addAll(names);
    args.add(id);
    args.add(Commands.secondsOfNanos(leaseNanos));
    return args;
  }

  @Override
  List<Object> releaseArgs() {
    List<Object> args = new ArrayList<>();
    args.add("SEM.RELEASEALL");
    args.add(names.size());
    args.addAll(names);
    args.add(id);
    return args;
  }

  @Override
  public String toString() {
    return "PermitSet[" + names + " id=" + id
        + tickets.map(t -> " tickets=" + t).orElse("") + " counts=" + counts + " " + state()
        + "]";
  }
}
