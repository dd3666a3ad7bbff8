package redsem

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var bg = context.Background()

func TestScriptCopyMatchesSource(t *testing.T) {
	source, err := os.ReadFile("../scripts/redsem.lua")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("not in the redsem repository: ../scripts/redsem.lua is absent")
	}
	require.NoError(t, err)
	require.Equal(t, string(source), scriptSource,
		"redsem.lua differs from clients/scripts/redsem.lua: run `go generate` in clients/go")
}

// A duration as the module reads it: seconds with three decimals, rounded to the
// millisecond, a positive one never down to zero.
func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0.000", time.Nanosecond: "0.001", 1500 * time.Millisecond: "1.500",
		DefaultLease: "30.000", 2*time.Second + 400*time.Microsecond: "2.000",
		2*time.Second + 500*time.Microsecond: "2.001", 61*time.Second + 7*time.Millisecond: "61.007",
		maxLease: "31536000.000",
	} {
		assert.Equal(t, want, seconds(d), "%s", d)
	}
}

func TestAcquireRelease(t *testing.T) {
	_, c := testServer(t)
	a, err := Acquire(bg, c, "jobs", Options{Limit: 2, Lease: 10 * time.Second})
	require.NoError(t, err)
	b, err := Acquire(bg, c, "jobs", Options{Limit: 2, Lease: 10 * time.Second, ID: "worker-7"})
	require.NoError(t, err)
	assert.Equal(t, "worker-7", b.ID())
	assert.Len(t, a.ID(), 36, "a UUID v4")
	assert.Equal(t, int64(2), holders(t, c, "jobs"))

	_, err = Acquire(bg, c, "jobs", Options{Limit: 2})
	require.ErrorIs(t, err, ErrNotAcquired)
	assert.Contains(t, err.Error(), `"jobs" (limit 2)`)

	// The same identifier renews its own permit rather than taking another.
	again, err := Acquire(bg, c, "jobs", Options{Limit: 2, ID: "worker-7", ManualRefresh: true})
	require.NoError(t, err)
	assert.Equal(t, int64(2), holders(t, c, "jobs"))

	require.NoError(t, a.Release(bg))
	require.NoError(t, a.Release(bg), "a second release repeats the answer")
	assert.False(t, a.Lost())
	assert.ErrorIs(t, context.Cause(a.Context()), ErrReleased)
	require.NoError(t, b.Release(bg))
	require.ErrorIs(t, again.Release(bg), ErrPermitLost, "b released the holder already")
	assert.Equal(t, int64(0), holders(t, c, "jobs"))

	w, err := Acquire(bg, c, "jobs", Options{Limit: 1, Count: 1})
	require.NoError(t, err)
	require.NoError(t, w.Release(bg))
}

func TestWeightedCount(t *testing.T) {
	_, c := testServer(t)
	p, err := Acquire(bg, c, "gpus", Options{Limit: 4, Count: 3})
	require.NoError(t, err)
	assert.Equal(t, int64(3), p.Count())
	_, err = Acquire(bg, c, "gpus", Options{Limit: 4, Count: 2})
	require.ErrorIs(t, err, ErrNotAcquired)
	q, err := Acquire(bg, c, "gpus", Options{Limit: 4})
	require.NoError(t, err)
	require.ErrorIs(t, p.ReleaseSome(bg, 3), ErrBadInput, "Release gives back all")
	require.NoError(t, p.ReleaseSome(bg, 2))
	assert.Equal(t, int64(1), p.Count())
	r, err := Acquire(bg, c, "gpus", Options{Limit: 4, Count: 2})
	require.NoError(t, err, "two permits were given back")
	require.NoError(t, r.Release(bg))
	require.NoError(t, p.Release(bg))
	require.NoError(t, q.Release(bg))
}

func TestBackgroundRefreshKeepsThePermit(t *testing.T) {
	_, c := testServer(t)
	p, err := Acquire(bg, c, "refreshed", Options{Limit: 1, Lease: 300 * time.Millisecond})
	require.NoError(t, err)
	time.Sleep(time.Second) // three leases: only the refresh keeps it
	require.NoError(t, p.Check())
	_, err = Acquire(bg, c, "refreshed", Options{Limit: 1})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, p.Release(bg))
}

