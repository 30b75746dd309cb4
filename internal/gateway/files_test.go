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
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/spare"
)

// filesGateway is a Gateway with no network: enough for its per-sandbox
// files.
func filesGateway(tb testing.TB, dir string) *Gateway {
	tb.Helper()
	for _, d := range []string{"resolv", "self", "ca", "spare"} {
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
	var err error
	if g.spares, err = spare.Open(filepath.Join(dir, "spare")); err != nil {
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
	if _, err := g.prepare("sbx"); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(g.dir("sbx"), "self")
	g.refreshOne("sbx")
	for _, name := range []string{"README", "policy.json", "denials.json"} {
		if inode(t, filepath.Join(tree, name)) != inode(t, filepath.Join(g.cfg.Dir, "self", name)) {
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
	if inode(t, filepath.Join(tree, "policy.json")) == inode(t, filepath.Join(g.cfg.Dir, "self", "policy.json")) {
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
		if _, err := g.prepare(id); err != nil {
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
		p, err := g.prepare(id)
		if err != nil {
			t.Fatal(err)
		}
		if !p.bundled {
			t.Fatalf("%s: a new sandbox's bundle not linked from its generation", id)
		}
		ca := p.ca
		binds, err := g.writeFiles(id, p, host)
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
		named := false
		for _, b := range binds {
			if _, err := os.Stat(b.Source); err != nil {
				t.Errorf("%s: bind of %s: %v", id, b.Dest, err)
			}
			if b.Dest == runtime.HostnamePath {
				named = string(read(id, "files/hostname")) == id+"\n" && b.Source == filepath.Join(g.dir(id), "files", "hostname")
			}
		}
		if !named {
			t.Errorf("%s: no bind of its hostname file naming it at %s: %+v", id, runtime.HostnamePath, binds)
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
	p, err := g.prepare(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if p.bundled || string(p.ca.CertPEM()) != string(first) {
		t.Errorf("attached again: bundled %v, same CA %v; want its own CA, bundle written", p.bundled, string(p.ca.CertPEM()) == string(first))
	}
	if _, err := g.writeFiles(ids[0], p, host); err != nil {
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
		attachFiles(b, g, id, host)
		dropFiles(g, id, true)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// attachFiles makes sandbox id's directory, files and self tree, as
// Attach does without a network.
func attachFiles(tb testing.TB, g *Gateway, id string, host netip.Addr) prepared {
	tb.Helper()
	p, err := g.prepare(id)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := g.writeFiles(id, p, host); err != nil {
		tb.Fatal(err)
	}
	g.refreshOne(id)
	return p
}

// dropFiles removes sandbox id's files as Forget does; ended says its
// processes are known to have ended (Recycle), so its directory may
// become a spare.
func dropFiles(g *Gateway, id string, ended bool) {
	g.mu.Lock()
	delete(g.cas, id)
	g.mu.Unlock()
	if ended {
		g.markEnded(id)
	}
	g.removeFiles(id)
}

// inode is the inode number of path's last element, not followed.
func inode(tb testing.TB, path string) uint64 {
	tb.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestSpareDirectories: the directory of a removed sandbox whose
// processes ended becomes the next sandbox's, holding nothing of the
// first: not its CA, not its self tree's files, not a byte of its hosts
// file (the first's is longer); one whose processes are not known to
// have ended, or that holds a directory the gateway never makes, is
// deleted; and the spares are bounded.
func TestSpareDirectories(t *testing.T) {
	g := filesGateway(t, t.TempDir())
	attach := func(id string, host netip.Addr) prepared { return attachFiles(t, g, id, host) }
	remove := func(id string, ended bool) {
		t.Helper()
		dropFiles(g, id, ended)
		if _, err := os.Stat(g.dir(id)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: directory left after removal (stat: %v)", id, err)
		}
	}
	spares := func() int {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(g.cfg.Dir, "spare"))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}

	// The first sandbox: a long host address, a policy of its own (a
	// policy.json file of its own in its self tree) and a CA generation
	// that the second one will not share.
	first := attach("sbx-first", netip.MustParseAddr("10.247.100.101"))
	if err := g.eng.Set("sbx-first", &api.Policy{Presets: []string{"github"}}); err != nil {
		t.Fatal(err)
	}
	g.refreshOne("sbx-first")
	dirIno := inode(t, g.dir("sbx-first"))
	hostsIno := inode(t, filepath.Join(g.dir("sbx-first"), "files", "hosts"))
	hostnameIno := inode(t, filepath.Join(g.dir("sbx-first"), "files", "hostname"))
	// A file a crash left in its self tree.
	if err := os.WriteFile(filepath.Join(g.dir("sbx-first"), "self", ".tmp-self.json-1"), []byte("first's"), 0o644); err != nil {
		t.Fatal(err)
	}
	remove("sbx-first", true)
	if n := spares(); n != 1 {
		t.Fatalf("%d spares after removing a sandbox whose processes ended, want 1", n)
	}
	g.genMu.Lock()
	g.gen.uses = caGenSandboxes // the next sandbox gets a new CA
	g.genMu.Unlock()

	second := attach("sbx-2", netip.MustParseAddr("10.247.0.1"))
	dir := g.dir("sbx-2")
	if inode(t, dir) != dirIno {
		t.Error("the second sandbox did not take the spare directory")
	}
	if spares() != 0 {
		t.Error("the spare taken is still among the spares")
	}
	if inode(t, filepath.Join(dir, "files", "hosts")) != hostsIno {
		t.Error("the hosts file was not written over in place")
	}
	hosts, err := os.ReadFile(filepath.Join(dir, "files", "hosts"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsbx-2\n10.247.0.1\t" + SelfHost + "\n"; string(hosts) != want {
		t.Errorf("hosts of the second sandbox = %q, want %q", hosts, want)
	}
	// Its hostname file too: the first's id was longer, so the file was
	// cut to the second's.
	if inode(t, filepath.Join(dir, "files", "hostname")) != hostnameIno {
		t.Error("the hostname file was not written over in place")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "files", "hostname")); string(b) != "sbx-2\n" {
		t.Errorf("hostname of the second sandbox = %q, want %q", b, "sbx-2\n")
	}
	if !second.bundled || string(second.ca.CertPEM()) == string(first.ca.CertPEM()) {
		t.Fatal("the second sandbox has the CA of the first, which its spare directory held")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "ca.pem")); string(b) != string(second.ca.CertPEM()) {
		t.Error("the second sandbox's ca.pem is not its CA")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "files", "ca-bundle.crt")); !strings.HasSuffix(string(b), string(second.ca.CertPEM())) || strings.Contains(string(b), string(first.ca.CertPEM())) {
		t.Error("the second sandbox's bundle is not the host's plus its CA alone")
	}
	self, err := os.ReadDir(filepath.Join(dir, "self"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range self {
		names = append(names, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, "self", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "sbx-first") || strings.Contains(string(b), "github") || strings.Contains(string(b), "first's") {
			t.Errorf("the second sandbox's self/%s holds the first's: %q", e.Name(), b)
		}
	}
	if want := "README denials.json policy.json self.json"; strings.Join(names, " ") != want {
		t.Errorf("the second sandbox's self tree holds %v, want %s", names, want)
	}

	// Its processes not known to have ended: deleted, not kept.
	remove("sbx-2", false)
	if n := spares(); n != 0 {
		t.Errorf("%d spares after removing a sandbox whose processes may run", n)
	}
	// A directory the gateway never makes: deleted.
	attach("sbx-3", netip.MustParseAddr("10.247.0.1"))
	if err := os.Mkdir(filepath.Join(g.dir("sbx-3"), "self", "odd"), 0o755); err != nil {
		t.Fatal(err)
	}
	remove("sbx-3", true)
	if n := spares(); n != 0 {
		t.Errorf("%d spares after removing a directory holding another, want 0", n)
	}

	// Bounded: of spare.Max+2 removed at once, spare.Max are kept.
	var ids []string
	for i := range spare.Max + 2 {
		id := fmt.Sprintf("sbx-many-%d", i)
		attach(id, netip.MustParseAddr("10.247.0.1"))
		ids = append(ids, id)
	}
	for _, id := range ids {
		remove(id, true)
	}
	if n := spares(); n != spare.Max {
		t.Errorf("%d spares, want %d", n, spare.Max)
	}
	if ents, _ := os.ReadDir(filepath.Join(g.cfg.Dir, "sandboxes")); len(ents) != 0 {
		t.Errorf("%d sandbox directories left", len(ents))
	}
}

// TestSpareNotOntoADirectory: a sandbox attached again keeps its
// directory; the spare it did not take stays a spare.
func TestSpareNotOntoADirectory(t *testing.T) {
	g := filesGateway(t, t.TempDir())
	host := netip.MustParseAddr("10.247.0.1")
	for _, id := range []string{"sbx-a", "sbx-b"} {
		p, err := g.prepare(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.writeFiles(id, p, host); err != nil {
			t.Fatal(err)
		}
	}
	g.markEnded("sbx-a")
	g.removeFiles("sbx-a")
	before, err := os.ReadFile(filepath.Join(g.dir("sbx-b"), "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := g.prepare("sbx-b") // attached again
	if err != nil {
		t.Fatal(err)
	}
	if p.recycled {
		t.Error("a sandbox attached again took a spare")
	}
	if after, _ := os.ReadFile(filepath.Join(g.dir("sbx-b"), "ca.pem")); string(after) != string(before) {
		t.Error("a sandbox attached again lost its CA")
	}
	if ents, _ := os.ReadDir(filepath.Join(g.cfg.Dir, "spare")); len(ents) != 1 {
		t.Errorf("%d spares, want the one not taken", len(ents))
	}
}
