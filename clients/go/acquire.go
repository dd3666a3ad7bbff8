package redsem

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// WaitForever, as Options.Wait (or WaitEmpty's timeout), waits without limit (the module's
// WAIT 0), until the context ends.
const WaitForever = time.Duration(math.MaxInt64)

const (
	// DefaultLease is the lease of Options.Lease zero.
	DefaultLease = 30 * time.Second
	// DefaultDurableTimeout is how long a grant waits for replicas by default.
	DefaultDurableTimeout = time.Second
	maxLimit              = 4294967295
	maxLease              = 365 * 24 * time.Hour // the module's sem.max-lease default
	// scriptRecheck bounds each BLPOP of a wait without the module: a permit freed without a
	// wake-up token (a lease that ran out) is found at least this often.
	scriptRecheck = time.Second
)

// Options of an acquire.
type Options struct {
	// Limit is the semaphore's number of permits, 1 to 4294967295 (an operator's stored limit
	// takes its place while one is stored).
	Limit int64
	// Lease is how long the permit lives without a refresh (millisecond precision, at most a
	// year; zero: DefaultLease). The permit is refreshed every Lease/3 while held.
	Lease time.Duration
	// Fair uses SEM.ACQUIREFAIR: first come, first served, and Permit.Ticket is a fencing
	// ticket that only grows per name.
	Fair bool
	// Count takes this many permits at once (COUNT), all or none; zero: 1.
	Count int64
	// Wait is how long to wait for a permit inside the server (zero: no waiting;
	// WaitForever: no limit). The context's deadline shortens it, and its cancellation ends
	// it. Without the module the package waits: it tries again whenever a release wakes it
	// (BLPOP on <name>:wake), when the earliest lease ends, and at least every second.
	Wait time.Duration
	// Bound ties the permit to its connection (BOUND): it is given back when the connection
	// closes (the process dies). It needs the module.
	Bound bool
	// ID is the holder's identifier (default: a new UUID v4 per acquire, made before the
	// first send, so that a resent acquire renews the same holder).
	ID string
	// DurableReplicas: after the grant, WAIT DurableReplicas DurableTimeout; fewer
	// acknowledgements give the permit back and return a *NotDurableError.
	DurableReplicas int64
	// DurableTimeout bounds that wait (zero: DefaultDurableTimeout).
	DurableTimeout time.Duration
	// ManualRefresh: no background refresh; call Permit.Refresh yourself.
	ManualRefresh bool
	// RetryFor: in Redis Cluster, how long a call is resent, with the same identifier, while
	// its slot moves or its primary fails over (zero: DefaultRetryFor).
	RetryFor time.Duration
}

// seconds is a duration as the module reads it: seconds with 3 decimals; a positive duration
// never rounds down to zero.
func seconds(d time.Duration) string {
	ms := (d + time.Millisecond/2) / time.Millisecond
	if ms == 0 && d > 0 {
		ms = 1
	}
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}

func checkName(name string) error {
	if name == "" {
		return badInput("the semaphore name must not be empty")
	}
	return nil
}

func checkLease(lease time.Duration) (time.Duration, error) {
	if lease == 0 {
		return DefaultLease, nil
	}
	if lease < 0 || lease > maxLease {
		return 0, badInput("lease must be greater than 0 and at most a year (%s), not %s",
			maxLease, lease)
	}
	return lease, nil
}

func checkWait(wait time.Duration) error {
	if wait < 0 {
		return badInput("wait must be zero (no waiting), a positive duration or WaitForever, "+
			"not %s", wait)
	}
	return nil
}

func checkRetryFor(retryFor time.Duration) error {
	if retryFor < 0 {
		return badInput("RetryFor must not be negative, not %s", retryFor)
	}
	return nil
}

// checked validates the options (before anything is sent) and fills in the defaults.
func (o Options) checked(name string) (Options, error) {
	if err := checkName(name); err != nil {
		return o, err
	}
	if o.Limit < 1 || o.Limit > maxLimit {
		return o, badInput("limit must be an integer from 1 to %d, not %d", maxLimit, o.Limit)
	}
	var err error
	if o.Lease, err = checkLease(o.Lease); err != nil {
		return o, err
	}
	if o.Count < 0 || o.Count > o.Limit {
		return o, badInput("count must be from 1 to the limit (%d), or 0 for 1, not %d",
			o.Limit, o.Count)
	}
	if err := checkWait(o.Wait); err != nil {
		return o, err
	}
	if o.DurableReplicas < 0 {
		return o, badInput("DurableReplicas must not be negative, not %d", o.DurableReplicas)
	}
	if o.DurableTimeout < 0 {
		return o, badInput("DurableTimeout must not be negative, not %s", o.DurableTimeout)
	}
	if o.DurableTimeout == 0 {
		o.DurableTimeout = DefaultDurableTimeout
	}
	return o, checkRetryFor(o.RetryFor)
}