func TestFairTicketsInGrantOrder(t *testing.T) {
	_, c := testServer(t)
	opts := Options{Limit: 1, Lease: 10 * time.Second, Fair: true}
	first, err := Acquire(bg, c, "printers", opts)
	require.NoError(t, err)
	require.Positive(t, first.Ticket())

	waiting := opts
	waiting.Wait = 10 * time.Second
	type grant struct {
		who    int
		ticket int64
	}
	var mu sync.Mutex
	var grants []grant
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func(who int) {
			defer wg.Done()
			p, err := Acquire(bg, c, "printers", waiting)
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			grants = append(grants, grant{who, p.Ticket()})
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			assert.NoError(t, p.Release(bg))
		}(i)
		time.Sleep(150 * time.Millisecond) // in line one after another
	}
	require.NoError(t, first.Release(bg))
	wg.Wait()
	require.Len(t, grants, 3)
	last := first.Ticket()
	for _, g := range grants {
		assert.Greater(t, g.ticket, last, "tickets grow in grant order")
		last = g.ticket
	}
	if !scriptsBackend() { // the module serves its line first come, first served
		assert.Equal(t, []int{1, 2, 3}, []int{grants[0].who, grants[1].who, grants[2].who})
	}
}

// A name whose keys went between two fair grants (a DEL of the name, its owner set and its
// counter, or FLUSHDB), the two most often within one millisecond, still gives the second a
// ticket above the first, in every round: the script starts again from the server's clock in
// microseconds, the module above every ticket the node handed out.
func TestFairTicketAfterItsKeysWentIsAboveTheOneBefore(t *testing.T) {
	_, c := testServer(t)
	opts := Options{Limit: 1, Lease: 30 * time.Second, Fair: true, ManualRefresh: true}
	var repeats [][3]int64
	for round := 0; round < 200; round++ {
		first, err := Acquire(bg, c, "fence", opts)
		require.NoError(t, err)
		if round%2 == 1 {
			require.NoError(t, c.FlushDB(bg).Err())
		} else {
			require.NoError(t, c.Del(bg, "fence", "fence:owner", "fence:counter").Err())
		}
		second, err := Acquire(bg, c, "fence", opts)
		require.NoError(t, err)
		if second.Ticket() <= first.Ticket() {
			repeats = append(repeats, [3]int64{int64(round), first.Ticket(), second.Ticket()})
		}
		require.ErrorIs(t, first.Release(bg), ErrPermitLost, "its keys went")
		require.NoError(t, second.Release(bg))
	}
	assert.Zero(t, len(repeats), "rounds that gave the second grant a ticket not above the "+
		"first, [round, first, second]: %v", repeats[:min(len(repeats), 5)])
}

func TestWaiterServedOnRelease(t *testing.T) {
	_, c := testServer(t)
	holder, err := Acquire(bg, c, "queue", Options{Limit: 1})
	require.NoError(t, err)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = holder.Release(bg)
	}()
	started := time.Now()
	p, err := Acquire(bg, c, "queue", Options{Limit: 1, Wait: 10 * time.Second})
	require.NoError(t, err)
	took := time.Since(started)
	assert.GreaterOrEqual(t, took, 250*time.Millisecond)
	assert.Less(t, took, 2*time.Second, "served on the release, not at the wait's end")
	require.NoError(t, p.Release(bg))

	// A wait longer than the client's ReadTimeout.
	short := redis.NewClient(&redis.Options{Addr: c.Options().Addr, ReadTimeout: 500 * time.Millisecond})
	defer short.Close()
	holder, err = Acquire(bg, short, "queue", Options{Limit: 1})
	require.NoError(t, err)
	go func() {
		time.Sleep(1200 * time.Millisecond)
		_ = holder.Release(bg)
	}()
	p, err = Acquire(bg, short, "queue", Options{Limit: 1, Wait: 10 * time.Second})
	require.NoError(t, err)
	require.NoError(t, p.Release(bg))

	// Nobody releases: the wait ends with ErrNotAcquired.
	holder, err = Acquire(bg, c, "queue", Options{Limit: 1})
	require.NoError(t, err)
	_, err = Acquire(bg, c, "queue", Options{Limit: 1, Wait: 300 * time.Millisecond})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, holder.Release(bg))
}

