package sandbox

import (
	"errors"
	"sync"
	"testing"
)

// The barrier freezes once, when every capture has arrived, and thaws
// once, when every one has resumed; a capture that fails before arriving
// releases the others with an error and nothing is frozen.
func TestGroupFreeze(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failing   int // captures that fail before their pause
		freezeErr error
	}{
		{"all arrive", 0, nil},
		{"one fails first", 1, nil},
		{"two fail first", 2, nil},
		{"the freeze fails", 0, errors.New("no freezer")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			freezes, thaws := 0, 0
			g := &groupFreeze{
				n:   4,
				all: make(chan struct{}),
				freeze: func() error {
					mu.Lock()
					defer mu.Unlock()
					freezes++
					return tc.freezeErr
				},
				thaw: func() { mu.Lock(); thaws++; mu.Unlock() },
			}
			var wg sync.WaitGroup
			errs := make([]error, g.n)
			for i := range g.n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					arrived := false
					if i < tc.failing {
						g.fail(errors.New("syncfs failed"))
						return
					}
					resume, err := g.pause(&arrived)()
					if errs[i] = err; err == nil {
						resume()
					}
				}()
			}
			wg.Wait()
			wantFrozen := tc.failing == 0
			for i, err := range errs[tc.failing:] {
				if wantFrozen && tc.freezeErr == nil && err != nil {
					t.Errorf("capture %d: %v", i, err)
				}
				if (!wantFrozen || tc.freezeErr != nil) && err == nil {
					t.Errorf("capture %d went on", i)
				}
			}
			if wantFrozen && (freezes != 1 || thaws != 1) {
				t.Errorf("%d freezes, %d thaws; want 1 and 1", freezes, thaws)
			}
			if !wantFrozen && freezes != 0 {
				t.Errorf("%d freezes after a capture failed", freezes)
			}
		})
	}
}
