package turns

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// queued reports how many waiters q holds.
func queued(q *Queue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.creates)
	for _, ws := range q.waiting {
		n += len(ws)
	}
	return n
}

// waitQueued waits until q holds n waiters.
func waitQueued(t *testing.T, q *Queue, n int) {
	t.Helper()
	for range 5000 {
		if queued(q) == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the queue holds %d waiters, want %d", queued(q), n)
}

// idle fails unless every turn of q is free and nothing waits.
func idle(t *testing.T, q *Queue, slots int) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.free != slots || len(q.ring) != 0 || len(q.waiting) != 0 || len(q.creates) != 0 {
		t.Fatalf("queue not idle: %d of %d turns free, ring %v, %d keys and %d creates waiting",
			q.free, slots, q.ring, len(q.waiting), len(q.creates))
	}
}

func TestNilQueueGivesEveryTurn(t *testing.T) {
	var q *Queue
	for range 3 {
		release, err := q.Start(t.Context(), "a")
		if err != nil {
			t.Fatal(err)
		}
		release()
		if release, err = q.Create(t.Context()); err != nil {
			t.Fatal(err)
		}
		release()
	}
}

// TestOrder queues creates and the starts of two sandboxes behind a held
// turn: starts go first, sandboxes round robin, and a create after every
// startsPerCreate starts.
func TestOrder(t *testing.T) {
	q := New(1, time.Hour)
	hold, err := q.Create(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	enqueue := func(name string, take func() (func(), error)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := take()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			release()
		}()
	}
	steps := []struct {
		name string
		key  string // "" for a create
	}{{"c1", ""}, {"a1", "a"}, {"a2", "a"}, {"c2", ""}, {"a3", "a"}, {"b1", "b"}, {"a4", "a"}, {"a5", "a"}, {"c3", ""}}
	for i, st := range steps {
		if st.key == "" {
			enqueue(st.name, func() (func(), error) { return q.Create(t.Context()) })
		} else {
			enqueue(st.name, func() (func(), error) { return q.Start(t.Context(), st.key) })
		}
		waitQueued(t, q, i+1)
	}
	hold()
	wg.Wait()
	want := []string{"a1", "b1", "a2", "c1", "a3", "a4", "a5", "c2", "c3"}
	if len(order) != len(want) {
		t.Fatalf("granted %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("granted %v, want %v", order, want)
		}
	}
	idle(t, q, 1)
}

// TestHoldEnds: a turn never given back lets the next start in after the
// hold, and its late release frees nothing twice.
func TestHoldEnds(t *testing.T) {
	q := New(1, 20*time.Millisecond)
	first, err := q.Start(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	second, err := q.Start(ctx, "b")
	if err != nil {
		t.Fatalf("the next start never got a turn after the first's hold: %v", err)
	}
	first()
	first()
	second()
	idle(t, q, 1)
}

// TestCancelledWait: a start whose caller gives up leaves the queue, and
// the turns come back whole.
func TestCancelledWait(t *testing.T) {
	q := New(1, time.Hour)
	hold, err := q.Create(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := q.Start(ctx, "a")
		done <- err
	}()
	waitQueued(t, q, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v, want context.Canceled", err)
	}
	hold()
	idle(t, q, 1)
}

// TestBoundUnderChurn: many starts and creates at once, some giving up
// while they wait, never hold more turns than there are, and every turn
// comes back (run with -race).
func TestBoundUnderChurn(t *testing.T) {
	const slots = 2
	q := New(slots, time.Hour)
	var (
		in, most atomic.Int32
		wg       sync.WaitGroup
	)
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := t.Context()
			if i%5 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(500))*time.Microsecond)
				defer cancel()
			}
			take := func() (func(), error) { return q.Start(ctx, string(rune('a'+i%7))) }
			if i%3 == 0 {
				take = func() (func(), error) { return q.Create(ctx) }
			}
			release, err := take()
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Error(err)
				}
				return
			}
			n := in.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			in.Add(-1)
			release()
		}()
	}
	wg.Wait()
	if m := most.Load(); m > slots || m == 0 {
		t.Fatalf("at most %d turns were held at once, want 1 to %d", m, slots)
	}
	idle(t, q, slots)
}

// TestCancelWhileGranted: a wait given up just as its turn is granted
// passes the turn on instead of losing it.
func TestCancelWhileGranted(t *testing.T) {
	q := New(1, time.Hour)
	for range 200 {
		hold, err := q.Create(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan func(), 1)
		go func() {
			release, err := q.Start(ctx, "a")
			if err != nil {
				release = func() {}
			}
			done <- release
		}()
		waitQueued(t, q, 1)
		cancel()
		hold()
		(<-done)()
		idle(t, q, 1)
	}
}
