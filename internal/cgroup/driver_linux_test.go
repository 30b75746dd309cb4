package cgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// These tests run the v1 and v2 drivers against a fake cgroupfs: a
// directory of plain files. They need no root and no controllers, so they
// pin down, on any host, which file each operation writes and what, in
// particular for the v2 controllers a hybrid host cannot offer.

// fakeTree writes files (path relative to root → contents) under a new
// temporary root.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// emptyFiles truncates the files under root, so that what a driver writes
// next reads back alone.
func emptyFiles(t *testing.T, root string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(root, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func wantFiles(t *testing.T, root string, want map[string]string) {
	t.Helper()
	for name, w := range want {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if string(b) != w {
			t.Errorf("%s = %q, want %q", name, b, w)
		}
	}
}

// v2Files is a fake unified hierarchy with a parent "paddock" and its
// child "s1", as the kernel would show them once the root enabled cpu,
// memory and pids for its children.
func v2Files() map[string]string {
	files := map[string]string{
		"cgroup.controllers":             "cpuset cpu io memory hugetlb pids rdma misc\n",
		"cgroup.subtree_control":         "",
		"paddock/cgroup.controllers":     "cpu memory pids\n",
		"paddock/cgroup.subtree_control": "",
	}
	for _, dir := range []string{"paddock", "paddock/s1"} {
		for _, f := range []string{
			"memory.swap.max", "memory.peak", "memory.reclaim", "memory.oom.group",
			"memory.max", "cpu.max", "pids.max", "cgroup.kill", "cgroup.freeze",
		} {
			files[dir+"/"+f] = ""
		}
	}
	return files
}

func TestV2SetupEnablesControllers(t *testing.T) {
	root := fakeTree(t, v2Files())
	h := newV2Hierarchy(root, true)
	if err := h.setup("/paddock"); err != nil {
		t.Fatalf("setup: %v", err)
	}
	wantFiles(t, root, map[string]string{
		"cgroup.subtree_control":         "+cpu +memory +pids",
		"paddock/cgroup.subtree_control": "+cpu +memory +pids",
	})
	if h.ctrl != allControllers || !h.swap || !h.peak || !h.reclaim || !h.oomGrp || !h.kill || !h.freezer {
		t.Errorf("setup found %+v, want every controller and feature", h)
	}
}

func TestV2SetupLeavesEnabledControllers(t *testing.T) {
	files := v2Files()
	files["cgroup.subtree_control"] = "cpu io memory pids\n"
	files["paddock/cgroup.subtree_control"] = "memory\n"
	root := fakeTree(t, files)
	if err := newV2Hierarchy(root, true).setup("/paddock"); err != nil {
		t.Fatalf("setup: %v", err)
	}
	wantFiles(t, root, map[string]string{
		"cgroup.subtree_control": "cpu io memory pids\n", // untouched
		// Only what is missing is written (over the fake's old contents).
		"paddock/cgroup.subtree_control": "+cpu +pids",
	})
}

func TestV2SetupNeedsControllers(t *testing.T) {
	files := v2Files()
	files["cgroup.controllers"] = "cpu io pids\n"
	files["paddock/cgroup.controllers"] = "cpu pids\n"

	err := newV2Hierarchy(fakeTree(t, files), true).setup("/paddock")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("strict setup without memory = %v, want ErrUnavailable naming memory", err)
	}

	h := newV2Hierarchy(fakeTree(t, files), false)
	if err := h.setup("/paddock"); err != nil {
		t.Fatalf("lenient setup: %v", err)
	}
	if h.ctrl != ctrlCPU|ctrlPids {
		t.Errorf("controllers = %s, want cpu,pids", h.ctrl)
	}
	g := h.group("/paddock/s1")
	if err := g.checkLimits(Limits{MemoryBytes: 64 << 20}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("checkLimits(memory) = %v, want ErrUnavailable", err)
	}
	if err := g.checkLimits(Limits{CPUs: 1, Pids: 5}); err != nil {
		t.Errorf("checkLimits(cpu, pids) = %v", err)
	}
}

// TestV2NestedTakesNoLimits: on v2 a container's group inside its
// sandbox's (which holds processes, so enables nothing for it) is made
// without limits and refused with them, whatever the parent enables.
func TestV2NestedTakesNoLimits(t *testing.T) {
	root := fakeTree(t, v2Files())
	m, err := newManager("paddock", newV2Hierarchy(root, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("s1/web", Limits{MemoryBytes: 64 << 20}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a nested group with limits on v2: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "paddock/s1/web")); !os.IsNotExist(err) {
		t.Fatalf("the refused group was made: %v", err)
	}
	if _, err := m.Create("s1/web", Limits{}); err != nil {
		t.Fatalf("a nested group without limits on v2: %v", err)
	}
}

func TestV2Limits(t *testing.T) {
	root := fakeTree(t, v2Files())
	h := newV2Hierarchy(root, true)
	if err := h.setup("/paddock"); err != nil {
		t.Fatal(err)
	}
	g := h.group("/paddock/s1")
	limitFiles := []string{
		"paddock/s1/memory.max", "paddock/s1/memory.swap.max", "paddock/s1/memory.oom.group",
		"paddock/s1/cpu.max", "paddock/s1/pids.max", "paddock/s1/memory.reclaim",
	}

	// A new group: every limit, swap off, OOM kills one process only.
	if err := g.setLimits(Limits{CPUs: 0.5, MemoryBytes: 64 << 20, Pids: 20}, true); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"paddock/s1/memory.max":       "67108864",
		"paddock/s1/memory.swap.max":  "0",
		"paddock/s1/memory.oom.group": "0",
		"paddock/s1/cpu.max":          "50000 100000",
		"paddock/s1/pids.max":         "20",
	})

	// A new unlimited group writes only what must differ from the defaults.
	emptyFiles(t, root, limitFiles...)
	if err := g.setLimits(Limits{}, true); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"paddock/s1/memory.max": "", "paddock/s1/memory.swap.max": "0", "paddock/s1/cpu.max": "", "paddock/s1/pids.max": "",
	})

	// An update writes every limit, unlimited ones as "max".
	emptyFiles(t, root, limitFiles...)
	if err := os.WriteFile(filepath.Join(root, "paddock/s1/memory.current"), []byte("1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := g.setLimits(Limits{Pids: 7}, false); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"paddock/s1/memory.max": "max", "paddock/s1/memory.swap.max": "", "paddock/s1/cpu.max": "max 100000",
		"paddock/s1/pids.max": "7", "paddock/s1/memory.reclaim": "",
	})

	// Lowering memory below use asks for the excess to be reclaimed first.
	emptyFiles(t, root, limitFiles...)
	if err := os.WriteFile(filepath.Join(root, "paddock/s1/memory.current"), []byte("100000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := g.setLimits(Limits{MemoryBytes: 64 << 20}, false); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"paddock/s1/memory.reclaim": "32891136", // 100000000 - 64 MiB
		"paddock/s1/memory.max":     "67108864",
	})
}

