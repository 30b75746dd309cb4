package native

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/runtime"
)

// TestRunDirRecycled: a removed sandbox's run dir, its guest ended, is
// emptied into a spare (its log truncated, its socket gone), which the
// next guest's start takes: the same directory, a log holding nothing of
// the first's, a guest that comes up on its new socket. A restart of the
// runtime deletes the spares.
func TestRunDirRecycled(t *testing.T) {
	d := nativeDeps(t, "paddock-rundir")
	cfg := d.config(t)
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			rt.Close()
		}
	})
	ctx := context.Background()
	spares := filepath.Join(cfg.RunDir, "spare")
	start := func() runtime.Instance {
		t.Helper()
		inst, err := rt.Start(ctx, runtime.Spec{Image: d.img})
		if err != nil {
			t.Fatal(err)
		}
		return inst
	}

	first := start()
	firstDir := rt.dir(first.ID())
	fi, err := os.Stat(firstDir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(firstDir, "guest.log"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("the first sandbox's guest log\n")
	f.Close()
	if err := rt.Remove(ctx, first.ID()); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(spares)
	if err != nil || len(ents) != 1 {
		t.Fatalf("spares after a removal: %v, %v; want one", ents, err)
	}
	spare := filepath.Join(spares, ents[0].Name())
	inside, _ := os.ReadDir(spare)
	if len(inside) != 1 || inside[0].Name() != "guest.log" {
		t.Errorf("the spare holds %v, want guest.log alone", inside)
	}
	if st, err := os.Stat(filepath.Join(spare, "guest.log")); err != nil || st.Size() != 0 {
		t.Errorf("the spare's guest.log: %v, %v; want it empty", st, err)
	}

	second := start()
	secondDir := rt.dir(second.ID())
	si, err := os.Stat(secondDir)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(fi, si) {
		t.Error("the second guest did not take the spare run dir")
	}
	if b, _ := os.ReadFile(filepath.Join(secondDir, "guest.log")); strings.Contains(string(b), "first sandbox") {
		t.Errorf("the second guest's log holds the first's: %q", b)
	}
	if ents, _ := os.ReadDir(spares); len(ents) != 0 {
		t.Errorf("spares after the second start: %v", ents)
	}
	// A guest killed before the removal: its run dir goes to the spares
	// too (its cgroup is found and removed); the runtime's next start
	// deletes them.
	if err := rt.Remove(ctx, second.ID()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(spares); len(ents) != 1 {
		t.Fatalf("spares after the second removal: %v", ents)
	}
	rt.Close()
	closed = true
	rt2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt2.Close() })
	if ents, _ := os.ReadDir(spares); len(ents) != 0 {
		t.Errorf("spares after a restart: %v", ents)
	}
}
