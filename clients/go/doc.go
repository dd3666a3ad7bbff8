// Package redsem holds permits of redsem semaphores (the Redis module sem) through go-redis
// v9: a *redis.Client (redis.NewClient, redis.NewFailoverClient) or a *redis.ClusterClient.
//
// Where the server has the module loaded it sends the module's commands; where it has not (a
// managed service), it runs the same operations as one Lua script (redsem.lua, embedded) over
// the same keys, found out per client (per node in Redis Cluster) with COMMAND INFO
// SEM.ACQUIRE, asked again every 10 s while the module is missing. What only the module does (Bound, sets, WaitEmpty) returns ErrModuleRequired
// there, before anything is sent.
//
//	permit, err := redsem.Acquire(ctx, rdb, "jobs", redsem.Options{Limit: 3, Wait: 10 * time.Second})
//	if err != nil {
//		return err // errors.Is(err, redsem.ErrNotAcquired): the semaphore stayed full
//	}
//	// Given back however the function ends (err is its named result); ErrPermitLost: the
//	// lease ran out during the work, which may have overlapped another holder's.
//	defer func() { err = errors.Join(err, permit.Release(ctx)) }()
//	return work(permit.Context()) // cancelled once the permit is lost
//
// A Semaphore (NewSemaphore) is a handle on one name with the options of its acquires:
// TryAcquire never waits, Acquire waits until a permit is free or the context ends, as
// golang.org/x/sync/semaphore's Weighted does. The zero Options is a mutex (limit 1) with
// DefaultLease.
//
// The identifier is made here (a UUID v4) unless Options.ID gives one, so a resent acquire
// renews the same holder rather than taking a second permit. A permit is refreshed every
// lease/3 by its client's scheduler (one goroutine for all of the client's permits, running
// while any is held; each refresh borrows a connection of the client's pool for that call),
// so a held permit keeps no connection and no goroutine of its own; a refresh that finds it
// gone, or no refresh confirmed within a lease, marks it lost: Lost, Check and Context tell
// the work to stop. A waiting call holds one connection while it waits, as BLPOP does, taken
// outside the client's pool: up to the client's PoolSize at once, the others queued in arrival
// order for as long as their own waits last.
//
// In Redis Cluster a name needs a hash tag ("{jobs}", "app:{jobs}") and the names of a set
// one slot, checked before anything is sent; every call goes to the primary serving the
// name's slot, in the long form (every key named), and a move of the slot or a failover of
// its primary is waited out: the call is resent, with the same identifier, until it has an
// answer or RetryFor (30 s) has passed.
package redsem
