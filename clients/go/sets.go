package redsem

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Member is a semaphore of a set: its name, its limit (0: 1), and the permits to take (0: 1).
type Member struct {
	Name  string
	Limit int64
	Count int64
}

// SetOptions of AcquireAll; the fields mean what they mean in Options.
type SetOptions struct {
	Lease         time.Duration
	Fair          bool
	Wait          time.Duration
	Bound         bool
	ID            string
	ManualRefresh bool
	RetryFor      time.Duration
}

// PermitSet holds permits of several semaphores, taken together for one identifier; it is
// refreshed with one SEM.REFRESHALL every lease/3 (an answer lower than the number of
// semaphores means a permit of the set was lost: the whole set is lost) and given back with
// SEM.RELEASEALL.
type PermitSet struct {
	held
	names   []string
	counts  []int64
	tickets []int64
}

// Names are the semaphores' names, in the order given.
func (s *PermitSet) Names() []string { return append([]string(nil), s.names...) }

// Counts are the permits held of each semaphore, in the same order.
func (s *PermitSet) Counts() []int64 { return append([]int64(nil), s.counts...) }

// Tickets are, with Fair, the fencing ticket of each semaphore in the same order; else nil.
func (s *PermitSet) Tickets() []int64 { return append([]int64(nil), s.tickets...) }

// AcquireAll takes permits of 1 to 64 distinct semaphores at once, all or none
// (SEM.ACQUIREALL): a *PermitSet, or an error matching ErrNotAcquired (none is held). It
// needs the module (ErrModuleRequired without it). In Redis Cluster the names must share a
// slot (one hash tag).
func AcquireAll(ctx context.Context, client redis.UniversalClient, members []Member,
	options SetOptions,
) (*PermitSet, error) {
	if len(members) < 1 || len(members) > 64 {
		return nil, badInput("a set has from 1 to 64 semaphores, not %d", len(members))
	}
	names := make([]string, len(members))
	counts := make([]int64, len(members))
	limits := make([]int64, len(members))
	seen := map[string]bool{}
	for i, m := range members {
		if err := checkName(m.Name); err != nil {
			return nil, err
		}
		if seen[m.Name] {
			return nil, badInput("the semaphore %q is named twice", m.Name)
		}
		seen[m.Name] = true
		limit := m.Limit
		if limit == 0 {
			limit = 1
		}
		if limit < 1 || limit > maxLimit {
			return nil, badInput("the limit of %q must be an integer from 1 to %d, or 0 for 1, "+
				"not %d", m.Name, maxLimit, m.Limit)
		}
		limits[i] = limit
		count := m.Count
		if count == 0 {
			count = 1
		}
		if count < 1 || count > limit {
			return nil, badInput("the count of %q must be from 1 to its limit (%d), or 0 for 1, "+
				"not %d", m.Name, limit, m.Count)
		}
		names[i], counts[i] = m.Name, count
	}
	o := options
	var err error
	if o.Lease, err = checkLease(o.Lease); err != nil {
		return nil, err
	}
	if err := checkWait(o.Wait); err != nil {
		return nil, err
	}
	if err := checkRetryFor(o.RetryFor); err != nil {
		return nil, err
	}
	l, err := newLine(client, names, o.RetryFor, o.Bound) // a wait borrows one while it blocks
	if err != nil {
		return nil, err
	}
	id := o.ID
	if id == "" {
		id = uuid.NewString()
	}
	what := "the set " + quoted(names)
	if ctx.Err() != nil {
		return nil, ctxErr(ctx, "acquire of "+what)
	}
	if _, err := l.open(ctx, "SEM.ACQUIREALL"); err != nil {
		l.close()
		return nil, err
	}
	command := func(wait time.Duration) []any {
		args := []any{"SEM.ACQUIREALL", len(members)}
		for i, m := range members {
			args = append(args, m.Name, limits[i], counts[i])
		}
		args = append(args, seconds(o.Lease), "ID", id)
		if o.Fair {
			args = append(args, "FAIR", "WITHTICKET")
		}
		if wait > 0 {
			args = append(args, "WAIT", waitSeconds(wait))
		}
		if o.Bound {
			args = append(args, "BOUND")
		}
		return args
	}
	plan := planWait(ctx, o.Wait)
	var g granted
	_, err = l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		if e.scripts { // a node without the module, after a move
			return nil, moduleRequired("SEM.ACQUIREALL")
		}
		var err error
		if plan.left() > 0 {
			wait, err := e.startWait(ctx, plan, func() (bool, error) {
				var err error
				g.sent = time.Now()
				g.reply, err = e.raw(ctx, e.form(command(0)...)...)
				return g.reply != nil, err
			})
			if !wait {
				return nil, err
			}
			defer e.endWait()
		}
		g.sent = time.Now()
		wait := plan.left()
		args := e.form(command(wait)...)
		if wait == 0 {
			g.reply, err = e.raw(ctx, args...)
			return nil, err
		}
		var cancelled bool
		g.reply, err, cancelled = e.block(ctx, blocks(wait), args...)
		if cancelled {
			// Granted as the wait ended, or its reply never read: give it back.
			if g.reply != nil || err != nil {
				giveBack(e, "SEM.RELEASEALL", strconv.Itoa(len(names)), id, anys(names)...)
			}
			return nil, errCancelled
		}
		return nil, err
	})
	if err != nil && err != errCancelled && ctx.Err() != nil {
		// The context ended during a call whose answer may be a grant: give it back.
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = l.run(lctx, time.Time{}, func(e *endpoint) (any, error) {
			giveBack(e, "SEM.RELEASEALL", strconv.Itoa(len(names)), id, anys(names)...)
			return nil, nil
		})
		cancel()
	}
	if err == errCancelled || (err != nil && ctx.Err() != nil) ||
		(err == nil && g.reply == nil && plan.byCtx) {
		l.close()
		return nil, ctxErr(ctx, "acquire of "+what)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	if g.reply == nil {
		l.close()
		return nil, &described{msg: fmt.Sprintf("redsem: %s was not granted%s", what,
			waited(o.Wait)), kind: ErrNotAcquired}
	}
	s := &PermitSet{names: names, counts: counts}
	if o.Fair {
		if list, ok := g.reply.([]any); ok && len(list) == 2 {
			ts, _ := list[1].([]any)
			for _, t := range ts {
				n, _ := t.(int64)
				s.tickets = append(s.tickets, n)
			}
		}
	}
	s.init(l, id, o.Lease, g.sent, true)
	if time.Since(g.sent) > o.Lease/3 {
		if err := s.Refresh(ctx); err != nil {
			_ = s.Release(context.Background())
			return nil, err
		}
	}
	if !o.ManualRefresh {
		s.start()
	}
	return s, nil
}

