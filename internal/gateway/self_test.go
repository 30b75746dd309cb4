package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// TestWriteSelfOnlyChanged: a refresh rewrites only the self files whose
// content changed; self.json, whose usage sample is new every tick, is
// rewritten at once when anything but the sample's time changed and
// otherwise only after selfStale; a failed write is tried again.
func TestWriteSelfOnlyChanged(t *testing.T) {
	g := &Gateway{cfg: Config{Dir: t.TempDir()}}
	dir := filepath.Join(g.dir("sbx"), "self")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inodes := func() map[string]uint64 {
		t.Helper()
		out := map[string]uint64{}
		for _, name := range []string{"self.json", "policy.json", "denials.json"} {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			out[name] = fi.Sys().(*syscall.Stat_t).Ino // each write replaces the file
		}
		return out
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	view := func(at time.Time, cpu float64, preset string) api.Self {
		return api.Self{Sandbox: "sbx", Usage: &api.Sample{Time: at, CPUSeconds: cpu}, Policy: api.Policy{Presets: []string{preset}}, Denials: []api.Denial{}}
	}
	tree := &selfTree{written: map[string]uint64{}}
	step := func(what string, v api.Self, now time.Time, rewritten ...string) {
		t.Helper()
		before := inodes()
		g.writeSelf("sbx", v, tree, now)
		after := inodes()
		for name := range before {
			want := false
			for _, r := range rewritten {
				want = want || r == name
			}
			if got := after[name] != before[name]; got != want {
				t.Errorf("%s: %s rewritten %v, want %v", what, name, got, want)
			}
		}
	}

	g.writeSelf("sbx", view(t0, 1, "p1"), tree, t0)
	step("only the sample's time changed", view(t0.Add(time.Second), 1, "p1"), t0.Add(time.Second))
	step("the usage changed", view(t0.Add(2*time.Second), 2, "p1"), t0.Add(2*time.Second), "self.json")
	step("the time again, before selfStale", view(t0.Add(5*time.Second), 2, "p1"), t0.Add(5*time.Second))
	step("the time again, after selfStale", view(t0.Add(13*time.Second), 2, "p1"), t0.Add(13*time.Second), "self.json")
	step("the policy changed", view(t0.Add(14*time.Second), 2, "p2"), t0.Add(14*time.Second), "self.json", "policy.json")
	if b, _ := os.ReadFile(filepath.Join(dir, "policy.json")); !strings.Contains(string(b), `"p2"`) {
		t.Errorf("policy.json = %q", b)
	}

	// A write that fails is not recorded: the next refresh tries again.
	os.RemoveAll(dir)
	g.writeSelf("sbx", view(t0.Add(15*time.Second), 3, "p3"), tree, t0.Add(15*time.Second))
	if _, ok := tree.written["policy.json"]; ok {
		t.Error("a failed write was recorded as written")
	}
	os.MkdirAll(dir, 0o755)
	g.writeSelf("sbx", view(t0.Add(16*time.Second), 3, "p3"), tree, t0.Add(16*time.Second))
	for name, want := range map[string]string{"policy.json": `"p3"`} {
		if b, _ := os.ReadFile(filepath.Join(dir, name)); !strings.Contains(string(b), want) {
			t.Errorf("%s = %q after the failed refresh was retried, want %q", name, b, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "self.json")); err != nil {
		t.Errorf("self.json not written again after the failed refresh: %v", err)
	}
}

// TestPokeRefreshesThePoked: a poke names the sandbox whose self tree to
// refresh, so that a create (which pokes) does not refresh every tree;
// pokes made before a refresh are taken together, once.
func TestPokeRefreshesThePoked(t *testing.T) {
	g := &Gateway{wake: make(chan struct{}, 1)}
	if d := g.takeDirty(); len(d) != 0 {
		t.Fatalf("dirty before any poke: %v", d)
	}
	g.poke("a")
	g.poke("b")
	g.poke("a")
	select {
	case <-g.wake:
	default:
		t.Fatal("a poke did not wake the refresher")
	}
	d := g.takeDirty()
	if _, ok := d["a"]; !ok || len(d) != 2 {
		t.Fatalf("dirty after pokes of a, b, a: %v", d)
	}
	if _, ok := d["b"]; !ok {
		t.Fatalf("dirty after pokes of a, b, a: %v", d)
	}
	if d := g.takeDirty(); len(d) != 0 {
		t.Fatalf("dirty taken twice: %v", d)
	}
}

// TestSelfSwapIn: a self file is written into its next version and
// exchanged in, so rewrites reuse two inodes and make none; a next
// version that is a link to another file (the defaults) or a symbolic
// link is replaced, never written through; a recycled directory keeps
// the tree's own files, emptied, as next versions, and never a link.
func TestSelfSwapIn(t *testing.T) {
	g := &Gateway{cfg: Config{Dir: t.TempDir()}}
	sb := g.dir("sbx")
	dir := filepath.Join(sb, "self")
	for _, d := range []string{dir, filepath.Join(sb, "files")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path, next := filepath.Join(dir, "self.json"), filepath.Join(sb, nextPrefix+"self.json")
	write := func(content string) {
		t.Helper()
		if err := swapIn(dir, "self.json", []byte(content)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != content {
			t.Fatalf("self.json = %q, %v; want %q", b, err, content)
		}
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o644 {
			t.Fatalf("self.json: %v, %v; want mode 0644", fi, err)
		}
	}
	write(`{"n": 1}`)
	write(`{"n": 2, "longer": true}`)
	pair := map[uint64]bool{inode(t, path): true, inode(t, next): true}
	for _, c := range []string{`{"n": 3}`, `{"n": 4, "longer": true}`, `{}`} {
		write(c)
		if !pair[inode(t, path)] || !pair[inode(t, next)] {
			t.Fatalf("write %s made an inode: the pair was %v", c, pair)
		}
	}

	outside := filepath.Join(g.cfg.Dir, "defaults.json")
	if err := os.WriteFile(outside, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for what, plant := range map[string]func() error{
		"a hard link":     func() error { return os.Link(outside, next) },
		"a symbolic link": func() error { return os.Symlink(outside, next) },
	} {
		if err := os.Remove(next); err != nil {
			t.Fatal(err)
		}
		if err := plant(); err != nil {
			t.Fatal(err)
		}
		write(`{"after": "` + what + `"}`)
		if b, _ := os.ReadFile(outside); string(b) != "keep" {
			t.Fatalf("with the next version %s, the file it names was written: %q", what, b)
		}
	}

	// Recycled: self.json emptied into its next version (taken: the link
	// to the defaults is unlinked instead), policy.json, a link to the
	// defaults, unlinked and the defaults kept.
	if err := os.Remove(next); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(outside, filepath.Join(dir, "policy.json")); err != nil {
		t.Fatal(err)
	}
	own := inode(t, path)
	if err := emptyDir(sb); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("the recycled self tree holds %d files", len(ents))
	}
	fi, err := os.Lstat(next)
	if err != nil || inode(t, next) != own || fi.Size() != 0 {
		t.Errorf("the recycled directory's next self.json: %v, %v; want the tree's own file, empty", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(sb, nextPrefix+"policy.json")); err != nil {
		if b, _ := os.ReadFile(outside); string(b) != "keep" {
			t.Errorf("the defaults were emptied: %q", b)
		}
	} else {
		t.Error("a link to the defaults became a next version")
	}
	write(`{"sandbox": "next"}`)
	if inode(t, path) != own {
		t.Error("the next sandbox's first write did not take the recycled file")
	}
}
