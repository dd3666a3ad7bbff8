// Command bench compares redsem-client-go with a go-redis polling semaphore (the client-side
// recipe: ZREMRANGEBYSCORE + ZADD + ZRANK in one pipeline, ZREM when over the limit, a sleep
// between tries) in one run, contenders interleaved (A B C ... A B C ...), medians printed:
//
//   - hand-offs/s: limit 1, --clients goroutines each looping acquire (waiting) -> release; a
//     hand-off is a grant to another goroutine than the previous holder;
//   - pairs/s: limit 1,000,000, --pair-clients goroutines each looping acquire -> release.
//
// redsem runs on a server with the module (SEM.ACQUIRE ... WAIT), and on a second server
// without it (the embedded script, waiting in its line on <name>:wake:<id>); the polling
// recipe on the server with the module. Each server is started here on a free loopback port.
//
//	go run ./bench --server redis-server --module ../../target/release/libredsem.so
//
// --pair-overhead prints instead the package's acquire + release against a raw go-redis client
// sending the same commands (overhead.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	redsem "github.com/redsem/redsem-client-go"
)

var (
	serverBin   = flag.String("server", envOr("REDIS_SERVER", "redis-server"), "redis-server binary")
	modulePath  = flag.String("module", os.Getenv("REDSEM_MODULE"), "libredsem.so (default: target/release, else target/debug)")
	seconds     = flag.Float64("seconds", 2, "seconds per contender and round")
	rounds      = flag.Int("rounds", 3, "rounds (the median is printed)")
	clients     = flag.Int("clients", 8, "goroutines in the hand-off cells")
	pairClients = flag.Int("pair-clients", 50, "goroutines in the pair cells")
	pollEvery   = flag.Duration("poll", 10*time.Millisecond, "the polling recipe's sleep between tries")
)

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	flag.Parse()
	if *modulePath == "" {
		for _, p := range []string{"../../target/release/libredsem.so", "../../target/debug/libredsem.so"} {
			if _, err := os.Stat(p); err == nil {
				*modulePath, _ = filepath.Abs(p)
				break
			}
		}
	}
	if *modulePath == "" {
		fail(errors.New("no libredsem.so: build it (cargo build --release -p redsem) or pass --module"))
	}
	withModule := start(true)
	defer withModule.stop()
	without := start(false)
	defer without.stop()
	if *pairOverhead {
		runPairOverhead(withModule, without, time.Duration(*seconds*float64(time.Second)))
		return
	}

	type cell struct {
		name string
		run  func(time.Duration) float64
	}
	dur := time.Duration(*seconds * float64(time.Second))
	handoffs := []cell{
		{"redsem, module (SEM.ACQUIRE ... WAIT)", func(d time.Duration) float64 {
			return redsemHandoff(withModule.client(*clients), d, false)
		}},
		{"redsem, module, fair (SEM.ACQUIREFAIR ... WAIT)", func(d time.Duration) float64 {
			return redsemHandoff(withModule.client(*clients), d, true)
		}},
		{"redsem, script (LINE + BLPOP <name>:wake:<id>)", func(d time.Duration) float64 {
			return redsemHandoff(without.client(*clients), d, false)
		}},
		{fmt.Sprintf("go-redis polling recipe, every %s", *pollEvery), func(d time.Duration) float64 {
			return pollingHandoff(withModule.client(*clients), d)
		}},
	}
	pairs := []cell{
		{"redsem, module (SEM.ACQUIRE + SEM.RELEASE)", func(d time.Duration) float64 {
			return redsemPairs(withModule.client(*pairClients), d)
		}},
		{"redsem, script (EVALSHA)", func(d time.Duration) float64 {
			return redsemPairs(without.client(*pairClients), d)
		}},
		{"go-redis polling recipe (pipeline + ZREM)", func(d time.Duration) float64 {
			return pollingPairs(withModule.client(*pairClients), d)
		}},
	}
	fmt.Printf("go-redis v9 client, %s, %d rounds x %s per cell; hand-offs: %d goroutines, "+
		"limit 1; pairs: %d goroutines, limit 1,000,000\n\n", version(), *rounds, dur, *clients,
		*pairClients)
	for _, set := range []struct {
		title string
		cells []cell
	}{{"hand-offs/s", handoffs}, {"pairs/s", pairs}} {
		results := make([][]float64, len(set.cells))
		for r := 0; r < *rounds; r++ {
			for i, c := range set.cells {
				results[i] = append(results[i], c.run(dur))
			}
		}
		fmt.Printf("| contender | %s (median) | min - max |\n| --- | ---: | ---: |\n", set.title)
		for i, c := range set.cells {
			v := results[i]
			sort.Float64s(v)
			fmt.Printf("| %s | %.0f | %.0f - %.0f |\n", c.name, v[len(v)/2], v[0], v[len(v)-1])
		}
		fmt.Println()
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func version() string {
	out, err := exec.Command(*serverBin, "--version").Output()
	if err != nil {
		return *serverBin
	}
	return string(out[:len(out)-1])
}

type server struct {
	cmd  *exec.Cmd
	addr string
	dir  string
}

func start(module bool) *server {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir, err := os.MkdirTemp("", "redsem-bench-")
	if err != nil {
		fail(err)
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir}
	if module {
		args = append(args, "--loadmodule", *modulePath)
	}
	s := &server{cmd: exec.Command(*serverBin, args...), addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
	if err := s.cmd.Start(); err != nil {
		fail(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 500 {
			fail(fmt.Errorf("%s did not answer on %s", *serverBin, s.addr))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = os.RemoveAll(s.dir)
}

func (s *server) client(n int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: n + 2})
	c.FlushAll(context.Background())
	return c
}

// handoffs counts grants to another goroutine than the previous holder's.
type handoffs struct {
	mu    sync.Mutex
	last  int
	count int64
}

func (h *handoffs) granted(who int) {
	h.mu.Lock()
	if h.last != who {
		h.count++
	}
	h.last = who
	h.mu.Unlock()
}

func loop(n int, d time.Duration, body func(who int, stop *atomic.Bool)) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func(who int) {
			defer wg.Done()
			body(who, &stop)
		}(i)
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
}

func redsemHandoff(c *redis.Client, d time.Duration, fair bool) float64 {
	defer c.Close()
	ctx := context.Background()
	var h handoffs
	loop(*clients, d, func(who int, stop *atomic.Bool) {
		for !stop.Load() {
			p, err := redsem.Acquire(ctx, c, "handoff", redsem.Options{Limit: 1, Fair: fair,
				Wait: 10 * time.Second})
			if errors.Is(err, redsem.ErrNotAcquired) {
				continue
			}
			if err != nil {
				fail(err)
			}
			h.granted(who)
			if err := p.Release(ctx); err != nil {
				fail(err)
			}
		}
	})
	return float64(h.count) / d.Seconds()
}

func redsemPairs(c *redis.Client, d time.Duration) float64 {
	defer c.Close()
	ctx := context.Background()
	var pairs atomic.Int64
	loop(*pairClients, d, func(_ int, stop *atomic.Bool) {
		for !stop.Load() {
			p, err := redsem.Acquire(ctx, c, "pairs", redsem.Options{Limit: 1000000})
			if err != nil {
				fail(err)
			}
			if err := p.Release(ctx); err != nil {
				fail(err)
			}
			pairs.Add(1)
		}
	})
	return float64(pairs.Load()) / d.Seconds()
}

// pollAcquire is one try of the client-side recipe: drop the expired holders, add this one
// with its deadline, and keep it if its rank is below the limit (else take it out again).
func pollAcquire(ctx context.Context, c *redis.Client, name, id string, limit int64,
	lease time.Duration,
) (bool, error) {
	now := time.Now()
	var rank *redis.IntCmd
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, name, "-inf", strconv.FormatInt(now.UnixMilli(), 10))
		p.ZAdd(ctx, name, redis.Z{Score: float64(now.Add(lease).UnixMilli()), Member: id})
		rank = p.ZRank(ctx, name, id)
		return nil
	})
	if err != nil {
		return false, err
	}
	if rank.Val() < limit {
		return true, nil
	}
	return false, c.ZRem(ctx, name, id).Err()
}

