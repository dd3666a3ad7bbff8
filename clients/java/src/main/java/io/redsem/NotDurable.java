package io.redsem;

/**
 * Fewer replicas than {@code durableReplicas} acknowledged the grant in time; the permit was
 * given back.
 */
public class NotDurable extends RedsemException {
  private static final long serialVersionUID = 1L;
  private final long acked;
  private final long wanted;

  public NotDurable(String message, long acked, long wanted) {
    super(message);
    this.acked = acked;
    this.wanted = wanted;
  }

  /** The replicas that acknowledged the grant. */
  public long acked() {
    return acked;
  }

  /** The replicas asked for ({@code durableReplicas}). */
  public long wanted() {
    return wanted;
  }
}