func TestV2StatsFreezeKill(t *testing.T) {
	files := v2Files()
	for name, content := range map[string]string{
		"paddock/s1/cpu.stat":       "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 3\nnr_throttled 2\nthrottled_usec 77\n",
		"paddock/s1/memory.current": "4096\n",
		"paddock/s1/memory.peak":    "8192\n",
		"paddock/s1/memory.max":     "67108864\n",
		"paddock/s1/memory.events":  "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n",
		"paddock/s1/pids.current":   "3\n",
		"paddock/s1/pids.max":       "max\n",
		"paddock/s1/cgroup.events":  "populated 1\nfrozen 1\n",
	} {
		files[name] = content
	}
	root := fakeTree(t, files)
	h := newV2Hierarchy(root, true)
	if err := h.setup("/paddock"); err != nil {
		t.Fatal(err)
	}
	g := h.group("/paddock/s1")

	s, err := g.stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{
		CPUUsageNanos: 1500000, CPUThrottledNanos: 77000,
		MemoryCurrent: 4096, MemoryPeak: 8192, MemoryLimit: 64 << 20,
		PidsCurrent: 3, PidsLimit: 0, OOMKills: 1,
	}
	if s != want {
		t.Errorf("stats = %+v, want %+v", s, want)
	}

	if err := g.freeze(context.Background()); err != nil {
		t.Fatalf("freeze: %v", err)
	}
	wantFiles(t, root, map[string]string{"paddock/s1/cgroup.freeze": "1"})
	if err := g.thaw(); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{"paddock/s1/cgroup.freeze": "0"})

	if ok, err := g.killAll(); !ok || err != nil {
		t.Fatalf("killAll = %v, %v; want the kernel's group kill", ok, err)
	}
	wantFiles(t, root, map[string]string{"paddock/s1/cgroup.kill": "1"})

	if p, err := g.oomEventsPath(); err != nil || p != root+"/paddock/s1/memory.events" {
		t.Errorf("oomEventsPath = %q, %v", p, err)
	}
	if d, err := g.dir(); err != nil || d != root+"/paddock/s1" {
		t.Errorf("dir = %q, %v", d, err)
	}
}

// v1Files is a fake v1 layout with cpu and cpuacct co-mounted.
func v1Files() (map[string]string, map[string]string) {
	mounts := map[string]string{
		"cpu": "cpu,cpuacct", "cpuacct": "cpu,cpuacct", "memory": "memory", "pids": "pids", "freezer": "freezer",
	}
	files := map[string]string{}
	for _, f := range []string{"cpu,cpuacct/paddock/s1/cpu.cfs_period_us", "cpu,cpuacct/paddock/s1/cpu.cfs_quota_us",
		"memory/paddock/memory.memsw.limit_in_bytes",
		"memory/paddock/s1/memory.limit_in_bytes", "memory/paddock/s1/memory.memsw.limit_in_bytes",
		"pids/paddock/s1/pids.max", "freezer/paddock/s1/freezer.state"} {
		files[f] = ""
	}
	return mounts, files
}