func TestContextEndsAWait(t *testing.T) {
	_, c := testServer(t)
	holder, err := Acquire(bg, c, "busy", Options{Limit: 1, Lease: 10 * time.Second})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(bg)
	time.AfterFunc(300*time.Millisecond, cancel)
	started := time.Now()
	_, err = Acquire(ctx, c, "busy", Options{Limit: 1, Wait: 30 * time.Second})
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(started), 2*time.Second)

	ctx, cancel2 := context.WithTimeout(bg, 400*time.Millisecond)
	defer cancel2()
	started = time.Now()
	_, err = Acquire(ctx, c, "busy", Options{Limit: 1, Wait: WaitForever})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(started), 2*time.Second)

	// No waiter is left behind: the next release goes to a new caller.
	require.NoError(t, holder.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "busy"))
	p, err := Acquire(bg, c, "busy", Options{Limit: 1})
	require.NoError(t, err)
	require.NoError(t, p.Release(bg))

	done, cancel3 := context.WithCancel(bg)
	cancel3()
	_, err = Acquire(done, c, "busy", Options{Limit: 1})
	require.ErrorIs(t, err, context.Canceled)
}

func TestConcurrencyNeverOverAdmits(t *testing.T) {
	_, c := testServer(t)
	const limit, workers, rounds = 3, 12, 8
	var inside, most, served atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				p, err := Acquire(bg, c, "pool", Options{Limit: limit, Wait: 20 * time.Second})
				if !assert.NoError(t, err) {
					return
				}
				n := inside.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(2 * time.Millisecond)
				inside.Add(-1)
				served.Add(1)
				assert.NoError(t, p.Release(bg))
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(workers*rounds), served.Load())
	assert.LessOrEqual(t, most.Load(), int64(limit))
	assert.Equal(t, int64(0), holders(t, c, "pool"))
}

