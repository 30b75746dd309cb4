// Package turns hands out a node's short, CPU-heavy starts (a sandbox's
// create, a process started in one) a few at a time instead of all at
// once.
//
// Started together, fifty such starts share the CPU fairly and nearly
// all of them end at once, near the end of the whole burst: a median as
// long as the burst. Taken in turns, as many at once as there are CPUs,
// the k-th ends after about k of them: at best the median halves, and
// the whole burst takes as long as before, since the CPU was busy
// either way.
//
// A turn is held while its start runs and given back when the start is
// answered (a short command's answer comes with its output and exit), or
// after Hold at most: a start that waits on I/O, or one throttled by its
// sandbox's CPU limit, lets the next one in rather than keep it out.
//
// Starts of processes go before creates (work for sandboxes that exist
// before new ones; it also makes a burst of creates and first commands
// end in the order they came), three turns in four while both wait so
// that creates are never shut out. Among process starts, sandboxes take
// turns round robin, each in the order its starts came, so that one
// sandbox's flood of starts (a container that controls others may start
// processes in them) delays another's by a turn at most.
package turns

import (
	"context"
	"sync"
	"time"
)

// Hold is the longest a turn is held before the next start may go.
const Hold = 10 * time.Millisecond

// startsPerCreate is how many process starts go between two creates
// while both wait.
const startsPerCreate = 3

// Queue orders the node's starts. A nil *Queue gives every start its turn
// at once.
type Queue struct {
	hold time.Duration

	mu   sync.Mutex
	free int
	// ring holds the keys with process starts waiting, in turn order;
	// waiting holds each one's waiters, oldest first.
	ring    []string
	waiting map[string][]*waiter
	creates []*waiter
	// streak counts the process starts granted in a row while creates
	// waited.
	streak int
}

type waiter struct {
	ready chan struct{} // closed when the turn is granted
	key   string        // "" for a create
}

// New returns a Queue of slots turns at once (at least one), each held
// at most hold.
func New(slots int, hold time.Duration) *Queue {
	return &Queue{hold: hold, free: max(slots, 1), waiting: map[string][]*waiter{}}
}

// Start waits for a turn to start a process in sandbox key. The release
// it returns gives the turn back; it may be called more than once.
func (q *Queue) Start(ctx context.Context, key string) (release func(), err error) {
	return q.take(ctx, key)
}

// Create waits for a turn to create a sandbox.
func (q *Queue) Create(ctx context.Context) (release func(), err error) {
	return q.take(ctx, "")
}

func (q *Queue) take(ctx context.Context, key string) (func(), error) {
	if q == nil {
		return func() {}, nil
	}
	q.mu.Lock()
	if q.free > 0 && q.empty() {
		q.free--
		q.mu.Unlock()
		return q.held(), nil
	}
	w := &waiter{ready: make(chan struct{}), key: key}
	q.enqueue(w)
	q.mu.Unlock()
	select {
	case <-w.ready:
		return q.held(), nil
	case <-ctx.Done():
	}
	q.mu.Lock()
	removed := q.remove(w)
	q.mu.Unlock()
	if !removed {
		q.give() // granted meanwhile: pass it on
	}
	return nil, ctx.Err()
}

// held is the release of a granted turn: it gives the turn back once,
// when called or after q.hold, whichever comes first.
func (q *Queue) held() func() {
	var once sync.Once
	give := func() { once.Do(q.give) }
	t := time.AfterFunc(q.hold, give)
	return func() {
		t.Stop()
		give()
	}
}

func (q *Queue) empty() bool { return len(q.ring) == 0 && len(q.creates) == 0 }

func (q *Queue) enqueue(w *waiter) {
	if w.key == "" {
		q.creates = append(q.creates, w)
		return
	}
	if len(q.waiting[w.key]) == 0 {
		q.ring = append(q.ring, w.key)
	}
	q.waiting[w.key] = append(q.waiting[w.key], w)
}

// remove takes w out of the queue; it reports false if w is not in it
// (its turn was granted).
func (q *Queue) remove(w *waiter) bool {
	if w.key == "" {
		for i, c := range q.creates {
			if c == w {
				q.creates = append(q.creates[:i], q.creates[i+1:]...)
				return true
			}
		}
		return false
	}
	ws := q.waiting[w.key]
	for i, c := range ws {
		if c != w {
			continue
		}
		ws = append(ws[:i], ws[i+1:]...)
		if len(ws) > 0 {
			q.waiting[w.key] = ws
			return true
		}
		delete(q.waiting, w.key)
		for j, k := range q.ring {
			if k == w.key {
				q.ring = append(q.ring[:j], q.ring[j+1:]...)
				break
			}
		}
		return true
	}
	return false
}

// give hands a turn that ended to the next waiter, or frees it.
func (q *Queue) give() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w := q.next(); w != nil {
		close(w.ready)
		return
	}
	q.free++
}

// next takes the waiter whose turn is next: a process start, unless
// creates have waited through startsPerCreate of them.
func (q *Queue) next() *waiter {
	if len(q.creates) > 0 && (len(q.ring) == 0 || q.streak >= startsPerCreate) {
		w := q.creates[0]
		q.creates = q.creates[1:]
		q.streak = 0
		return w
	}
	if len(q.ring) == 0 {
		return nil
	}
	if len(q.creates) > 0 {
		q.streak++
	}
	key := q.ring[0]
	ws := q.waiting[key]
	w := ws[0]
	q.ring = q.ring[1:]
	if len(ws) > 1 {
		q.waiting[key] = ws[1:]
		q.ring = append(q.ring, key)
	} else {
		delete(q.waiting, key)
	}
	return w
}
