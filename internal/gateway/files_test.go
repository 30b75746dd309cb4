package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/egress"
)

// filesGateway is a Gateway with no network: enough for its per-sandbox
// files.
func filesGateway(tb testing.TB, dir string) *Gateway {
	tb.Helper()
	for _, d := range []string{"resolv", "self", "ca"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	g := &Gateway{cfg: Config{Dir: dir}, log: slog.New(slog.DiscardHandler), cas: map[string]*egress.CA{}, denials: map[string][]egress.Event{},
		selfTrees: map[string]*selfTree{}, eng: egress.NewEngine(egress.EngineConfig{}),
		bundle: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")}
	if err := g.writeSelfDefaults(); err != nil {
		tb.Fatal(err)
	}
	return g
}

// TestSelfTreeLinksDefaults: a new self tree's README, policy and
// denials are links to the shared defaults, which the first refresh
// leaves alone; a changed policy is written as a file of its own, and
// the defaults stay as they were.
func TestSelfTreeLinksDefaults(t *testing.T) {
	g := filesGateway(t, t.TempDir())
	if _, _, err := g.prepare("sbx"); err != nil {
		t.Fatal(err)
	}
	ino := func(path string) uint64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	tree := filepath.Join(g.dir("sbx"), "self")
	g.refreshOne("sbx")
	for _, name := range []string{"README", "policy.json", "denials.json"} {
		if ino(filepath.Join(tree, name)) != ino(filepath.Join(g.cfg.Dir, "self", name)) {
			t.Errorf("%s is not a link to the shared default", name)
		}
	}
	if _, err := os.Stat(filepath.Join(tree, "self.json")); err != nil {
		t.Errorf("self.json not written: %v", err)
	}
	if err := g.eng.Set("sbx", &api.Policy{Presets: []string{"github"}}); err != nil {
		t.Fatal(err)
	}
	g.refreshOne("sbx")
	if ino(filepath.Join(tree, "policy.json")) == ino(filepath.Join(g.cfg.Dir, "self", "policy.json")) {
		t.Error("a changed policy.json is still the shared default")
	}
	if b, _ := os.ReadFile(filepath.Join(g.cfg.Dir, "self", "policy.json")); strings.Contains(string(b), "github") {
		t.Errorf("the shared default changed: %q", b)
	}
}

// TestForgetRacesSelfWriter: a self write under way when a sandbox is
// forgotten never leaves its directory behind (TestKillDuringDeletes saw
// state/gateway/sandboxes/<id> stay once).
func TestForgetRacesSelfWriter(t *testing.T) {
	g := filesGateway(t, t.TempDir())
	for i := range 100 {
		id := fmt.Sprintf("sbx-%d", i)
		if _, _, err := g.prepare(id); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				g.noteDenialQuiet(id, n)
				g.refreshOne(id)
			}
		}()
		time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
		g.removeFiles(id)
		close(stop)
		<-done
		if _, err := os.Stat(g.dir(id)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: directory left behind after removeFiles (stat: %v)", id, err)
		}
	}
}

// TestCAGenerations: sandboxes made one after another share a CA, and
// the files that carry it, until the generation has served its share;
// each sandbox's bundle is the host's plus its own CA; a sandbox keeps
// its CA (and a restarted daemon finds it) after its generation was
// replaced; and removing the sandboxes leaves no file of theirs behind.
func TestCAGenerations(t *testing.T) {
	g := filesGateway(t, t.TempDir())
	host := netip.MustParseAddr("10.247.0.1")
	read := func(id, name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(g.dir(id), name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var ids []string
	for i := range caGenSandboxes + 1 {
		id := fmt.Sprintf("sbx-%d", i)
		ca, bundled, err := g.prepare(id)
		if err != nil {
			t.Fatal(err)
		}
		if !bundled {
			t.Fatalf("%s: a new sandbox's bundle not linked from its generation", id)
		}
		binds, err := g.writeFiles(id, ca, host, bundled)
		if err != nil {
			t.Fatal(err)
		}
		if want := append(append(append([]byte(nil), g.bundle...), '\n'), ca.CertPEM()...); string(read(id, "files/ca-bundle.crt")) != string(want) {
			t.Errorf("%s: the bundle is not the host's plus the sandbox's CA", id)
		}
		if string(read(id, "ca.pem")) != string(ca.CertPEM()) {
			t.Errorf("%s: ca.pem is not its CA", id)
		}
		if fi, err := os.Stat(filepath.Join(g.dir(id), "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: ca.key: %v, %v; want mode 0600", id, fi, err)
		}
		for _, b := range binds {
			if _, err := os.Stat(b.Source); err != nil {
				t.Errorf("%s: bind of %s: %v", id, b.Dest, err)
			}
		}
		ids = append(ids, id)
	}
	first, last := read(ids[0], "ca.pem"), read(ids[len(ids)-1], "ca.pem")
	if string(read(ids[caGenSandboxes-1], "ca.pem")) != string(first) {
		t.Error("sandboxes of one generation have different CAs")
	}
	if string(last) == string(first) {
		t.Errorf("sandbox %d still has the first generation's CA", caGenSandboxes+1)
	}
	if gens, _ := os.ReadDir(filepath.Join(g.cfg.Dir, "ca")); len(gens) != 1 {
		t.Errorf("%d generation directories, want the current one alone", len(gens))
	}
	// A restarted daemon reloads the first sandbox's CA from its links.
	g.mu.Lock()
	delete(g.cas, ids[0])
	g.mu.Unlock()
	ca, err := g.ca(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if string(ca.CertPEM()) != string(first) {
		t.Error("the reloaded CA is not the one the sandbox had")
	}
	// Attached again (a resume), a sandbox keeps its CA and bundle.
	ca, bundled, err := g.prepare(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if bundled || string(ca.CertPEM()) != string(first) {
		t.Errorf("attached again: bundled %v, same CA %v; want its own CA, bundle written", bundled, string(ca.CertPEM()) == string(first))
	}
	if _, err := g.writeFiles(ids[0], ca, host, bundled); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(read(ids[0], "files/ca-bundle.crt")), string(first)) {
		t.Error("attached again: its bundle lost its CA")
	}
	for _, id := range ids {
		g.removeFiles(id)
	}
	if ents, _ := os.ReadDir(filepath.Join(g.cfg.Dir, "sandboxes")); len(ents) != 0 {
		t.Errorf("%d sandbox directories left", len(ents))
	}
}

// noteDenialQuiet records a denial without waking a writer, so that each
// refresh has something new to write.
func (g *Gateway) noteDenialQuiet(id string, n int) {
	g.mu.Lock()
	g.denials[id] = append(g.denials[id][:0], egress.Event{Kind: egress.KindTCP, Action: "deny", Port: uint16(n)})
	g.mu.Unlock()
}

// BenchmarkSandboxFiles is what one sandbox's create and delete cost the
// gateway's files (Attach and Forget without the network), with the
// self tree's first write and the host's own CA bundle. cpu-ns/op is the
// process's user and system CPU per op (the kernel's inode work is
// system time).
func BenchmarkSandboxFiles(b *testing.B) {
	g := filesGateway(b, b.TempDir())
	if host, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		g.bundle = host
	}
	host := netip.MustParseAddr("10.247.0.1")
	b.ReportAllocs()
	cpu0 := cpuTime()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("sbx-%d", i)
		ca, bundled, err := g.prepare(id)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := g.writeFiles(id, ca, host, bundled); err != nil {
			b.Fatal(err)
		}
		g.refreshOne(id)
		g.mu.Lock()
		delete(g.cas, id)
		g.mu.Unlock()
		g.removeFiles(id)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