func TestLostPermitReported(t *testing.T) {
	_, c := testServer(t)
	p, err := Acquire(bg, c, "fragile", Options{Limit: 1, Lease: 600 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, p.Check())
	require.NoError(t, c.Del(bg, "fragile").Err()) // another client removes the holder

	select {
	case <-p.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the permit's context was not cancelled")
	}
	assert.ErrorIs(t, context.Cause(p.Context()), ErrPermitLost)
	assert.True(t, p.Lost())
	assert.ErrorIs(t, p.Check(), ErrPermitLost)
	assert.Contains(t, p.Check().Error(), "SEM.REFRESH answered 0")
	assert.ErrorIs(t, p.Release(bg), ErrPermitLost)
}

func TestManualRefreshAndLeaseEnd(t *testing.T) {
	_, c := testServer(t)
	p, err := Acquire(bg, c, "manual", Options{Limit: 1, Lease: 200 * time.Millisecond,
		ManualRefresh: true})
	require.NoError(t, err)
	require.NoError(t, p.Refresh(bg))
	time.Sleep(350 * time.Millisecond)
	assert.True(t, p.Lost(), "no refresh was confirmed within the lease")
	assert.ErrorIs(t, p.Refresh(bg), ErrPermitLost)
	assert.ErrorIs(t, p.Release(bg), ErrPermitLost)
}

func TestSetsAndWaitEmpty(t *testing.T) {
	_, c := testServer(t)
	members := []Member{{Name: "gpu", Limit: 1}, {Name: "licence", Limit: 5, Count: 2}}
	if scriptsBackend() {
		_, err := AcquireAll(bg, c, members, SetOptions{})
		require.ErrorIs(t, err, ErrModuleRequired)
		_, err = WaitEmpty(bg, c, "gpu", time.Second)
		require.ErrorIs(t, err, ErrModuleRequired)
		_, err = Acquire(bg, c, "gpu", Options{Limit: 1, Bound: true})
		require.ErrorIs(t, err, ErrModuleRequired)
		assert.Equal(t, int64(0), holders(t, c, "gpu"))
		return
	}
	s, err := AcquireAll(bg, c, members, SetOptions{Fair: true, Lease: 600 * time.Millisecond})
	require.NoError(t, err)
	assert.Equal(t, []string{"gpu", "licence"}, s.Names())
	assert.Equal(t, []int64{1, 2}, s.Counts())
	require.Len(t, s.Tickets(), 2)
	_, err = AcquireAll(bg, c, []Member{{Name: "gpu", Limit: 1}}, SetOptions{Fair: true})
	require.ErrorIs(t, err, ErrNotAcquired)
	time.Sleep(time.Second) // refreshed together
	require.NoError(t, s.Check())

	empty, err := WaitEmpty(bg, c, "gpu", 0)
	require.NoError(t, err)
	assert.False(t, empty, "a holder: not empty")
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = s.Release(bg)
	}()
	empty, err = WaitEmpty(bg, c, "gpu", 10*time.Second)
	require.NoError(t, err)
	assert.True(t, empty)

	// A lost set: one permit removed by hand.
	s, err = AcquireAll(bg, c, members, SetOptions{Lease: 600 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, c.Del(bg, "licence").Err())
	select {
	case <-s.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the set's context was not cancelled")
	}
	assert.ErrorIs(t, s.Release(bg), ErrPermitLost)

	// A bound permit is given back when its connection closes.
	b, err := Acquire(bg, c, "bound", Options{Limit: 1, Bound: true, ManualRefresh: true})
	require.NoError(t, err)
	require.NoError(t, c.Do(bg, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no").Err())
	require.Eventually(t, func() bool { return holders(t, c, "bound") == 0 }, 3*time.Second,
		20*time.Millisecond)
	assert.ErrorIs(t, b.Refresh(bg), ErrPermitLost)

	// A wait for empty ended by the context.
	h, err := Acquire(bg, c, "gpu", Options{Limit: 1})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err = WaitEmpty(ctx, c, "gpu", WaitForever)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, h.Release(bg))
}

func TestStoredLimit(t *testing.T) {
	_, c := testServer(t)
	require.NoError(t, SetLimit(bg, c, "reports", 0))
	_, err := Acquire(bg, c, "reports", Options{Limit: 10})
	require.ErrorIs(t, err, ErrNotAcquired)
	n, ok, err := StoredLimit(bg, c, "reports")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, int64(0), n)

	require.NoError(t, SetLimit(bg, c, "reports", 2))
	a, err := Acquire(bg, c, "reports", Options{Limit: 10})
	require.NoError(t, err)
	b, err := Acquire(bg, c, "reports", Options{Limit: 10})
	require.NoError(t, err)
	_, err = Acquire(bg, c, "reports", Options{Limit: 10})
	require.ErrorIs(t, err, ErrNotAcquired)
	require.NoError(t, a.Release(bg))
	require.NoError(t, b.Release(bg))

	cleared, err := ClearLimit(bg, c, "reports")
	require.NoError(t, err)
	assert.True(t, cleared)
	_, ok, err = StoredLimit(bg, c, "reports")
	require.NoError(t, err)
	assert.False(t, ok)
	cleared, err = ClearLimit(bg, c, "reports")
	require.NoError(t, err)
	assert.False(t, cleared)
}

func TestDurableReplicas(t *testing.T) {
	_, c := testServer(t)
	_, err := Acquire(bg, c, "durable", Options{Limit: 1, DurableReplicas: 1,
		DurableTimeout: 200 * time.Millisecond})
	var nd *NotDurableError
	require.ErrorAs(t, err, &nd)
	require.ErrorIs(t, err, ErrNotDurable)
	assert.Equal(t, int64(0), nd.Acked)
	assert.Equal(t, int64(1), nd.Wanted)
	assert.Equal(t, int64(0), holders(t, c, "durable"), "the permit was given back")
}

func TestBadInputBeforeAnythingIsSent(t *testing.T) {
	// Nothing listens here: an error other than bad input would be a connection error.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	cases := []struct {
		name  string
		opts  Options
		field string
	}{
		{"jobs", Options{Limit: -1}, "limit"},
		{"jobs", Options{Limit: -3}, "limit"},
		{"jobs", Options{Count: 2}, "count"}, // the zero limit is 1
		{"jobs", Options{Limit: 1 << 40}, "limit"},
		{"jobs", Options{Limit: 1, Lease: -time.Second}, "lease"},
		{"jobs", Options{Limit: 1, Lease: 400 * 24 * time.Hour}, "lease"},
		{"jobs", Options{Limit: 2, Count: 3}, "count"},
		{"jobs", Options{Limit: 2, Count: -1}, "count"},
		{"jobs", Options{Limit: 1, Wait: -time.Second}, "wait"},
		{"jobs", Options{Limit: 1, DurableReplicas: -1}, "DurableReplicas"},
		{"jobs", Options{Limit: 1, DurableTimeout: -time.Second}, "DurableTimeout"},
		{"jobs", Options{Limit: 1, RetryFor: -1}, "RetryFor"},
		{"", Options{Limit: 1}, "name"},
	}
	for _, tc := range cases {
		_, err := Acquire(bg, c, tc.name, tc.opts)
		require.ErrorIs(t, err, ErrBadInput, "%+v", tc.opts)
		assert.Contains(t, err.Error(), tc.field)
	}
	_, err := AcquireAll(bg, c, nil, SetOptions{})
	assert.ErrorIs(t, err, ErrBadInput)
	_, err = AcquireAll(bg, c, []Member{{Name: "a", Limit: 1}, {Name: "a", Limit: 1}}, SetOptions{})
	assert.ErrorIs(t, err, ErrBadInput)
	_, err = AcquireAll(bg, c, []Member{{Name: "a", Limit: 1, Count: 2}}, SetOptions{})
	assert.ErrorIs(t, err, ErrBadInput)
	_, err = AcquireAll(bg, c, []Member{{Name: "a", Count: 2}}, SetOptions{})
	assert.ErrorIs(t, err, ErrBadInput, "the zero limit is 1")
	_, err = AcquireAll(bg, c, []Member{{Name: "a", Limit: -1}}, SetOptions{})
	assert.ErrorIs(t, err, ErrBadInput)
	for _, o := range []Options{{Limit: -1}, {Lease: -time.Second}, {Wait: -1}} {
		_, err = NewSemaphore(c, "jobs", o)
		require.ErrorIs(t, err, ErrBadInput, "%+v", o)
	}
	_, err = NewSemaphore(c, "", Options{})
	assert.ErrorIs(t, err, ErrBadInput)
	_, err = NewSemaphore(nil, "jobs", Options{})
	assert.ErrorIs(t, err, ErrBadInput)
	for field, o := range map[string]SetOptions{"lease": {Lease: -time.Second},
		"wait": {Wait: -time.Second}, "RetryFor": {RetryFor: -time.Second}} {
		_, err = AcquireAll(bg, c, []Member{{Name: "a", Limit: 1}}, o)
		require.ErrorIs(t, err, ErrBadInput)
		assert.Contains(t, err.Error(), field)
	}
	_, err = WaitEmpty(bg, c, "a", -time.Second)
	assert.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), "timeout")
	assert.ErrorIs(t, SetLimit(bg, c, "a", -1), ErrBadInput)
	assert.ErrorIs(t, SetLimit(bg, c, "a", 1<<32), ErrBadInput)
	_, err = Acquire(bg, redis.NewRing(&redis.RingOptions{}), "a", Options{Limit: 1})
	assert.ErrorIs(t, err, ErrBadInput)

	// In Redis Cluster: a hash tag, and one slot for a set.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	_, err = Acquire(bg, cc, "jobs", Options{Limit: 1})
	require.ErrorIs(t, err, ErrBadInput)
	assert.Equal(t, `redsem: in Redis Cluster a semaphore's name needs a hash tag, e.g. "{jobs}" `+
		`or "app:{jobs}": the keys of "jobs" (jobs, jobs:owner, jobs:counter, jobs:permits, `+
		`jobs:limit) would fall in different slots`, err.Error())
	_, err = AcquireAll(bg, cc, []Member{{Name: "{a}", Limit: 1}, {Name: "{b}", Limit: 1}}, SetOptions{})
	require.ErrorIs(t, err, ErrBadInput)
	assert.Contains(t, err.Error(), `("{a}" is in slot 15495, "{b}" in slot 3300)`)
	_, err = WaitEmpty(bg, cc, "x{}", time.Second)
	assert.ErrorIs(t, err, ErrBadInput)
}

