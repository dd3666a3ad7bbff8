package io.redsem;

import java.util.List;
import java.util.OptionalLong;

/**
 * A granted permit of one semaphore: refreshed in the background every lease/3 while held, and
 * given back by {@link #release()} or at the end of its try-with-resources block.
 */
public final class Permit extends Held {
  private final String name;
  private final OptionalLong ticket;
  private volatile long count;

  Permit(String name, String id, OptionalLong ticket, long count, long leaseNanos, Line line,
      long sent) {
    super(id, leaseNanos, line, sent);
    this.name = name;
    this.ticket = ticket;
    this.count = count;
  }

  /** The semaphore's name. */
  public String name() {
    return name;
  }

  /** The fencing ticket of a fair permit (it only ever grows per name); empty when not fair. */
  public OptionalLong ticket() {
    return ticket;
  }

  /** The number of permits held ({@code COUNT}). */
  public long count() {
    return count;
  }

  /**
   * Gives back {@code k} of a weighted permit's permits and keeps holding the rest (with its
   * deadline and ticket). Returns false, and marks it lost, if it had run out.
   */
  public boolean releaseSome(long k) {
    if (k < 1 || k >= count) {
      throw new IllegalArgumentException(
          "count must be from 1 to " + (count - 1) + " (got " + k + "); use release() for all");
    }
    Object reply = call(List.of("SEM.RELEASE", name, id, "COUNT", k));
    if (Commands.integer(reply) == 1) {
      count -= k;
      return true;
    }
    markLost("SEM.RELEASE answered 0: the lease ran out before the release");
    return false;
  }

  @Override
  String what() {
    return "\"" + name + "\"";
  }

  @Override
  int wanted() {
    return 1;
  }

  @Override
  List<Object> refreshArgs() {
    return List.of("SEM.REFRESH", name, id, Commands.secondsOfNanos(leaseNanos));
  }

  @Override
  List<Object> releaseArgs() {
    return List.of("SEM.RELEASE", name, id);
  }

  @Override
  public String toString() {
    return "Permit[" + name + " id=" + id
        + (ticket.isPresent() ? " ticket=" + ticket.getAsLong() : "") + " count=" + count + " "
        + state() + "]";
  }
}