// command is the acquire, waiting `wait` (what is left of Options.Wait); inServer false
// leaves out WAIT and BOUND (the script's form: its caller waits).
func (o Options) command(name, id string, wait time.Duration, inServer bool) []any {
	command := "SEM.ACQUIRE"
	if o.Fair {
		command = "SEM.ACQUIREFAIR"
	}
	args := []any{command, name, o.Limit, seconds(o.Lease), "ID", id}
	if o.Count > 0 {
		args = append(args, "COUNT", o.Count)
	}
	if o.Fair {
		args = append(args, "WITHTICKET")
	}
	if !inServer {
		return args
	}
	if wait > 0 {
		args = append(args, "WAIT", waitSeconds(wait))
	}
	if o.Bound {
		args = append(args, "BOUND")
	}
	return args
}

func waitSeconds(wait time.Duration) string {
	if wait == WaitForever {
		return "0"
	}
	return seconds(wait)
}

// waitPlan is a wait's end: the wait (none, for a time, or forever), capped by the context's
// deadline.
type waitPlan struct {
	forever  bool
	deadline time.Time // when !forever; zero: no waiting
	byCtx    bool      // the context's deadline ends it
}

func planWait(ctx context.Context, wait time.Duration) waitPlan {
	p := waitPlan{}
	now := time.Now()
	switch {
	case wait == WaitForever:
		p.forever = true
	case wait > 0:
		p.deadline = now.Add(wait)
	}
	if wait > 0 {
		if d, ok := ctx.Deadline(); ok && (p.forever || d.Before(p.deadline)) {
			p.forever, p.deadline, p.byCtx = false, d, true
		}
	}
	return p
}

// left is what is left of the wait now: 0 none, WaitForever no limit.
func (p waitPlan) left() time.Duration {
	if p.forever {
		return WaitForever
	}
	if p.deadline.IsZero() {
		return 0
	}
	return max(time.Until(p.deadline), 0)
}

// blocks is how long a call waiting `wait` may block in the server.
func blocks(wait time.Duration) time.Duration {
	if wait == WaitForever {
		return forever
	}
	return wait
}

// ctxErr is the error of an acquire that the context ended.
func ctxErr(ctx context.Context, what string) error {
	cause := context.Cause(ctx)
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	return fmt.Errorf("redsem: %s: %w", what, cause)
}

// granted is an acquire's reply: the identifier, or [identifier, ticket(s)] (nil: refused).
type granted struct {
	reply any
	sent  time.Time
}