func pollingHandoff(c *redis.Client, d time.Duration) float64 {
	defer c.Close()
	ctx := context.Background()
	var h handoffs
	loop(*clients, d, func(who int, stop *atomic.Bool) {
		for !stop.Load() {
			id := uuid.NewString()
			for !stop.Load() {
				ok, err := pollAcquire(ctx, c, "poll-handoff", id, 1, 30*time.Second)
				if err != nil {
					fail(err)
				}
				if ok {
					h.granted(who)
					if err := c.ZRem(ctx, "poll-handoff", id).Err(); err != nil {
						fail(err)
					}
					break
				}
				time.Sleep(*pollEvery)
			}
		}
	})
	return float64(h.count) / d.Seconds()
}

func pollingPairs(c *redis.Client, d time.Duration) float64 {
	defer c.Close()
	ctx := context.Background()
	var pairs atomic.Int64
	loop(*pairClients, d, func(_ int, stop *atomic.Bool) {
		for !stop.Load() {
			id := uuid.NewString()
			ok, err := pollAcquire(ctx, c, "poll-pairs", id, 1000000, 30*time.Second)
			if err != nil || !ok {
				fail(fmt.Errorf("polling pair: %v %v", ok, err))
			}
			if err := c.ZRem(ctx, "poll-pairs", id).Err(); err != nil {
				fail(err)
			}
			pairs.Add(1)
		}
	})
	return float64(pairs.Load()) / d.Seconds()
}
