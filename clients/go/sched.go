package redsem

import (
	"container/heap"
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
	"weak"
)

// --- The refreshes: one scheduler per client ----------------------------------------------
//
// A held permit costs no goroutine and no connection: every permit refreshed in the
// background by one client is due in that client's scheduler, a heap ordered by when its next
// refresh is due. One goroutine runs while the heap has permits (and linger after the last):
// it sleeps until the earliest is due and has each due refresh sent by a goroutine of its own
// for that call, through the client's pool (a connection borrowed for the call only), at most
// half the pool's connections at once, so that the application's calls always find some. A
// refresh that gets no answer is tried again every retryPause until the permit's deadline,
// each try bounded by tryFor, so that one whose node is down does not hold up the others.

const (
	// retryPause is how soon a refresh that got no answer is tried again.
	retryPause = 200 * time.Millisecond
	// tryFor bounds one try of a background refresh (its resends in Redis Cluster included).
	tryFor = time.Second
	// linger: the goroutine ends once no permit was held for this long (a permit taken and
	// given back at once, again and again, starts it once).
	linger = 5 * time.Second
)

type scheduler struct {
	mu      sync.Mutex
	due     dueHeap
	running bool          // the goroutine runs
	wakeAt  time.Time     // when its timer wakes it (zero: it waits for a refresh to end)
	busy    int           // refreshes under way
	most    int           // refreshes at once
	wake    chan struct{} // a permit due earlier, or a refresh done
	ended   sync.Cond     // a refresh done (a release waits for its permit's)
}

// dueHeap orders the permits by when their next refresh is due.
type dueHeap []*held

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].slot, h[j].slot = i, j
}
func (h *dueHeap) Push(x any) {
	p := x.(*held)
	p.slot = len(*h)
	*h = append(*h, p)
}
func (h *dueHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.slot = -1
	return p
}

var schedulers sync.Map // weak.Pointer to the *redis.Client or *redis.ClusterClient -> *scheduler

func schedulerOf(l *line) *scheduler {
	var key any
	var poolSize int
	if l.cluster != nil {
		key, poolSize = weak.Make(l.cluster), l.cluster.Options().PoolSize
	} else {
		key, poolSize = weak.Make(l.client), l.client.Options().PoolSize
	}
	if v, ok := schedulers.Load(key); ok {
		return v.(*scheduler)
	}
	s := &scheduler{most: max(poolSize/2, 1), wake: make(chan struct{}, 1)}
	s.ended.L = &s.mu
	v, loaded := schedulers.LoadOrStore(key, s)
	if !loaded {
		if l.cluster != nil {
			addCleanup(l.cluster, key)
		} else {
			addCleanup(l.client, key)
		}
	}
	return v.(*scheduler)
}

func addCleanup[T any](client *T, key any) {
	runtime.AddCleanup(client, func(key any) { schedulers.Delete(key) }, key)
}

// add has h refreshed from at on, until remove.
func (s *scheduler) add(h *held, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.sched, h.due = s, at
	s.pushLocked(h)
}

func (s *scheduler) pushLocked(h *held) {
	heap.Push(&s.due, h)
	// The goroutine is woken only for a permit due before it wakes anyway: an acquire made
	// after another of the same lease wakes nothing.
	switch {
	case !s.running:
		s.running = true
		go s.run()
	case h.slot == 0 && h.due.Before(s.wakeAt):
		s.signal()
	}
}

func (s *scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// remove stops h's refreshes, and waits for one under way to end.
func (s *scheduler) remove(h *held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.removed = true
	if h.slot >= 0 {
		heap.Remove(&s.due, h.slot)
	}
	for h.refreshing {
		s.ended.Wait()
	}
}

// run sends the refreshes as they fall due, while any permit is due.
func (s *scheduler) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	s.mu.Lock()
	idle := false
	for {
		if len(s.due) == 0 {
			if idle {
				s.running = false
				s.mu.Unlock()
				return
			}
			idle = true
			s.wakeAt = time.Now().Add(linger)
			s.mu.Unlock()
			timer.Reset(linger)
			select {
			case <-timer.C:
			case <-s.wake:
			}
			s.mu.Lock()
			continue
		}
		idle = false
		wait := time.Until(s.due[0].due)
		if wait <= 0 && s.busy < s.most {
			h := heap.Pop(&s.due).(*held)
			h.refreshing = true
			s.busy++
			go s.refresh(h)
			continue
		}
		if wait > 0 {
			s.wakeAt = time.Now().Add(wait)
			s.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-s.wake:
			}
		} else { // as many refreshes under way as may be: the next to end wakes it
			s.wakeAt = time.Time{}
			s.mu.Unlock()
			<-s.wake
		}
		s.mu.Lock()
	}
}

// refresh sends one background refresh of h and has its next one due.
func (s *scheduler) refresh(h *held) {
	next, again := h.backgroundRefresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	h.refreshing = false
	s.busy--
	if again && !h.removed {
		h.due = next
		s.pushLocked(h)
	}
	s.ended.Broadcast()
	s.signal()
}

// backgroundRefresh is one refresh of the scheduler: when the next is due, and whether there
// is one (none once the permit is lost).
func (h *held) backgroundRefresh() (time.Time, bool) {
	h.mu.Lock()
	until := h.confirmedUntil
	h.mu.Unlock()
	now := time.Now()
	if !now.Before(until) {
		h.noteDeadline()
		return time.Time{}, false
	}
	end := earlier(until, now.Add(tryFor))
	ctx, cancel := context.WithDeadline(context.Background(), end)
	err := h.refresh(ctx, end)
	cancel()
	switch {
	case err == nil:
		return time.Now().Add(h.lease / 3), true
	case errors.Is(err, ErrPermitLost), errors.Is(err, ErrReleased):
		return time.Time{}, false
	}
	// No answer: again soon; at the deadline it is lost.
	h.mu.Lock()
	until = h.confirmedUntil
	h.mu.Unlock()
	return earlier(time.Now().Add(retryPause), until), true
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
