package gateway

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteSelfOnlyChanged: a refresh rewrites only the self files whose
// content changed (the usage in self.json changes every tick; the README,
// the policy and the denials seldom do), and a failed write is tried again.
func TestWriteSelfOnlyChanged(t *testing.T) {
	g := &Gateway{cfg: Config{Dir: t.TempDir()}}
	dir := filepath.Join(g.dir("sbx"), "self")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	inode := func(name string) uint64 {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return statIno(fi)
	}
	written := map[string][]byte{}
	view := func(usage int, policy string) map[string]any {
		return map[string]any{"sandbox": "sbx", "usage": usage, "policy": policy, "denials": []string{}}
	}

	g.writeSelf("sbx", view(1, "p1"), written)
	before := map[string]uint64{}
	for _, name := range []string{"README", "self.json", "policy.json", "denials.json"} {
		before[name] = inode(name) // each write replaces the file: a new inode
	}
	g.writeSelf("sbx", view(2, "p1"), written)
	for name, changed := range map[string]bool{"README": false, "self.json": true, "policy.json": false, "denials.json": false} {
		if got := inode(name) != before[name]; got != changed {
			t.Errorf("%s rewritten: %v, want %v", name, got, changed)
		}
	}
	mid := inode("policy.json")
	g.writeSelf("sbx", view(2, "p2"), written)
	if inode("policy.json") == mid {
		t.Error("policy.json not rewritten after the policy changed")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "policy.json")); string(b) != "\"p2\"\n" {
		t.Errorf("policy.json = %q", b)
	}

	// A write that fails is not recorded: the next refresh tries again.
	os.RemoveAll(dir)
	g.writeSelf("sbx", view(3, "p3"), written)
	if _, ok := written["policy.json"]; ok {
		t.Error("a failed write was recorded as written")
	}
	os.MkdirAll(dir, 0o755)
	g.writeSelf("sbx", view(3, "p3"), written)
	if b, _ := os.ReadFile(filepath.Join(dir, "policy.json")); string(b) != "\"p3\"\n" {
		t.Errorf("policy.json = %q after the failed refresh was retried, want \"p3\"", b)
	}
}

func statIno(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }
