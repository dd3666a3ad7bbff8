// Types of redsem.js: permits of redsem semaphores (the Redis module `sem`, or its Lua script
// where the server has no module) for ioredis and node-redis, plain or Redis Cluster clients.
// The clients are described by what the package uses of them, so this file needs neither
// library's types and accepts either's clients.

/** An ioredis client (`new Redis()`), as far as a permit uses it. */
export interface IORedisClient {
  call(command: string, ...args: (string | number | Buffer)[]): Promise<unknown>;
  duplicate(override?: { commandTimeout?: number }): IORedisClient;
  quit(): Promise<unknown>;
  disconnect(): void;
  options?: { commandTimeout?: number };
}

/** A connected node-redis client (`await createClient().connect()`), as a permit uses it. */
export interface NodeRedisClient {
  sendCommand(args: Array<string | Buffer>): Promise<unknown>;
  duplicate(): NodeRedisClient;
  connect(): Promise<unknown>;
  on(event: "error", listener: (err: Error) => void): unknown;
}

/** An ioredis Cluster (`new Redis.Cluster([...])`), as the package uses it. */
export interface IORedisCluster {
  readonly isCluster: boolean;
  /** The node key ("host:port") of each slot's primary, then its replicas. */
  slots: string[][];
  nodes(role?: "all" | "master" | "slave"): IORedisClient[];
  refreshSlotsCache(callback?: (err?: Error | null) => void): void;
}

/** A connected node-redis cluster (`await createCluster(...).connect()`, node-redis 5). */
export interface NodeRedisCluster {
  readonly nodeByAddress: ReadonlyMap<string, object>;
  nodeClient(node: object): unknown;
}

/**
 * A client the package takes: a plain one, or a Redis Cluster client (then every name needs a
 * hash tag, e.g. "{jobs}", and a set's names one slot).
 */
export type Client = IORedisClient | NodeRedisClient | IORedisCluster | NodeRedisCluster;

/** What the calls that take no permit accept. */
export interface CallOptions {
  /**
   * Redis Cluster only: seconds a call is resent through moves and failovers (the same call,
   * the same identifier) before it gives up with a SemaphoreError. Default 30; 0: no retries.
   */
  retryFor?: number;
}

export interface PermitOptions {
  /** Permits of the semaphore in all, from 1 to 4294967295. */
  limit: number;
  /** Seconds (milliseconds count); refreshed every lease/3. Default 30. */
  lease?: number;
  /** Seconds to wait in the server; null or 0: no waiting, Infinity: no limit. */
  wait?: number | null;
  /** SEM.ACQUIREFAIR: first come, first served, and `ticket` is a fencing token. */
  fair?: boolean;
  /** Permits taken at once, all or none. */
  count?: number | null;
  /** Given back when the permit's connection closes. Needs the module (else ModuleRequired). */
  bound?: boolean;
  /** The holder's identifier (default: a new UUID v4); it names one permit. */
  id?: string | null;
  /** Replicas that must acknowledge the grant (WAIT numreplicas). Default 0. */
  durableReplicas?: number;
  /** How long to wait for them, in milliseconds. Default 1000. */
  durableTimeoutMs?: number;
  /** Refresh in the background every lease/3. Default true. */
  autoRefresh?: boolean;
  /** Redis Cluster only: seconds a call is resent through moves and failovers. Default 30. */
  retryFor?: number;
  /**
   * Cancels the acquire, as fetch's `signal` cancels a request: on abort its wait ends in the
   * server, the promise rejects with `signal.reason` (an AbortError by default), and a grant
   * that came meanwhile is given back. Already aborted: rejects at once, sending nothing.
   */
  signal?: AbortSignal | null;
}

export class SemaphoreError extends Error {}
/** No permit was granted: the semaphore was full (for `wait` seconds, when waiting). */
export class NotAcquired extends SemaphoreError {}
/** The permit ran out before it was given back: the work it guarded may have overlapped. */
export class PermitLost extends SemaphoreError {}
/**
 * The server has no redsem module, and what was asked needs it (`bound`, a set of semaphores,
 * waitEmpty, any call through an ioredis client with a `keyPrefix`): rejected before anything
 * was sent. Its `name` is "ModuleRequired".
 */
export class ModuleRequired extends SemaphoreError {}
/** Fewer replicas than `durableReplicas` acknowledged the grant in time; it was given back. */
export class NotDurable extends SemaphoreError {
  constructor(message: string, acked: number, wanted: number);
  readonly acked: number;
  readonly wanted: number;
}

export class Permit {
  private constructor();
  readonly name: string;
  /** The holder's identifier: `id`, or the UUID v4 made for this permit. */
  readonly id: string;
  /** The fencing ticket of a fair permit (only ever grows per name), else null. */
  readonly ticket: number | null;
  /** The number of permits held (COUNT). */
  readonly count: number;
  readonly lease: number;
  /** Aborted (with the PermitLost error as its reason) when the permit is lost. */
  readonly signal: AbortSignal;
  /** Resolves with the PermitLost error when the permit is lost; never rejects. */
  readonly whenLost: Promise<PermitLost>;
  /** True once the permit may have run out; it stays true. */
  readonly lost: boolean;
  /** Throws PermitLost if the permit is lost. */
  check(): void;
  /** Moves the deadline to now + lease; false if the permit was lost. */
  refresh(): Promise<boolean>;
  /** Gives back `count` of a weighted permit's permits and keeps the rest. */
  releaseSome(count: number): Promise<boolean>;
  /** Gives the permit back: true if it was held throughout, false if it was lost. */
  release(): Promise<boolean>;
}

