package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	redsem "github.com/redsem/redsem-client-go"
)

// The pair overhead (--pair-overhead): acquire + release through the package against a raw
// go-redis client sending the same commands itself (a new UUID v4 identifier, SEM.ACQUIRE name
// limit lease ID id, then SEM.RELEASE name id; without the module the script's EVALSHA of
// each, with its six keys named), on the same kind of client, interleaved round by round; printed side by side with
// their ratio (the package's time per pair over the raw client's).

var pairOverhead = flag.Bool("pair-overhead", false, "print only the pair overhead: the package's "+
	"acquire + release against a raw client sending the same commands, side by side")

// rawPairs loops the raw pair: send acquires (and checks the grant), then release.
func rawPairs(c *redis.Client, n int, d time.Duration, script bool, sha string) float64 {
	ctx := context.Background()
	name := "pairs"
	var pairs atomic.Int64
	loop(n, d, func(_ int, stop *atomic.Bool) {
		for !stop.Load() {
			id := uuid.NewString()
			if script { // the script's six keys, as a client names them for any name
				keys := []any{name, name + ":owner", name + ":counter", name + ":permits",
					name + ":limit", name + ":wake"}
				acq := append(append([]any{"EVALSHA", sha, 6}, keys...), "ACQUIRE", 1000000,
					"30.000", "ID", id)
				v, err := c.Do(ctx, acq...).Slice()
				if err != nil || v[0] == nil {
					fail(fmt.Errorf("raw script acquire: %v %v", v, err))
				}
				rel := append(append([]any{"EVALSHA", sha, 6}, keys...), "RELEASE", id)
				if err := c.Do(ctx, rel...).Err(); err != nil {
					fail(err)
				}
			} else {
				v, err := c.Do(ctx, "SEM.ACQUIRE", name, 1000000, "30.000", "ID", id).Result()
				if err != nil || v == nil {
					fail(fmt.Errorf("raw acquire: %v %v", v, err))
				}
				if err := c.Do(ctx, "SEM.RELEASE", name, id).Err(); err != nil {
					fail(err)
				}
			}
			pairs.Add(1)
		}
	})
	return float64(pairs.Load()) / d.Seconds()
}

// packagePairs loops the package's pair with n goroutines.
func packagePairs(c *redis.Client, n int, d time.Duration) float64 {
	ctx := context.Background()
	var pairs atomic.Int64
	loop(n, d, func(_ int, stop *atomic.Bool) {
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

func runPairOverhead(withModule, without *server, dur time.Duration) {
	text, err := os.ReadFile("redsem.lua")
	if err != nil {
		fail(fmt.Errorf("run the bench from clients/go (it reads redsem.lua): %w", err))
	}
	sum := sha1.Sum(text)
	sha := hex.EncodeToString(sum[:])
	load := without.client(1)
	if err := load.ScriptLoad(context.Background(), string(text)).Err(); err != nil {
		fail(err)
	}
	load.Close()
	type cell struct {
		backend string
		n       int
		srv     *server
		script  bool
	}
	var cells []cell
	for _, n := range []int{1, *pairClients} {
		cells = append(cells, cell{"module (SEM.ACQUIRE + SEM.RELEASE)", n, withModule, false},
			cell{"script (EVALSHA ACQUIRE + RELEASE)", n, without, true})
	}
	fmt.Printf("go-redis v9 client, %s, %d rounds x %s per contender; pairs of limit "+
		"1,000,000, nobody waiting; ratio: the package's time per pair / the raw client's\n\n",
		version(), *rounds, dur)
	fmt.Println("| backend | goroutines | package pairs/s | raw client pairs/s | ratio (median) | ratio min - max |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, c := range cells {
		var pkg, raw, ratios []float64
		for r := 0; r < *rounds; r++ {
			// Each round alternates the two ten times (which goes first alternating too), so
			// that both meet the same load of a shared machine.
			var p, w float64
			slice := dur / 10
			pc, rc := c.srv.client(c.n), c.srv.client(c.n)
			for i := 0; i < 10; i++ {
				if (r+i)%2 == 0 {
					p += packagePairs(pc, c.n, slice)
					w += rawPairs(rc, c.n, slice, c.script, sha)
				} else {
					w += rawPairs(rc, c.n, slice, c.script, sha)
					p += packagePairs(pc, c.n, slice)
				}
			}
			pc.Close()
			rc.Close()
			p, w = p/10, w/10
			pkg, raw, ratios = append(pkg, p), append(raw, w), append(ratios, w/p)
		}
		for _, v := range [][]float64{pkg, raw, ratios} {
			sort.Float64s(v)
		}
		m := len(ratios) / 2
		fmt.Printf("| %s | %d | %.0f | %.0f | %.2f | %.2f - %.2f |\n", c.backend, c.n, pkg[m],
			raw[m], ratios[m], ratios[0], ratios[len(ratios)-1])
	}
	fmt.Println()
}
