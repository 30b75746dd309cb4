package sandbox

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/api"
)

var update = flag.Bool("update", false, "rewrite testdata/lifecycle.md from the table")

// renderLifecycle writes the table as Markdown: a row per action, a
// column per state it is done in, each cell the state it leads to and
// how ("=": it stays; "✗": refused, or an event ignored).
func renderLifecycle() string {
	var b strings.Builder
	b.WriteString("| action \\ from |")
	for _, st := range states {
		b.WriteString(" " + string(st) + " |")
	}
	b.WriteString("\n|---|")
	for range states {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, a := range actions {
		b.WriteString("| " + string(a) + " |")
		for _, st := range states {
			mv, ok := lifecycle[st][a]
			switch {
			case !ok:
				b.WriteString(" ✗ |")
			case mv.step == stepNone:
				b.WriteString(" = |")
			case mv.to == removed:
				b.WriteString(" removed |")
			case mv.to == st:
				b.WriteString(" = (" + mv.step.String() + ") |")
			default:
				b.WriteString(" " + string(mv.to) + " (" + mv.step.String() + ") |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestLifecycleTable checks the table's shape and that it reads as
// testdata/lifecycle.md, the copy docs/ARCHITECTURE.md shows (go test
// -run TestLifecycleTable -update rewrites it after a deliberate change).
func TestLifecycleTable(t *testing.T) {
	known := map[api.State]bool{removed: true}
	for _, st := range states {
		known[st] = true
	}
	listed := map[action]bool{}
	for _, a := range actions {
		listed[a] = true
	}
	if len(lifecycle) != len(states) {
		t.Errorf("the table has %d states, the list %d", len(lifecycle), len(states))
	}
	for st, row := range lifecycle {
		if !known[st] || st == removed {
			t.Errorf("row of unknown state %q", st)
		}
		for a, mv := range row {
			if !listed[a] {
				t.Errorf("%s: action %q is not in the list of actions", st, a)
			}
			if !known[mv.to] {
				t.Errorf("%s --%s--> unknown state %q", st, a, mv.to)
			}
			switch mv.step {
			case stepNone, stepLive, stepRecord, stepAttach:
				if mv.to != st {
					t.Errorf("%s --%s--> %s by %s, which changes no state", st, a, mv.to, mv.step)
				}
			case stepStart, stepThaw:
				if mv.to != api.StateRunning {
					t.Errorf("%s --%s--> %s by %s, which runs it", st, a, mv.to, mv.step)
				}
			case stepStop:
				if mv.to != api.StateStopped && mv.to != api.StatePaused {
					t.Errorf("%s --%s--> %s by %s, which ends its processes", st, a, mv.to, mv.step)
				}
			case stepFreeze:
				if mv.to != api.StateFrozen {
					t.Errorf("%s --%s--> %s by freeze", st, a, mv.to)
				}
			case stepRemove:
				if mv.to != stateRemoving {
					t.Errorf("%s --%s--> %s by remove", st, a, mv.to)
				}
			case stepFail:
				if mv.to != api.StateFailed {
					t.Errorf("%s --%s--> %s by fail", st, a, mv.to)
				}
			}
		}
		// Every state can be removed by force and survives a restart
		// in some way: nothing is stuck.
		for _, a := range []action{actForceRemove, actRestart, actWake} {
			if _, ok := row[a]; !ok && (st != stateRemoving || a != actWake) {
				t.Errorf("%s has no move for %q", st, a)
			}
		}
	}

	got := renderLifecycle()
	path := filepath.Join("testdata", "lifecycle.md")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the table differs from %s (rerun with -update if the change is meant):\n%s", path, got)
	}
}
