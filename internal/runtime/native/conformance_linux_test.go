package native

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/runtime/runtimetest"
	"github.com/paddock-dev/paddock/internal/seccomp"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// TestConformance runs the runtime suite on the native tier, on a cgroup
// parent, uid ranges and directories of its own, its guests the Go guest
// alone.
func TestConformance(t *testing.T) {
	conformance(t, nativeDeps(t, "paddock-conformance"), "")
}

// TestConformanceFastGuest runs the suite again with every guest started
// as the fast guest (internal/guestc), as make build's daemon starts
// them: the suite's plain commands are the fast guest's, its files and
// ports its helper's, and the rest (terminals, stdin, lists, ...) hand
// it over to the Go guest mid-life.
func TestConformanceFastGuest(t *testing.T) {
	d := nativeDeps(t, "paddock-conformance-fast")
	conformance(t, d, fastGuest(t))
}

func conformance(t *testing.T, d deps, fast string) {
	bin, log, cgroups, img, prog, split := d.bin, d.log, d.cgroups, d.img, d.prog, d.split
	// Ranges far from the end-to-end tests' (1<<29 up).
	ids := &testIDs{start: 3<<30 + uint32(rand.IntN(255))*64<<16, n: 64}

	var mu sync.Mutex
	pools := map[string]*disk.Pool{} // the last pool made per runtime dir
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, dir string) runtime.Runtime {
			// A restarted daemon opens the disks again: the pool of the
			// runtime it replaces goes first.
			mu.Lock()
			old := pools[dir]
			if old != nil {
				old.Close()
			}
			mu.Unlock()
			disks, err := disk.NewPool(disk.Config{Dir: filepath.Join(dir, "disks"), DefaultSize: 256 << 20, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			// The dir's last pool is closed after the test's sandboxes
			// are removed (their cleanups come later, so run first) and
			// before its directory goes: a pool wipes removed disks
			// behind, mounted under it.
			if old == nil {
				t.Cleanup(func() {
					mu.Lock()
					last := pools[dir]
					mu.Unlock()
					last.Close()
				})
			}
			mu.Lock()
			pools[dir] = disks
			mu.Unlock()
			rt, err := New(Config{
				RunDir:      dir,
				Cgroups:     cgroups,
				Disks:       disks,
				IDs:         ids,
				Seccomp:     prog,
				SeccompBase: split.Base,
				SeccompTail: split.Tail,
				Caps:        seccomp.DockerDefaultCaps,
				GuestBinary: bin,
				FastGuest:   fast,
				Logger:      log,
			})
			if err != nil {
				t.Fatal(err)
			}
			return rt
		},
		Spec: func(t *testing.T) runtime.Spec { return runtime.Spec{Image: img} },
		Limits: func(t *testing.T, id string) api.Resources {
			g, err := cgroups.Load(id)
			if err != nil {
				t.Fatal(err)
			}
			st, err := g.Stats()
			if err != nil {
				t.Fatal(err)
			}
			return api.Resources{CPUs: cpus(t, g), MemoryBytes: st.MemoryLimit, Pids: st.PidsLimit}
		},
		Frozen: func(t *testing.T, id string) bool {
			g, err := cgroups.Load(id)
			if err != nil {
				t.Fatal(err)
			}
			return frozen(t, g)
		},
		Traces: func(t *testing.T, id string) []string {
			var left []string
			if g, err := cgroups.Load(id); err == nil {
				left = append(left, "cgroup "+g.Path())
			} else if !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatal(err)
			}
			mounts, err := os.ReadFile("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(mounts), "\n") {
				if strings.Contains(line, id) {
					left = append(left, "mount "+line)
				}
			}
			left = append(left, processesOf(t, id)...)
			mu.Lock()
			for dir, disks := range pools {
				if vols, err := disks.List(); err == nil && slices.Contains(vols, id) {
					left = append(left, "disk "+id)
				}
				if _, err := os.Lstat(filepath.Join(dir, "sandboxes", id)); err == nil {
					left = append(left, "run dir "+filepath.Join(dir, "sandboxes", id))
				}
			}
			mu.Unlock()
			return left
		},
	})
}

// guestBinary is a static binary with the guest verbs: $PADDOCK_BIN (a
// paddock binary; make test sets it), or paddock-guest built now as make
// build builds the one it embeds. The test
// binary cannot serve: it is linked dynamically, and the forker's mount
// namespace has no loader.
func guestBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PADDOCK_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "paddock-guest")
	// As make build builds the guest it embeds: static, without cgo.
	cmd := exec.Command("go", "build", "-tags", "netgo osusergo", "-o", bin, "github.com/paddock-dev/paddock/cmd/paddock-guest")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building paddock-guest (or set PADDOCK_BIN): %v\n%s", err, out)
	}
	return bin
}

// fastGuest builds the fast guest as make build builds the one it
// embeds, by the same recipe (make fast-guest: musl where it is there).
func fastGuest(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "paddock-guest-fast")
	cmd := exec.Command("make", "-s", "-C", "../../..", "fast-guest", "FAST_GUEST_BIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the fast guest: %v\n%s", err, out)
	}
	return bin
}