// Acquire takes a permit of the semaphore name through client (a *redis.Client, from
// redis.NewClient or redis.NewFailoverClient, or a *redis.ClusterClient), or returns an error
// matching ErrNotAcquired (or ErrModuleRequired, a *NotDurableError, ErrBadInput, the
// context's error, or the server's). The permit is refreshed every Lease/3 until Release.
func Acquire(ctx context.Context, client redis.UniversalClient, name string, options Options) (
	*Permit, error,
) {
	o, err := options.checked(name)
	if err != nil {
		return nil, err
	}
	own := o.Wait > 0 || o.Bound || o.DurableReplicas > 0
	l, err := newLine(client, []string{name}, o.RetryFor, own)
	if err != nil {
		return nil, err
	}
	id := o.ID
	if id == "" {
		id = uuid.NewString()
	}
	what := fmt.Sprintf("acquire of %q", name)
	if ctx.Err() != nil {
		return nil, ctxErr(ctx, what)
	}
	needs := ""
	if o.Bound {
		needs = "BOUND"
	}
	if _, err := l.open(ctx, needs); err != nil {
		l.close()
		return nil, err
	}
	plan := planWait(ctx, o.Wait)
	var g granted
	_, err = l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		var err error
		if e.scripts {
			if o.Bound { // a node without the module, after a move
				return nil, moduleRequired("BOUND")
			}
			g, err = acquireByScript(ctx, e, o, name, id, plan)
			return nil, err
		}
		g.sent = time.Now()
		wait := plan.left()
		args := e.form(o.command(name, id, wait, true)...)
		if wait == 0 {
			g.reply, err = e.raw(ctx, args...)
			return nil, err
		}
		var cancelled bool
		g.reply, err, cancelled = e.block(ctx, blocks(wait), args...)
		if cancelled {
			if err == nil && g.reply != nil { // granted as the wait ended: give it back
				_, _ = e.send(context.Background(), "SEM.RELEASE", name, id)
			}
			return nil, errCancelled
		}
		return nil, err
	})
	if err == errCancelled || (err == nil && g.reply == nil && plan.byCtx) {
		l.close()
		return nil, ctxErr(ctx, what)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	if g.reply == nil {
		l.close()
		return nil, &described{msg: fmt.Sprintf("redsem: no permit of %q (limit %d) was "+
			"granted%s", name, o.Limit, waited(o.Wait)), kind: ErrNotAcquired}
	}
	p := &Permit{name: name, count: max(o.Count, 1)}
	if o.Fair {
		p.ticket = ticketOf(g.reply)
	}
	p.init(l, id, o.Lease, g.sent, fmt.Sprintf("%q", name),
		[]any{"SEM.REFRESH", name, id, seconds(o.Lease)}, []any{"SEM.RELEASE", name, id}, 1)
	if err := p.afterGrant(ctx, o, name, g.sent); err != nil {
		return nil, err
	}
	if !o.ManualRefresh {
		p.start()
	}
	return p, nil
}

// errCancelled marks a wait the context ended.
var errCancelled = fmt.Errorf("redsem: cancelled")

func waited(wait time.Duration) string {
	switch {
	case wait == WaitForever:
		return " (waiting without limit)"
	case wait > 0:
		return fmt.Sprintf(" within %s", wait)
	}
	return ""
}

func ticketOf(reply any) int64 {
	if list, ok := reply.([]any); ok && len(list) == 2 {
		if t, ok := list[1].(int64); ok {
			return t
		}
	}
	return 0
}

// afterGrant waits for replicas (DurableReplicas) and, after a wait for the grant, confirms
// the lease's start; on failure the permit is given back.
func (p *Permit) afterGrant(ctx context.Context, o Options, name string, sent time.Time) error {
	var err error
	if o.DurableReplicas > 0 {
		var acked any
		acked, err = p.line.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
			v, err, _ := e.block(context.Background(), o.DurableTimeout, "WAIT",
				o.DurableReplicas, o.DurableTimeout.Milliseconds())
			return v, err
		})
		if err == nil {
			n, _ := acked.(int64)
			if n < o.DurableReplicas {
				err = &NotDurableError{Name: name, Acked: n, Wanted: o.DurableReplicas}
			}
		}
	}
	// A wait for the grant leaves the lease's start unknown: confirm it now.
	if err == nil && time.Since(sent) > o.Lease/3 {
		err = p.Refresh(ctx)
	}
	if err != nil {
		_ = p.Release(context.Background())
		return err
	}
	return nil
}

// acquireByScript acquires through the script, waiting until the plan's end on <name>:wake
// between attempts, on the permit's own connection.
func acquireByScript(ctx context.Context, e *endpoint, o Options, name, id string, plan waitPlan) (
	granted, error,
) {
	args := o.command(name, id, 0, false)
	wake := name + ":wake"
	for {
		sent := time.Now()
		v, err := e.send(ctx, args...)
		if err != nil {
			return granted{}, err
		}
		list, ok := v.([]any)
		if !ok || len(list) != 2 {
			return granted{}, fmt.Errorf("redsem: unexpected answer of the redsem script: %v", v)
		}
		if list[0] != nil {
			return granted{reply: list[0], sent: sent}, nil
		}
		retry := scriptRecheck
		if ms, _ := list[1].(int64); ms > 0 {
			retry = min(time.Duration(ms+1)*time.Millisecond, scriptRecheck)
		}
		left := plan.left()
		if left <= 0 {
			return granted{sent: sent}, nil
		}
		if ctx.Err() != nil {
			return granted{}, errCancelled
		}
		block := min(left, retry)
		_, err, cancelled := e.block(ctx, block, "BLPOP", wake, seconds(block))
		if cancelled {
			return granted{}, errCancelled
		}
		if err != nil {
			return granted{}, err
		}
	}
}