func TestMigrationByModuleLoad(t *testing.T) {
	s := startServer(t, false)
	c := s.client(t)
	held, err := Acquire(bg, c, "migrating", Options{Limit: 2, Fair: true, ID: "before"})
	require.NoError(t, err)
	_, err = AcquireAll(bg, c, []Member{{Name: "migrating", Limit: 2}}, SetOptions{})
	require.ErrorIs(t, err, ErrModuleRequired, "no module yet")

	require.NoError(t, c.Do(bg, "MODULE", "LOAD", modulePath(t)).Err())
	after := s.client(t) // a new client asks again
	p, err := Acquire(bg, after, "migrating", Options{Limit: 2, Fair: true})
	require.NoError(t, err)
	assert.Greater(t, p.Ticket(), held.Ticket(), "tickets go on growing")
	_, err = Acquire(bg, after, "migrating", Options{Limit: 2, Fair: true})
	require.ErrorIs(t, err, ErrNotAcquired, "the script's holder counts under the module")
	require.NoError(t, held.Refresh(bg), "the first client's script refresh still works")
	require.NoError(t, held.Release(bg))
	require.NoError(t, p.Release(bg))
	s2, err := AcquireAll(bg, after, []Member{{Name: "migrating", Limit: 2}}, SetOptions{Fair: true})
	require.NoError(t, err)
	require.NoError(t, s2.Release(bg))
}