/** One semaphore of a set: `count` (default 1) of its `limit` permits. */
export interface SetSemaphore {
  name: string;
  /** Permits of the semaphore in all, from 1 to 4294967295. */
  limit: number;
  /** Permits of it taken, from 1 to `limit`. Default 1. */
  count?: number;
}

export interface SetOptions {
  /** Seconds (milliseconds count), the same for every semaphore; refreshed every lease/3. */
  lease?: number;
  /** Seconds to wait in the server for the whole set; null or 0: no waiting, Infinity: no limit. */
  wait?: number | null;
  /** Every semaphore is a fair one; `tickets` has one fencing ticket per semaphore. */
  fair?: boolean;
  /** Every permit of the set is given back when the set's connection closes. */
  bound?: boolean;
  /** The holder's identifier in every semaphore (default: a new UUID v4). */
  id?: string | null;
  /** Refresh in the background every lease/3. Default true. */
  autoRefresh?: boolean;
  /** Redis Cluster only: seconds a call is resent through moves and failovers. Default 30. */
  retryFor?: number;
  /**
   * Cancels the acquire, as fetch's `signal` cancels a request: on abort its wait ends in the
   * server, the promise rejects with `signal.reason` (an AbortError by default), and a grant
   * that came meanwhile is given back. Already aborted: rejects at once, sending nothing.
   */
  signal?: AbortSignal | null;
}

/**
 * Permits of several semaphores taken at once: refreshed together, lost as soon as any one of
 * them is, given back together.
 */
export class PermitSet {
  private constructor();
  /** The holder's identifier: `id`, or the UUID v4 made for this set. */
  readonly id: string;
  /** The semaphores' names, in the order given. */
  readonly names: readonly string[];
  /** The permits held of each, in the same order. */
  readonly counts: readonly number[];
  /** With `fair`: one fencing ticket per semaphore, in the same order; else null. */
  readonly tickets: readonly number[] | null;
  readonly lease: number;
  /** Aborted (with the PermitLost error as its reason) when a permit of the set is lost. */
  readonly signal: AbortSignal;
  /** Resolves with the PermitLost error when a permit of the set is lost; never rejects. */
  readonly whenLost: Promise<PermitLost>;
  /** True once a permit of the set may have run out; it stays true. */
  readonly lost: boolean;
  /** Throws PermitLost if a permit of the set is lost. */
  check(): void;
  /** Moves every deadline to now + lease; false if a permit of the set was lost. */
  refresh(): Promise<boolean>;
  /** Gives every permit back: true if all were held throughout, false if one was lost. */
  release(): Promise<boolean>;
}

/** Takes a permit of the semaphore `name`, or rejects with NotAcquired (or NotDurable). */
export function acquire(redis: Client, name: string, options: PermitOptions): Promise<Permit>;

/**
 * Runs `work(permit)` holding a permit and gives it back afterwards; rejects with the work's
 * error, or with PermitLost if the permit ran out during the work.
 */
export function withPermit<T>(
  redis: Client,
  name: string,
  options: PermitOptions,
  work: (permit: Permit) => Promise<T> | T,
): Promise<T>;

/**
 * Takes permits of several semaphores at once, all or none; rejects with NotAcquired. Needs the
 * module (else ModuleRequired).
 */
export function acquireAll(
  redis: Client,
  semaphores: readonly SetSemaphore[],
  options?: SetOptions,
): Promise<PermitSet>;

/**
 * Runs `work(permits)` holding every permit of the set and gives them back afterwards; rejects
 * with the work's error, or with PermitLost if a permit ran out during the work. Needs the
 * module (else ModuleRequired).
 */
export function withPermits<T>(
  redis: Client,
  semaphores: readonly SetSemaphore[],
  options: SetOptions,
  work: (permits: PermitSet) => Promise<T> | T,
): Promise<T>;

/**
 * Waits, on a pooled connection, until the semaphore `name` has no live holder: true once
 * it has none, false when `timeout` seconds pass first (Infinity: no limit; 0 looks once).
 * Needs the module (else ModuleRequired).
 */
export function waitEmpty(
  redis: Client,
  name: string,
  timeout: number,
  options?: CallOptions,
): Promise<boolean>;

/**
 * The operator's limit stored for the semaphore `name` (`SEM.LIMIT name`), or null when there
 * is none. While one is stored, every acquire of `name` uses it instead of its own.
 */
export function storedLimit(
  redis: Client,
  name: string,
  options?: CallOptions,
): Promise<number | null>;

/**
 * Stores an operator's limit for `name` (`SEM.LIMIT name n`), an integer from 0 (pauses) to
 * 4294967295, used by every acquire of `name` instead of its own until clearLimit.
 */
export function setLimit(
  redis: Client,
  name: string,
  limit: number,
  options?: CallOptions,
): Promise<void>;

/**
 * Removes the operator's limit of `name` (`SEM.LIMIT name CLEAR`): true if one was stored.
 */
export function clearLimit(redis: Client, name: string, options?: CallOptions): Promise<boolean>;

/**
 * How many idle connections the package keeps for `redis` (per node for a cluster client) to
 * reuse for calls that block (a wait, waitEmpty); default 8, 0 keeps none. More waits at once
 * than that open more connections, closed after their wait. An integer of at least 0.
 */
export function setPoolSize(redis: Client, size: number): void;
