package redsem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	redsem "github.com/redsem/redsem-client-go"
)

// The README's examples, compiled with the tests.

func ExampleAcquire() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	// At most 3 holders of "jobs"; wait up to 10 s for a permit (or until ctx ends).
	permit, err := redsem.Acquire(ctx, rdb, "jobs", redsem.Options{
		Limit: 3, Lease: 30 * time.Second, Wait: 10 * time.Second,
	})
	if errors.Is(err, redsem.ErrNotAcquired) {
		fmt.Println("still full after 10 s")
		return
	} else if err != nil {
		panic(err)
	}
	work := permit.Context() // cancelled once the permit is lost: pass it to the work
	for item := 0; item < 3 && work.Err() == nil; item++ {
		fmt.Println("working on", item, "as", permit.ID())
	}
	if err := permit.Release(ctx); errors.Is(err, redsem.ErrPermitLost) {
		fmt.Println("the lease ran out during the work:", err)
	}

	// Fair: first come, first served, and each holder gets a fencing ticket.
	printer, err := redsem.Acquire(ctx, rdb, "printers", redsem.Options{Limit: 1, Fair: true})
	if err == nil {
		fmt.Println("holder", printer.ID(), "has ticket", printer.Ticket())
		if err := printer.Release(ctx); err != nil {
			fmt.Println("the work under ticket", printer.Ticket(), "may have overlapped:", err)
		}
	}
}

func work(ctx context.Context) error { return ctx.Err() }

func jobs(ctx context.Context, cluster *redis.ClusterClient) (err error) {
	permit, err := redsem.Acquire(ctx, cluster, "{jobs}", redsem.Options{Limit: 3, Wait: 10 * time.Second})
	if err != nil {
		return err
	}
	// Given back however jobs ends, even once ctx is over; its answer joins jobs's error
	// (ErrPermitLost: the lease ran out, and the work may have overlapped another holder's).
	defer func() { err = errors.Join(err, permit.Release(ctx)) }()
	return work(permit.Context())
}

func ExampleAcquire_cluster() {
	cluster := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	defer cluster.Close()
	fmt.Println(jobs(context.Background(), cluster))
}

func ExampleAcquireAll() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	// One GPU and 2 of 5 licences, both or neither; wait up to 10 s for the pair.
	permits, err := redsem.AcquireAll(ctx, rdb, []redsem.Member{
		{Name: "gpu", Limit: 1},
		{Name: "licence", Limit: 5, Count: 2},
	}, redsem.SetOptions{Wait: 10 * time.Second, Fair: true})
	if err != nil {
		return
	}
	fmt.Println("holding", permits.Names(), "with tickets", permits.Tickets())
	if err := permits.Release(ctx); err != nil {
		fmt.Println(err) // ErrPermitLost: a permit of the set ran out during the work
		return
	}

	// A deploy waits until no job holds "deploys" any more (at most 60 s).
	drained, err := redsem.WaitEmpty(ctx, rdb, "deploys", 60*time.Second)
	fmt.Println(drained, err)
}

func ExampleSetLimit() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	// Pause "reports": while 0 is stored, every acquire is refused, whatever limit it passes.
	_ = redsem.SetLimit(ctx, rdb, "reports", 0)
	limit, stored, _ := redsem.StoredLimit(ctx, rdb, "reports") // 0, true
	// At most 2 holders at once, whatever the callers pass, until it is cleared.
	_ = redsem.SetLimit(ctx, rdb, "reports", 2)
	cleared, _ := redsem.ClearLimit(ctx, rdb, "reports") // true: a limit was stored
	fmt.Println(limit, stored, cleared)
}

func ExampleNewSemaphore() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	run := func() error {
		// Made once: the name, the client and the options of every acquire (checked here).
		jobs, err := redsem.NewSemaphore(rdb, "jobs", redsem.Options{Limit: 3})
		if err != nil {
			return err // ErrBadInput
		}
		permit, err := jobs.TryAcquire(ctx) // never waits: ErrNotAcquired while all 3 are held
		if errors.Is(err, redsem.ErrNotAcquired) {
			permit, err = jobs.Acquire(ctx) // waits in the server until one is free or ctx ends
		}
		if err != nil {
			return err
		}
		defer permit.Release(ctx)
		return work(permit.Context())
	}
	_ = run()
}