// The zero Options is a mutex (limit 1) with the default lease, refreshed in the background,
// and so is a member of a set without a limit.
func TestZeroOptions(t *testing.T) {
	_, c := testServer(t)
	p, err := Acquire(bg, c, "zero", Options{})
	require.NoError(t, err)
	_, err = Acquire(bg, c, "zero", Options{})
	require.ErrorIs(t, err, ErrNotAcquired, "limit 1")
	score, err := c.ZScore(bg, "zero", p.ID()).Result()
	require.NoError(t, err)
	now, err := c.Time(bg).Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(now.Add(DefaultLease).UnixMilli()), score, 2000,
		"its deadline is the default lease away")
	require.NoError(t, p.Release(bg))
	if !scriptsBackend() {
		set, err := AcquireAll(bg, c, []Member{{Name: "zero-a"}, {Name: "zero-b"}}, SetOptions{})
		require.NoError(t, err)
		_, err = Acquire(bg, c, "zero-b", Options{})
		require.ErrorIs(t, err, ErrNotAcquired, "a member's zero limit is 1")
		require.NoError(t, set.Release(bg))
	}
}

// A semaphore handle: TryAcquire never waits (whatever Options.Wait says), Acquire waits as
// Options.Wait says, or, when it is zero, until the context ends.
func TestSemaphoreHandle(t *testing.T) {
	_, c := testServer(t)
	sem, err := NewSemaphore(c, "handle", Options{Limit: 2, Wait: 5 * time.Second})
	require.NoError(t, err)
	assert.Equal(t, "handle", sem.Name())
	a, err := sem.TryAcquire(bg)
	require.NoError(t, err)
	b, err := sem.Acquire(bg)
	require.NoError(t, err)
	started := time.Now()
	_, err = sem.TryAcquire(bg)
	require.ErrorIs(t, err, ErrNotAcquired)
	assert.Less(t, time.Since(started), time.Second, "TryAcquire does not wait")

	got := make(chan error, 1)
	go func() {
		p, err := sem.Acquire(bg)
		if err == nil {
			err = p.Release(bg)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, a.Release(bg))
	select {
	case err := <-got:
		require.NoError(t, err, "Acquire waited for a's release")
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting Acquire was not served")
	}

	// A zero Wait: Acquire waits until the context ends.
	mutex, err := NewSemaphore(c, "handle-mutex", Options{})
	require.NoError(t, err)
	held, err := mutex.Acquire(bg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	started = time.Now()
	_, err = mutex.Acquire(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, time.Since(started), 300*time.Millisecond)
	require.NoError(t, held.Release(bg))
	require.NoError(t, b.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "handle")+holders(t, c, "handle-mutex"))
}
