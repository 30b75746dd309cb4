package metrics

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// fixedCgroup is a CgroupReader of fixed counters.
type fixedCgroup struct {
	r          Reading
	err        error
	noMem      bool
	localOOM   bool
	noPids     bool
	readsTotal int
}

func (f *fixedCgroup) ReadCgroup(r *Reading) error {
	f.readsTotal++
	if f.err != nil {
		return f.err
	}
	r.CPUNanos, r.CPUThrottledNanos, r.OOMKills = f.r.CPUNanos, f.r.CPUThrottledNanos, f.r.OOMKills
	r.MemoryBytes, r.MemoryLimitBytes, r.Pids, r.PidsLimit = f.r.MemoryBytes, f.r.MemoryLimitBytes, f.r.Pids, f.r.PidsLimit
	return nil
}

func (f *fixedCgroup) Has() (bool, bool) { return !f.noMem, !f.noPids }
func (f *fixedCgroup) LocalOOM() bool    { return f.localOOM }

type fixedDisk struct{ used, size int64 }

func (d fixedDisk) Usage() (int64, int64, error) { return d.used, d.size, nil }

// TestCgroupSourceContainers: the first container's share is the
// sandbox's less the others', the others' their own; limits default to
// the sandbox's; the sandbox's disk is all of theirs; a stopped container
// reads zero; a v2 member without memory counters leaves memory unsplit.
func TestCgroupSourceContainers(t *testing.T) {
	sandbox := Reading{CPUNanos: 10e9, CPUThrottledNanos: 3, MemoryBytes: 300 << 20, MemoryLimitBytes: 1 << 30, Pids: 12, PidsLimit: 100, OOMKills: 1}
	src := &CgroupSource{
		Cgroup: &fixedCgroup{r: sandbox, localOOM: true},
		Disk:   fixedDisk{10 << 20, 1 << 30},
		Containers: []ContainerPart{
			{Name: "web"},
			{Name: "db", Cgroup: &fixedCgroup{r: Reading{CPUNanos: 7e9, MemoryBytes: 200 << 20, MemoryLimitBytes: 512 << 20, Pids: 9, OOMKills: 2}}, Disk: fixedDisk{30 << 20, 2 << 30}},
			{Name: "idle", Cgroup: &fixedCgroup{r: Reading{CPUNanos: 1e9, MemoryBytes: 50 << 20, Pids: 1}}},
			{Name: "gone", Cgroup: &fixedCgroup{err: errdefs.NotFound("cgroup", "gone")}, Disk: fixedDisk{5 << 20, 1 << 30}},
			{Name: "stopped"},
		},
	}
	r, err := src.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Containers) != 5 {
		t.Fatalf("%d containers, want 5", len(r.Containers))
	}
	web, db, idle, gone := r.Containers[0], r.Containers[1], r.Containers[2], r.Containers[3]
	if web.Name != "web" || web.CPUNanos != 2e9 || web.MemoryBytes != 50<<20 || web.Pids != 2 || web.OOMKills != 1 || web.CPUThrottledNanos != 3 {
		t.Errorf("first container's share: %+v", web)
	}
	if web.MemoryLimitBytes != 1<<30 || web.DiskUsedBytes != 10<<20 {
		t.Errorf("first container's limit and disk: %+v", web)
	}
	if db.CPUNanos != 7e9 || db.MemoryLimitBytes != 512<<20 || db.PidsLimit != 100 || db.DiskUsedBytes != 30<<20 {
		t.Errorf("db: %+v", db)
	}
	if idle.MemoryLimitBytes != 1<<30 || idle.Pids != 1 {
		t.Errorf("idle: %+v", idle)
	}
	if gone.CPUNanos != 0 || gone.MemoryBytes != 0 || gone.DiskUsedBytes != 5<<20 {
		t.Errorf("a container whose cgroup is gone: %+v", gone)
	}
	// The sandbox's totals: its cgroup's CPU and memory, all disks, and on
	// v1 (local OOM counts) every container's OOM kills.
	if r.CPUNanos != 10e9 || r.MemoryBytes != 300<<20 || r.DiskUsedBytes != 45<<20 || r.DiskBytes != 4<<30 || r.OOMKills != 3 {
		t.Errorf("sandbox totals: %+v", r)
	}

	// v2: members have cpu.stat alone; memory and pids stay unsplit.
	src.Cgroup = &fixedCgroup{r: sandbox}
	src.Containers = []ContainerPart{
		{Name: "web"},
		{Name: "db", Cgroup: &fixedCgroup{r: Reading{CPUNanos: 4e9}, noMem: true, noPids: true}},
	}
	r, err = src.Read()
	if err != nil {
		t.Fatal(err)
	}
	if w := r.Containers[0]; w.CPUNanos != 6e9 || w.MemoryBytes != 0 || w.Pids != 0 || w.OOMKills != 1 {
		t.Errorf("first container's share on v2: %+v", w)
	}
	if r.OOMKills != 1 || r.MemoryBytes != 300<<20 {
		t.Errorf("sandbox totals on v2: %+v", r)
	}

	// Counters read one after the other may cross: never below zero.
	src.Cgroup = &fixedCgroup{r: Reading{CPUNanos: 1e9}}
	src.Containers[1].Cgroup = &fixedCgroup{r: Reading{CPUNanos: 2e9, MemoryBytes: 1}}
	if r, _ = src.Read(); r.Containers[0].CPUNanos != 0 || r.Containers[0].MemoryBytes != 0 {
		t.Errorf("crossed counters: %+v", r.Containers[0])
	}
	// A sandbox whose cgroup is gone fails the read, containers or not.
	src.Cgroup = &fixedCgroup{err: errdefs.NotFound("cgroup", "x")}
	if _, err := src.Read(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("read of a removed sandbox: %v", err)
	}
}