func anys(names []string) []any {
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = n
	}
	return out
}

func quoted(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// WaitEmpty waits until the semaphore name has no live holder (SEM.WAITEMPTY): true once it
// has none (at once if it has none now), false when timeout passes first (WaitForever: no
// limit; 0 looks once). The context's cancellation ends it with the context's error. It takes
// nothing, and uses a connection of its own. It needs the module (ErrModuleRequired).
func WaitEmpty(ctx context.Context, client redis.UniversalClient, name string,
	timeout time.Duration,
) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	if timeout < 0 {
		return false, badInput("timeout must be zero (look once), a positive duration or "+
			"WaitForever, not %s", timeout)
	}
	l, err := newLine(client, []string{name}, 0, false)
	if err != nil {
		return false, err
	}
	defer l.close()
	if _, err := l.open(ctx, "SEM.WAITEMPTY"); err != nil {
		return false, err
	}
	plan := planWait(ctx, max(timeout, time.Nanosecond))
	v, err := l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		if e.scripts {
			return nil, moduleRequired("SEM.WAITEMPTY")
		}
		// A look: the server reads 0 as "no limit", so it blocks a millisecond.
		look := func() (any, error) { return e.raw(ctx, e.form("SEM.WAITEMPTY", name, "0.001")...) }
		if timeout == 0 || plan.left() == 0 {
			return look()
		}
		var v any
		wait, err := e.startWait(ctx, plan, func() (bool, error) {
			var err error
			v, err = look()
			return v == int64(1), err
		})
		if !wait {
			return v, err
		}
		defer e.endWait()
		left := plan.left()
		arg := waitSeconds(left)
		if left != WaitForever && arg == "0.000" {
			left, arg = time.Millisecond, "0.001"
		}
		v, err, cancelled := e.block(ctx, blocks(left), e.form("SEM.WAITEMPTY", name, arg)...)
		if cancelled {
			return nil, errCancelled
		}
		return v, err
	})
	if err == errCancelled || (err == nil && v != int64(1) && plan.byCtx) {
		return false, ctxErr(ctx, fmt.Sprintf("wait for %q to empty", name))
	}
	if err != nil {
		return false, err
	}
	return v == int64(1), nil
}

// limitCall sends one SEM.LIMIT call on the client's server (the primary of the name's slot
// in Redis Cluster).
func limitCall(ctx context.Context, client redis.UniversalClient, args ...any) (any, error) {
	l, err := newLine(client, []string{args[1].(string)}, 0, false)
	if err != nil {
		return nil, err
	}
	defer l.close()
	return l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		return e.send(ctx, args...)
	})
}

// StoredLimit is the operator's limit stored for the semaphore name (SEM.LIMIT name); ok is
// false when there is none. While one is stored, every acquire of name uses it instead of its
// own limit.
func StoredLimit(ctx context.Context, client redis.UniversalClient, name string) (
	limit int64, ok bool, err error,
) {
	if err := checkName(name); err != nil {
		return 0, false, err
	}
	v, err := limitCall(ctx, client, "SEM.LIMIT", name)
	if err != nil || v == nil {
		return 0, false, err
	}
	n, ok := v.(int64)
	if !ok {
		return 0, false, fmt.Errorf("redsem: unexpected answer of SEM.LIMIT: %v", v)
	}
	return n, true, nil
}

// SetLimit stores an operator's limit for the semaphore name (SEM.LIMIT name n), 0 to
// 4294967295: every acquire of name uses it instead of its own until ClearLimit. 0 pauses the
// semaphore; a lower limit takes no permit from its holders.
func SetLimit(ctx context.Context, client redis.UniversalClient, name string, limit int64) error {
	if err := checkName(name); err != nil {
		return err
	}
	if limit < 0 || limit > maxLimit {
		return badInput("limit must be an integer from 0 (pause) to %d, not %d", maxLimit, limit)
	}
	_, err := limitCall(ctx, client, "SEM.LIMIT", name, limit)
	return err
}

// ClearLimit removes the operator's limit of the semaphore name (SEM.LIMIT name CLEAR):
// acquires use their own limits again. It reports whether one was stored.
func ClearLimit(ctx context.Context, client redis.UniversalClient, name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	v, err := limitCall(ctx, client, "SEM.LIMIT", name, "CLEAR")
	return v == int64(1), err
}
