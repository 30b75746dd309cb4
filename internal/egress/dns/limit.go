package dns

import (
	"sync"
	"time"
)

// limiter is a token bucket per sandbox: rate queries per second, with a
// burst of as many.
type limiter struct {
	rate  float64
	mu    sync.Mutex
	b     map[string]*bucket
	swept time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
	// suppressed counts refused queries not logged one by one; logged
	// is when a refused query was last logged.
	suppressed int
	logged     time.Time
}

// idleBucket is how long a bucket may go unused before it is dropped.
const idleBucket = time.Minute

func newLimiter(rate int) *limiter {
	return &limiter{rate: float64(rate), b: map[string]*bucket{}}
}

// allow takes a token for id. A refused query is logged at most once a
// second per sandbox (log), so a flood cannot flood the audit log either;
// the next logged query of the sandbox carries the count of those that
// were not (suppressed).
func (l *limiter) allow(id string, now time.Time) (ok bool, suppressed int, log bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > idleBucket {
		for k, b := range l.b {
			if now.Sub(b.last) > idleBucket {
				delete(l.b, k)
			}
		}
		l.swept = now
	}
	b := l.b[id]
	if b == nil {
		b = &bucket{tokens: l.rate, last: now}
		l.b[id] = b
	}
	b.tokens = min(l.rate, b.tokens+now.Sub(b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		suppressed, b.suppressed = b.suppressed, 0
		return true, suppressed, true
	}
	if now.Sub(b.logged) >= time.Second {
		b.logged = now
		suppressed, b.suppressed = b.suppressed, 0
		return false, suppressed, true
	}
	b.suppressed++
	return false, 0, false
}