// TestSamplerContainers: each container gets a CPU% of its own and a
// history that outlives a new source; the sandbox's totals count the
// sandbox once.
func TestSamplerContainers(t *testing.T) {
	s, err := NewSampler(Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSource{}
	s.Register("g", f)
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		f.set(func(r *Reading) {
			r.CPUNanos = uint64(i) * 1e9
			r.Containers = []ContainerReading{
				{Name: "busy", Reading: Reading{CPUNanos: uint64(i) * 9e8}},
				{Name: "quiet", Reading: Reading{CPUNanos: uint64(i) * 1e8}},
			}
		})
		s.Tick(t0.Add(time.Duration(i) * time.Second))
	}
	cur, _, _ := s.Current("g")
	if len(cur.Containers) != 2 || cur.Containers[0].CPUPercent != 90 || cur.Containers[1].CPUPercent != 10 || cur.CPUPercent != 100 {
		t.Fatalf("current: %+v", cur)
	}
	if tot := s.Totals(); tot.CPUSeconds != 2 {
		t.Errorf("fleet CPU seconds = %v, want 2 (the sandbox once)", tot.CPUSeconds)
	}
	c, ok, hist, err := s.ContainerHistory("g", "busy", t0, t0.Add(time.Hour))
	if err != nil || !ok || c.Name != "busy" || len(hist) != 3 || hist[2].CPUSeconds != 1.8 {
		t.Fatalf("busy's history: %+v %v %+v %v", c, ok, hist, err)
	}
	if _, _, _, err := s.ContainerHistory("g", "nope", t0, t0.Add(time.Hour)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an unknown container: %v", err)
	}
	// A new source (the sandbox resumed): the history stays, the first
	// reading of the new source has no rate.
	s.Register("g", f)
	s.Tick(t0.Add(3 * time.Second))
	_, _, hist, _ = s.ContainerHistory("g", "busy", t0, t0.Add(time.Hour))
	if len(hist) != 4 || hist[3].CPUPercent != 0 {
		t.Errorf("busy's history after a new source: %+v", hist)
	}
}

// TestCgroupFilesV2Member reads a real cgroup v2 group that no parent
// enables controllers for: a container's group inside its sandbox's on a
// pure v2 host (the sandbox's holds processes). Here it is a group of the
// hybrid host's cgroup2 mount, which has neither memory nor pids: the
// same situation. It has cpu.stat alone, and says so.
func TestCgroupFilesV2Member(t *testing.T) {
	const unified = "/sys/fs/cgroup/unified"
	if b, err := os.ReadFile(unified + "/cgroup.controllers"); err != nil || strings.Contains(string(b), "memory") || strings.Contains(string(b), "pids") {
		t.Skipf("needs a cgroup2 mount at %s without the memory and pids controllers (a hybrid host), as root", unified)
	}
	dir := filepath.Join(unified, fmt.Sprintf("paddock-test-member-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("making a cgroup2 group: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cmd := exec.Command("sh", "-c", "echo $$ > "+dir+"/cgroup.procs; i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("burning CPU in %s: %v %s", dir, err, out)
	}
	f, err := OpenCgroupFiles(CgroupDirs{Mode: cgroup.V2, CPU: dir, CPUAcct: dir, Memory: dir, Pid: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if mem, pids := f.Has(); mem || pids {
		t.Errorf("a group without controllers has memory %v, pids %v", mem, pids)
	}
	if f.LocalOOM() {
		t.Error("v2 counts OOM kills in the parents too")
	}
	var r Reading
	if err := f.ReadCgroup(&r); err != nil {
		t.Fatal(err)
	}
	if r.CPUNanos < 10e6 || r.MemoryBytes != 0 || r.Pids != 0 {
		t.Errorf("reading: cpu %d ns, memory %d, pids %d; want the CPU the loop used and nothing else", r.CPUNanos, r.MemoryBytes, r.Pids)
	}
}
