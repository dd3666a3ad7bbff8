package redsem

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
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
	// nudge bounds each BLPOP of a wait without the module: the script holds a waiter's place
	// 6 s after its last attempt, and a waiter tries again at least every 2.5 s (NUDGE_MS).
	nudge = 2500 * time.Millisecond
	// tickLate: a TICK is sent this long after the earliest lease's end, so that the server's
	// clock has passed it.
	tickLate = 2 * time.Millisecond
)

// Options of an acquire. The zero Options is usable: a semaphore of one permit (a mutex), a
// lease of DefaultLease refreshed in the background, no waiting, a new identifier.
type Options struct {
	// Limit is the semaphore's number of permits, 1 to 4294967295; zero: 1 (an operator's
	// stored limit takes its place while one is stored).
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
	// it. Without the module the package waits in the script's line, first come, first
	// served: the server hands it a freed permit (BLPOP on its own <name>:wake:<id>); the first
	// in line asks the server to serve the line (TICK) as the earliest lease ends.
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
	if d == DefaultLease {
		return "30.000"
	}
	ms := int64((d + time.Millisecond/2) / time.Millisecond)
	if ms == 0 && d > 0 {
		ms = 1
	}
	b := strconv.AppendInt(make([]byte, 0, 24), ms/1000, 10)
	frac := ms % 1000
	return string(append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10)))
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
	if o.Limit == 0 {
		o.Limit = 1
	}
	if o.Limit < 1 || o.Limit > maxLimit {
		return o, badInput("limit must be an integer from 1 to %d, or 0 for 1, not %d",
			maxLimit, o.Limit)
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
	// A wait borrows a connection only while it blocks; BOUND and WAIT numreplicas need theirs
	// for the permit's life.
	own := o.Bound || o.DurableReplicas > 0
	l, err := newLine(client, []string{name}, o.RetryFor, own)
	if err != nil {
		return nil, err
	}
	id := o.ID
	if id == "" {
		id = uuid.NewString()
	}
	if ctx.Err() != nil {
		return nil, ctxErr(ctx, "acquire of "+strconv.Quote(name))
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
	var sw scriptWait
	_, err = l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		var err error
		if plan.left() > 0 {
			// A connection for the wait, queued behind the other waits when all are taken:
			// the call without waiting is tried first, and again if the wait ends there.
			wait, err := e.startWait(ctx, plan, func() (bool, error) {
				var err error
				if e.scripts {
					if o.Bound {
						return false, moduleRequired("BOUND")
					}
					g, _, err = acquireByScript(ctx, e, o, name, id, waitPlan{}, &sw)
				} else {
					g.sent = time.Now()
					g.reply, err = e.raw(ctx, e.form(o.command(name, id, 0, true)...)...)
				}
				return g.reply != nil, err
			})
			if !wait {
				return nil, err
			}
			defer e.endWait()
		}
		if e.scripts {
			if o.Bound { // a node without the module, after a move
				return nil, moduleRequired("BOUND")
			}
			var toModule bool
			g, toModule, err = acquireByScript(ctx, e, o, name, id, plan, &sw)
			if err != nil || !toModule {
				return nil, err
			}
			// The module was loaded during the wait: wait there for what is left.
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
			// Granted as the wait ended, or its reply never read (the connection was
			// killed): give it back, rather than leave it held by nobody until its lease ends.
			if g.reply != nil || err != nil {
				giveBack(e, "SEM.RELEASE", name, id)
			}
			return nil, errCancelled
		}
		return nil, err
	})
	if err != nil && err != errCancelled && (sw.lined || ctx.Err() != nil) {
		// Given up while it may be in the script's line, or the context ended during a call
		// whose answer may be a grant: out of the line, and a permit granted meanwhile given
		// back.
		unknown := ctx.Err() != nil
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = l.run(lctx, time.Time{}, func(e *endpoint) (any, error) {
			if e.scripts {
				leaveAfterCancel(e, name, id, "", unknown)
			} else if unknown {
				giveBack(e, "SEM.RELEASE", name, id)
			}
			return nil, nil
		})
		cancel()
	}
	if err == errCancelled || (err != nil && ctx.Err() != nil) ||
		(err == nil && g.reply == nil && plan.byCtx) {
		l.close()
		return nil, ctxErr(ctx, "acquire of "+strconv.Quote(name))
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
	p.init(l, id, o.Lease, g.sent, false)
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
		cut := false
		acked, err = p.line.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
			if cut {
				// The WAIT was cut (its connection lost, or ended in a failover): on this new
				// connection it would answer at once, as it wrote nothing. A refresh here first
				// finds whether this primary has the holder, and is the write WAIT then covers.
				v, err := e.send(ctx, p.refreshArgs()...)
				if err != nil {
					return nil, err
				}
				if v != int64(1) {
					return nil, &NotDurableError{Name: name, Wanted: o.DurableReplicas, Gone: true}
				}
			}
			cut = true
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

// acquireByScript acquires through the script. A wait takes a place in the script's line
// (LINE) and waits on its own list <name>:wake:<id> for the server's message: a grant (G, or
// G<ticket>), its error (E<error>), "first in line, a lease ends in ms" (H<ms>: TICK then) or
// "the module is loaded" (M). It tries again at least every nudge (which holds its place),
// and, first in line, has TICK sent on the pool as the earliest lease ends. At the wait's end
// it leaves the line (LEAVE), which hands it a grant made at that moment. toModule: the
// module was found loaded with the wait not over: wait with the module.
func acquireByScript(ctx context.Context, e *endpoint, o Options, name, id string,
	plan waitPlan, sw *scriptWait,
) (g granted, toModule bool, err error) {
	args := o.command(name, id, 0, false)
	waiting := plan.forever || !plan.deadline.IsZero()
	if waiting {
		args = append(args, "LINE")
	}
	wake := name + ":wake:" + id
	for {
		sent := time.Now()
		v, err := e.script(ctx, !sw.tried, args...)
		sw.tried = true
		sw.lined = sw.lined || waiting
		if err != nil {
			if waiting && ctx.Err() != nil { // the attempt may have taken a place, or a permit
				leaveAfterCancel(e, name, id, "", true)
				return granted{}, false, errCancelled
			}
			return granted{}, false, err
		}
		list, ok := v.([]any)
		if !ok || len(list) != 3 {
			return granted{}, false, fmt.Errorf("redsem: unexpected answer of the redsem "+
				"script: %v (is the script older than this package?)", v)
		}
		retry, _ := list[1].(int64)
		ahead, _ := list[2].(int64)
		if ahead == -1 { // the module is loaded: this was its SEM.ACQUIRE, without WAIT
			e.useModule()
			if list[0] == nil && waiting && plan.left() > 0 {
				return granted{}, true, nil
			}
			return granted{reply: list[0], sent: sent}, false, nil
		}
		if list[0] != nil || !waiting {
			return granted{reply: list[0], sent: sent}, false, nil
		}
		// H<ms>: first in line, a lease ends in ms: block again with a TICK then, while the
		// last attempt keeps the place (held 6 s from it: the next comes within nudge).
		var msg string
		for {
			left := plan.left()
			if left <= 0 {
				// The wait is over (the context's deadline may be): leave with a context of its own.
				lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				m, err := e.script(lctx, false, "SEM.LEAVE", name, id)
				cancel()
				if err != nil {
					return granted{}, false, err
				}
				told, _ := m.(string)
				return fromMessage(told, o, id, sent)
			}
			if ctx.Err() != nil {
				leaveAfterCancel(e, name, id, "", false)
				return granted{}, false, errCancelled
			}
			block := min(left, nudge)
			var tk *ticker
			if after := time.Duration(retry) * time.Millisecond; ahead == 0 && after > 0 &&
				after < block {
				tk = startTicker(e, name, after)
			}
			r, err, cancelled := e.block(ctx, block, "BLPOP", wake, seconds(block))
			tk.stop()
			msg = popped(r)
			if cancelled || (err != nil && ctx.Err() != nil) {
				// An error here: the BLPOP's reply was never read, and it may have taken a grant.
				leaveAfterCancel(e, name, id, msg, err != nil)
				return granted{}, false, errCancelled
			}
			if err != nil {
				return granted{}, false, err
			}
			ms := nudgeMillis(msg)
			if ms <= 0 || time.Since(sent) >= nudge {
				break
			}
			retry, ahead = ms, 0
		}
		// No message (the BLPOP's time is up) or H: try again, which renews the place or
		// learns when the earliest lease ends.
		switch {
		case strings.HasPrefix(msg, "G") || strings.HasPrefix(msg, "E"):
			return fromMessage(msg, o, id, sent)
		case msg == "M":
			e.useModule()
			return granted{}, true, nil
		}
	}
}

// nudgeMillis is the milliseconds an "H<ms>" message gives until a lease ends (0: the message
// is another; "H" alone, an older script's: try again, which tells when).
func nudgeMillis(msg string) int64 {
	if len(msg) < 2 || msg[0] != 'H' {
		return 0
	}
	ms, err := strconv.ParseInt(msg[1:], 10, 64)
	if err != nil || ms < 0 {
		return 0
	}
	return ms
}

// scriptWait is what an acquire through the script did, across the nodes it was sent to.
type scriptWait struct {
	tried bool // an attempt was sent: the next is a re-attempt, which memory full allows
	lined bool // an attempt with LINE was sent: the caller may hold a place
}

// popped is the message a BLPOP took ("" for none).
func popped(r any) string {
	if kv, ok := r.([]any); ok && len(kv) == 2 {
		msg, _ := kv[1].(string)
		return msg
	}
	return ""
}

// fromMessage is the acquire's outcome from a grant message (G, G<ticket>, E<error>; anything
// else: not granted). The lease started at the grant, after the last attempt (sent).
func fromMessage(msg string, o Options, id string, sent time.Time) (granted, bool, error) {
	switch {
	case strings.HasPrefix(msg, "G"):
		if !o.Fair {
			return granted{reply: id, sent: sent}, false, nil
		}
		ticket, err := strconv.ParseInt(msg[1:], 10, 64)
		if err != nil {
			return granted{}, false, fmt.Errorf("redsem: unexpected grant message of the "+
				"redsem script: %q", msg)
		}
		return granted{reply: []any{id, ticket}, sent: sent}, false, nil
	case strings.HasPrefix(msg, "E"):
		return granted{}, false, serverError(msg[1:])
	}
	return granted{sent: sent}, false, nil
}

// leaveAfterCancel takes a cancelled waiter out of the line, through the pool (its own
// connection may be gone), and gives back a permit granted to it at that moment: its caller
// will never see it. unknown: a reply was lost (a grant may have been taken with it), so the
// identifier's permit is given back whatever LEAVE says.
func leaveAfterCancel(e *endpoint, name, id, msg string, unknown bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if !strings.HasPrefix(msg, "G") {
		m, err := e.poolScript(ctx, "SEM.LEAVE", name, id)
		if err != nil && !unknown {
			return // the place runs out within 6 s
		}
		msg, _ = m.(string)
	}
	if unknown || strings.HasPrefix(msg, "G") {
		_, _ = e.poolScript(ctx, "SEM.RELEASE", name, id)
	}
}

// giveBack gives back, through the pool, a permit granted to an acquire its caller gave up
// (release: SEM.RELEASE, or SEM.RELEASEALL and its arguments before the identifier); an
// identifier that holds nothing changes nothing.
func giveBack(e *endpoint, release string, name string, id string, rest ...any) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	args := append([]any{release, name}, rest...)
	_, _ = e.poolSend(ctx, append(args, id)...)
}

// ticker sends TICK on the pool when the earliest lease ends, and again at each end TICK
// reports, until stopped: the first waiter is granted when a lease runs out, not when the
// server's expiry cycle (hz) or its own next attempt finds it.
type ticker struct {
	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
}

func startTicker(e *endpoint, name string, after time.Duration) *ticker {
	tk := &ticker{}
	var fire func()
	fire = func() {
		tk.mu.Lock()
		stopped := tk.stopped
		tk.mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := e.poolScript(ctx, "SEM.TICK", name)
		cancel()
		ms, _ := v.(int64)
		if err != nil || ms <= 0 {
			return
		}
		tk.mu.Lock()
		if !tk.stopped {
			tk.timer = time.AfterFunc(time.Duration(ms)*time.Millisecond+tickLate, fire)
		}
		tk.mu.Unlock()
	}
	tk.mu.Lock()
	tk.timer = time.AfterFunc(after+tickLate, fire)
	tk.mu.Unlock()
	return tk
}

func (tk *ticker) stop() {
	if tk == nil {
		return
	}
	tk.mu.Lock()
	tk.stopped = true
	tk.timer.Stop()
	tk.mu.Unlock()
}
