// The soak's Go worker: SOAK_THREADS loops, each with its own go-redis ClusterClient, take
// permits of the soak's names through redsem-client-go and log every call as one JSON line (the
// protocol of tests/soak/README.md; the environment as for worker.py).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	redsem "github.com/redsem/redsem-client-go"
)

type name struct {
	name  string
	limit int64
	fair  bool
}

var (
	outMu sync.Mutex
	out   *os.File
)

func nowUs() int64 { return time.Now().UnixMicro() }

func logRecord(r map[string]any) {
	line, _ := json.Marshal(r)
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = out.Write(append(line, '\n'))
}

// call runs fn, filling the record's times and outcome (unless fn set it).
func call(r map[string]any, fn func() error) {
	r["t0"] = nowUs()
	err := fn()
	r["t1"] = nowUs()
	var notDurable *redsem.NotDurableError
	switch {
	case err == nil:
		r["out"] = "ok"
	case errors.Is(err, redsem.ErrNotAcquired):
		r["out"] = "not-acquired"
	case errors.As(err, &notDurable):
		r["out"] = "not-durable"
		r["err"] = err.Error()
	case errors.Is(err, redsem.ErrPermitLost):
		r["out"] = "lost"
		r["err"] = err.Error()
	default:
		r["out"] = "error"
		r["err"] = fmt.Sprintf("%T: %v", err, err)
	}
}

func main() {
	env := os.Getenv
	var err error
	out, err = os.OpenFile(env("SOAK_OUT"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	var names []name
	for _, n := range strings.Split(env("SOAK_NAMES"), ",") {
		parts := strings.Split(n, "=")
		limit, _ := strconv.ParseInt(parts[1], 10, 64)
		names = append(names, name{parts[0], limit, parts[2] == "fair"})
	}
	seconds, _ := strconv.ParseFloat(env("SOAK_SECONDS"), 64)
	threads, _ := strconv.Atoi(env("SOAK_THREADS"))
	seed, _ := strconv.ParseInt(env("SOAK_SEED"), 10, 64)
	retryFor, _ := strconv.ParseFloat(env("SOAK_RETRY_FOR"), 64)
	durableAllowed := env("SOAK_DURABLE") == "1"
	nodes := strings.Split(env("SOAK_NODES"), ",")
	worker := env("SOAK_WORKER")
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))

	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		wg.Add(1)
		go func(index int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed*1000 + int64(index)))
			me := fmt.Sprintf("%s.%d", worker, index)
			rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: nodes, ReadTimeout: 5 * time.Second})
			defer rc.Close()
			ctx := context.Background()
			for seq := 1; time.Now().Before(end); seq++ {
				n := names[rng.Intn(len(names))]
				lease := []float64{2, 3}[rng.Intn(2)]
				wait := []float64{0, 0, 1, 3}[rng.Intn(4)]
				durable := durableAllowed && rng.Float64() < 0.2
				base := func(op string) map[string]any {
					return map[string]any{"w": me, "p": fmt.Sprintf("%s#%d", me, seq), "name": n.name,
						"limit": n.limit, "lease": int(lease * 1000), "retry_for": int(retryFor * 1000), "op": op}
				}
				opts := redsem.Options{
					Limit: n.limit, Lease: time.Duration(lease * float64(time.Second)), Fair: n.fair,
					Wait: time.Duration(wait * float64(time.Second)), ManualRefresh: true,
					RetryFor: time.Duration(retryFor * float64(time.Second)),
				}
				if durable {
					opts.DurableReplicas = 1
					opts.DurableTimeout = 500 * time.Millisecond
				}
				rec := base("acquire")
				rec["fair"], rec["wait"], rec["durable"] = n.fair, int(wait*1000), durable
				var permit *redsem.Permit
				call(rec, func() error {
					var err error
					permit, err = redsem.Acquire(ctx, rc, n.name, opts)
					return err
				})
				if permit != nil {
					if n.fair {
						rec["ticket"] = permit.Ticket()
					}
					rec["id"] = permit.ID()
				}
				logRecord(rec)
				if permit == nil {
					time.Sleep(time.Duration(rng.Float64() * float64(200*time.Millisecond)))
					continue
				}
				leaseD := time.Duration(lease * float64(time.Second))
				refresh := func() bool {
					r := base("refresh")
					call(r, func() error { return permit.Refresh(ctx) })
					logRecord(r)
					return r["out"] == "ok"
				}
				check := func() bool {
					r := base("check")
					call(r, func() error { return permit.Check() })
					logRecord(r)
					return r["out"] == "ok"
				}
				// A wait for the grant leaves the lease's start unknown: confirm it, as the
				// package does.
				held := true
				if time.Duration(rec["t1"].(int64)-rec["t0"].(int64))*time.Microsecond > leaseD/3 {
					held = refresh()
				}
				if rng.Float64() < 0.15 {
					time.Sleep(leaseD + 300*time.Millisecond) // overstay: the release should report the loss
				} else {
					holdEnd := time.Now().Add(time.Duration(rng.Float64() * 1.6 * float64(leaseD)))
					for held && time.Now().Before(holdEnd) {
						time.Sleep(min(leaseD/3, max(time.Until(holdEnd), 0)))
						if time.Now().Before(holdEnd) {
							held = check() && refresh()
						}
					}
				}
				r := base("release")
				call(r, func() error { return permit.Release(ctx) })
				logRecord(r)
				time.Sleep(time.Duration(rng.Float64() * float64(100*time.Millisecond)))
			}
		}(i)
	}
	wg.Wait()
}