func TestV1Limits(t *testing.T) {
	mounts, files := v1Files()
	root := fakeTree(t, files)
	for c, m := range mounts {
		mounts[c] = root + "/" + m
	}
	h, err := newV1Hierarchy(mounts)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.setup("/paddock"); err != nil {
		t.Fatal(err)
	}
	if !h.memsw {
		t.Fatal("setup did not find memory.memsw.limit_in_bytes")
	}
	g := h.group("/paddock/s1").(*v1Group)
	if len(g.dirs()) != 4 {
		t.Errorf("dirs = %v, want cpu and cpuacct once", g.dirs())
	}

	if err := g.setLimits(Limits{CPUs: 1.5, MemoryBytes: 64 << 20, Pids: 20}, true); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"cpu,cpuacct/paddock/s1/cpu.cfs_period_us":      "100000",
		"cpu,cpuacct/paddock/s1/cpu.cfs_quota_us":       "150000",
		"memory/paddock/s1/memory.limit_in_bytes":       "67108864",
		"memory/paddock/s1/memory.memsw.limit_in_bytes": "67108864",
		"pids/paddock/s1/pids.max":                      "20",
	})

	limitFiles := []string{
		"cpu,cpuacct/paddock/s1/cpu.cfs_period_us", "cpu,cpuacct/paddock/s1/cpu.cfs_quota_us",
		"memory/paddock/s1/memory.limit_in_bytes", "memory/paddock/s1/memory.memsw.limit_in_bytes",
		"pids/paddock/s1/pids.max",
	}
	emptyFiles(t, root, limitFiles...)
	if err := g.setLimits(Limits{}, true); err != nil {
		t.Fatal(err)
	}
	for _, f := range limitFiles {
		wantFiles(t, root, map[string]string{f: ""})
	}

	if err := g.setLimits(Limits{}, false); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, root, map[string]string{
		"cpu,cpuacct/paddock/s1/cpu.cfs_quota_us":       "-1",
		"memory/paddock/s1/memory.limit_in_bytes":       "-1",
		"memory/paddock/s1/memory.memsw.limit_in_bytes": "-1",
		"pids/paddock/s1/pids.max":                      "max",
	})

	if err := g.freeze(context.Background()); err == nil {
		// The fake's freezer.state reads back what was written, FROZEN.
		wantFiles(t, root, map[string]string{"freezer/paddock/s1/freezer.state": "FROZEN"})
	} else {
		t.Fatalf("freeze: %v", err)
	}
	if _, err := g.dir(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("dir on v1 = %v, want ErrUnavailable", err)
	}
}

func TestV1NeedsControllers(t *testing.T) {
	_, err := newV1Hierarchy(map[string]string{"cpu": "/x", "cpuacct": "/x", "memory": "/m"})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "pids, freezer") {
		t.Fatalf("newV1Hierarchy without pids and freezer = %v, want ErrUnavailable naming them", err)
	}
}

// A container's group inside its sandbox's on v2 has no controller files
// (the kernel's "no internal processes" rule): its OOM counter is its
// sandbox's memory.events, and the settings a restarted daemon gives it
// again (no limits, the normal weight) are no-ops, not "no such file".
func TestV2NestedUsesSandboxFiles(t *testing.T) {
	files := v2Files()
	files["paddock/s1/memory.events"] = "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n"
	root := fakeTree(t, files)
	m, err := newManager("paddock", newV2Hierarchy(root, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Create("s1/web", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := g.OpenOOMEvents()
	if err != nil {
		t.Fatalf("a bare group's OOM events: %v", err)
	}
	defer f.Close()
	if want := filepath.Join(root, "paddock/s1/memory.events"); f.Name() != want {
		t.Fatalf("opened %s, want %s", f.Name(), want)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ParseOOMKills(b); err != nil || n != 1 {
		t.Fatalf("oom kills = %d, %v", n, err)
	}
	if err := g.Update(Limits{}); err != nil {
		t.Fatalf("no limits on a bare group: %v", err)
	}
	if err := g.Update(Limits{Pids: 10}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("limits on a bare group: %v", err)
	}
	if err := g.SetBackground(true); err != nil {
		t.Fatalf("background on a bare group: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "paddock/s1/web/cpu.weight")); !os.IsNotExist(err) {
		t.Fatalf("wrote into the bare group: %v", err)
	}
	// The sandbox's own group is not bare: its file is its own.
	s1, err := m.Load("s1")
	if err != nil {
		t.Fatal(err)
	}
	f2, err := s1.OpenOOMEvents()
	if err != nil {
		t.Fatal(err)
	}
	f2.Close()
}