// cpus reads the group's CPU quota in cores.
func cpus(t *testing.T, g *cgroup.Group) float64 {
	t.Helper()
	for _, d := range g.Dirs() {
		if b, err := os.ReadFile(filepath.Join(d, "cpu.max")); err == nil { // v2
			quota, period, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
			return ratio(t, quota, period)
		}
		if b, err := os.ReadFile(filepath.Join(d, "cpu.cfs_quota_us")); err == nil { // v1
			p, err := os.ReadFile(filepath.Join(d, "cpu.cfs_period_us"))
			if err != nil {
				t.Fatal(err)
			}
			return ratio(t, strings.TrimSpace(string(b)), strings.TrimSpace(string(p)))
		}
	}
	t.Fatalf("no CPU controller for cgroup %s", g.Path())
	return 0
}

func ratio(t *testing.T, quota, period string) float64 {
	t.Helper()
	if quota == "max" || quota == "-1" {
		return 0
	}
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || p == 0 {
		t.Fatalf("CPU quota %q over period %q", quota, period)
	}
	return q / p
}

// frozen reads the group's freezer.
func frozen(t *testing.T, g *cgroup.Group) bool {
	t.Helper()
	for _, d := range g.Dirs() {
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.freeze")); err == nil { // v2
			return strings.TrimSpace(string(b)) == "1"
		}
		if b, err := os.ReadFile(filepath.Join(d, "freezer.state")); err == nil { // v1
			return strings.TrimSpace(string(b)) == "FROZEN"
		}
	}
	t.Fatalf("no freezer for cgroup %s", g.Path())
	return false
}

// processesOf lists the host processes in a cgroup named id.
func processesOf(t *testing.T, id string) []string {
	t.Helper()
	var out []string
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cgroup"))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
				t.Logf("reading the cgroups of %s: %v", p.Name(), err)
			}
			continue
		}
		if bytes.Contains(b, []byte("/"+id)) {
			out = append(out, "process "+p.Name())
		}
	}
	return out
}

// testIDs hands out n uid ranges from start.
type testIDs struct {
	mu    sync.Mutex
	start uint32
	n     int
	used  map[uint32]bool
}

func (s *testIDs) Alloc() (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used == nil {
		s.used = map[uint32]bool{}
	}
	for i := range s.n {
		base := s.start + uint32(i)<<16
		if !s.used[base] {
			s.used[base] = true
			return base, nil
		}
	}
	return 0, errdefs.New(errdefs.ErrUnavailable, "all test uid ranges are in use")
}

func (s *testIDs) Free(base uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.used, base)
}

// deps are what a test of real sandboxes needs besides disks: the guest
// binary, a cgroup parent of its own (removed at the end), the host image
// and the seccomp filter.
type deps struct {
	bin     string
	log     *slog.Logger
	cgroups *cgroup.Manager
	img     *image.Image
	prog    []byte
	split   seccomp.Split
}

// nativeDeps skips unless root and not -short, and makes deps, the
// cgroup parent named prefix and a random number.
// config is a runtime's configuration on d, in a directory of the
// test's, with a disk pool of its own (closed at the test's end) and a
// range of uids at random among 32.
func (d deps) config(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	disks, err := disk.NewPool(disk.Config{Dir: filepath.Join(dir, "disks"), DefaultSize: 256 << 20, Logger: d.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { disks.Close() })
	return Config{
		RunDir:      filepath.Join(dir, "run"),
		Cgroups:     d.cgroups,
		Disks:       disks,
		IDs:         &testIDs{start: 3<<30 + 192<<16 + uint32(rand.IntN(32))*64<<16, n: 64},
		Seccomp:     d.prog,
		SeccompBase: d.split.Base,
		SeccompTail: d.split.Tail,
		Caps:        seccomp.DockerDefaultCaps,
		GuestBinary: d.bin,
		Logger:      d.log,
	}
}

func nativeDeps(t *testing.T, prefix string) deps {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the native runtime needs root")
	}
	if testing.Short() {
		t.Skip("starts real sandboxes")
	}
	bin := guestBinary(t)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	parent := fmt.Sprintf("%s-%d", prefix, rand.IntN(1<<30))
	cgroups, err := cgroup.NewManager(parent, log)
	if err != nil {
		t.Fatalf("setting up cgroups: %v", err)
	}
	t.Cleanup(func() {
		if err := cgroups.Remove(); err != nil {
			t.Errorf("removing cgroup parent %s: %v", parent, err)
		}
	})
	images, err := image.NewStore(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	img, err := images.Get(image.HostImage)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := seccomp.Compile(seccomp.DockerDefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	// As the daemon does: the forkers load a base, each guest a tail.
	split, err := seccomp.CompileSplit(seccomp.DockerDefaultCaps)
	if err != nil {
		t.Fatal(err)
	}
	return deps{bin: bin, log: log, cgroups: cgroups, img: img, prog: prog, split: split}
}
