// Compiled by tsc (never run): the declarations accept both libraries' clients and give the
// types a user relies on. A wrong declaration fails the compile.
import Redis, { Cluster } from "ioredis";
import { createClient, createCluster } from "redis";
import {
  acquire,
  acquireAll,
  clearLimit,
  setLimit,
  setPoolSize,
  storedLimit,
  waitEmpty,
  withPermit,
  withPermits,
  ModuleRequired,
  NotAcquired,
  NotDurable,
  Permit,
  PermitLost,
  PermitOptions,
  PermitSet,
  SemaphoreError,
  SetSemaphore,
} from "redsem-client";

export async function withIoredis(): Promise<number> {
  const redis = new Redis(6379);
  const permit: Permit = await acquire(redis, "jobs", { limit: 3, lease: 30, wait: 10 });
  const ticket: number | null = permit.ticket;
  const lost: PermitLost = await permit.whenLost;
  fetch("http://127.0.0.1/", { signal: permit.signal }).catch(() => undefined);
  return (ticket ?? 0) + lost.message.length + (await permit.release() ? 1 : 0);
}

export async function withNodeRedis(): Promise<string> {
  const client = await createClient({ url: "redis://127.0.0.1:6379" }).connect();
  const options: PermitOptions = { limit: 1, fair: true, bound: true, count: null };
  return withPermit(client, "printers", options, async (permit) => {
    permit.check();
    await permit.refresh();
    return permit.id;
  });
}

export async function sets(): Promise<boolean> {
  const redis = new Redis(6379);
  const pair: SetSemaphore[] = [{ name: "gpu", limit: 1 }, { name: "licence", limit: 5, count: 2 }];
  const permits: PermitSet = await acquireAll(redis, pair, { lease: 30, fair: true, wait: 10 });
  const tickets: readonly number[] | null = permits.tickets;
  const names: readonly string[] = permits.names;
  const client = await createClient({ url: "redis://127.0.0.1:6379" }).connect();
  const id: string = await withPermits(client, pair, { bound: true }, async (held) => {
    held.check();
    return held.id;
  });
  const empty: boolean = await waitEmpty(client, "gpu", Infinity);
  return (tickets?.length ?? 0) + names.length + id.length > 0 && empty && (await permits.release());
}

export async function operatorsLimit(): Promise<number> {
  const redis = new Redis(6379);
  const client = await createClient({ url: "redis://127.0.0.1:6379" }).connect();
  await setLimit(redis, "jobs", 0);
  const done: void = await setLimit(client, "jobs", 5);
  const stored: number | null = await storedLimit(client, "jobs");
  const cleared: boolean = await clearLimit(redis, "jobs");
  setPoolSize(redis, 16);
  setPoolSize(client, 0);
  // @ts-expect-error the stored limit may be null
  const always: number = await storedLimit(redis, "jobs");
  return (stored ?? 0) + (cleared ? 1 : 0) + always + (done === undefined ? 0 : 1);
}

export async function withClusters(): Promise<number> {
  const cluster = new Cluster([{ host: "127.0.0.1", port: 7000 }]);
  const permit: Permit = await acquire(cluster, "{jobs}", { limit: 3, wait: 10, retryFor: 5 });
  const pair: SetSemaphore[] = [{ name: "{app}gpu", limit: 1 }, { name: "{app}licence", limit: 5 }];
  const permits: PermitSet = await acquireAll(cluster, pair, { wait: 1, retryFor: 10 });
  const nodeRedis = createCluster({ rootNodes: [{ url: "redis://127.0.0.1:7000" }] });
  await nodeRedis.connect();
  const fair: PermitOptions = { limit: 1, fair: true };
  const ticket = await withPermit(nodeRedis, "app:{jobs}", fair, (held) => held.ticket);
  const empty: boolean = await waitEmpty(nodeRedis, "{jobs}", 5, { retryFor: 10 });
  await setLimit(cluster, "{jobs}", 2, { retryFor: 0 });
  const stored: number | null = await storedLimit(nodeRedis, "{jobs}");
  const cleared: boolean = await clearLimit(nodeRedis, "{jobs}", {});
  setPoolSize(cluster, 4);
  const id: string = await withPermits(nodeRedis, pair, {}, (held) => held.id);
  await permits.release();
  const released = await permit.release();
  return (ticket ?? 0) + (stored ?? 0) + id.length + (empty && cleared && released ? 1 : 0);
}

// @ts-expect-error the retry budget is a number of seconds
export const budgetAsText = storedLimit(new Redis(6379), "{jobs}", { retryFor: "30" });

// @ts-expect-error a limit is a number
export const limitAsText = setLimit(new Redis(6379), "jobs", "5");

// @ts-expect-error a semaphore of a set needs a limit
export const missingSetLimit: SetSemaphore = { name: "gpu" };

export function errors(err: unknown): string {
  if (err instanceof NotDurable) return `${err.acked} of ${err.wanted}`;
  if (err instanceof NotAcquired || err instanceof PermitLost) return err.message;
  if (err instanceof ModuleRequired) {
    const base: SemaphoreError = err;
    return base.name;
  }
  return "";
}

export async function cancelled(): Promise<number> {
  const redis = new Redis(6379);
  const controller = new AbortController();
  const options: PermitOptions = { limit: 1, wait: 10, signal: controller.signal };
  const permit: Permit = await acquire(redis, "jobs", options);
  const timeout: PermitOptions = { limit: 1, signal: AbortSignal.timeout(100) };
  const timed = await withPermit(redis, "jobs", timeout, () => 1);
  const pair: SetSemaphore[] = [{ name: "gpu", limit: 1 }];
  const permits: PermitSet = await acquireAll(redis, pair, { wait: 1, signal: null });
  const setOptions = { signal: controller.signal };
  const held = await withPermits(redis, pair, setOptions, (set) => set.names.length);
  return timed + held + ((await permit.release()) && (await permits.release()) ? 1 : 0);
}

// @ts-expect-error a signal is an AbortSignal
export const signalAsText: PermitOptions = { limit: 1, signal: "abort" };

// @ts-expect-error a limit is required
export const missingLimit: PermitOptions = { lease: 30 };

// @ts-expect-error a permit is not constructed by hand
export const made = new Permit();
