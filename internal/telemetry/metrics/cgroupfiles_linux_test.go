package metrics

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestCgroupFilesV2 reads a v2 group's files from a directory of
// fixtures: the host here may be v1, and the parsing is the same.
func TestCgroupFilesV2(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cpu.stat":        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 10\nnr_throttled 3\nthrottled_usec 120000\n",
		"memory.current":  "314572800\n",
		"memory.peak":     "419430400\n",
		"memory.max":      "536870912\n",
		"memory.events":   "low 0\nhigh 0\nmax 17\noom 2\noom_kill 2\noom_group_kill 0\n",
		"memory.pressure": "some avg10=1.50 avg60=0.30 avg300=0.05 total=765432\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n",
		"memory.stat":     "anon 200000000\nfile 100000000\nactive_file 40000000\ninactive_file 60000000\n",
		"pids.current":    "7\n",
		"pids.max":        "max\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := OpenCgroupFiles(CgroupDirs{Mode: cgroup.V2, CPU: dir, CPUAcct: dir, Memory: dir, Pid: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r Reading
	if err := f.ReadCgroup(&r); err != nil {
		t.Fatal(err)
	}
	want := Reading{
		CPUNanos: 2_500_000_000, CPUThrottledNanos: 120_000_000,
		MemoryBytes: 314572800, MemoryPeakBytes: 419430400, MemoryLimitBytes: 536870912,
		Pids: 7, PidsLimit: 0, OOMKills: 2,
		MemoryFailcnt: 17, MemoryStallNanos: 765_432_000, MemoryReclaimableBytes: 60000000,
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("read\n %+v\nwant\n %+v", r, want)
	}

	// Below half the limit, memory.stat is not read.
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("1000\n"), 0o600)
	r = Reading{}
	f.ReadCgroup(&r)
	if r.MemoryBytes != 1000 || r.MemoryReclaimableBytes != 0 {
		t.Errorf("at low usage: memory %d, reclaimable %d", r.MemoryBytes, r.MemoryReclaimableBytes)
	}

	// Optional files may be missing (memory.peak before 5.19, no memory
	// controller); the group's own cpu.stat may not.
	os.Remove(filepath.Join(dir, "memory.peak"))
	f2, err := OpenCgroupFiles(CgroupDirs{Mode: cgroup.V2, CPU: dir, CPUAcct: dir, Memory: dir, Pid: dir})
	if err != nil {
		t.Fatalf("without memory.peak: %v", err)
	}
	f2.Close()
	_, err = OpenCgroupFiles(CgroupDirs{Mode: cgroup.V2, CPU: dir + "/gone", CPUAcct: dir + "/gone", Memory: dir + "/gone", Pid: dir + "/gone"})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("opening a missing group = %v, want ErrNotFound", err)
	}
}

func TestParseHelpers(t *testing.T) {
	for _, tt := range []struct {
		in    string
		num   int64
		limit int64
	}{
		{"123\n", 123, 123},
		{"max\n", 0, 0},
		{"9223372036854771712\n", 9223372036854771712, 0}, // v1 unlimited
		{"-1\n", 0, 0},
		{"", 0, 0},
		{"99999999999999999999999\n", 1<<63 - 1, 0},
	} {
		if got := number([]byte(tt.in)); got != tt.num {
			t.Errorf("number(%q) = %d, want %d", tt.in, got, tt.num)
		}
		if got := limit([]byte(tt.in)); got != tt.limit {
			t.Errorf("limit(%q) = %d, want %d", tt.in, got, tt.limit)
		}
	}
	stat := []byte("throttled_time 5\nnr_throttled 2\nthrottled 9\n")
	if keyed(stat, "throttled") != 9 || keyed(stat, "throttled_time") != 5 || keyed(stat, "nope") != 0 {
		t.Error("keyed matched a prefix or missed a key")
	}
}

// TestCgroupFilesQuiet: a group whose CPU time stands still is read in
// full for quietFull reads, then keeps its charged fields but on every
// quietEvery-th read; its limits are read every time, and its CPU time
// moving reads it in full at once.
func TestCgroupFilesQuiet(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("cpu.stat", "usage_usec 100\nthrottled_usec 0\n")
	write("memory.current", "5000\n")
	write("memory.max", "max\n")
	write("pids.current", "2\n")
	write("pids.max", "max\n")
	f, err := OpenCgroupFiles(CgroupDirs{Mode: cgroup.V2, CPU: dir, CPUAcct: dir, Memory: dir, Pid: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	read := func() Reading {
		t.Helper()
		var r Reading
		if err := f.ReadCgroup(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	read() // the first read is full
	write("memory.current", "7000\n")
	for i := 1; i <= quietFull; i++ {
		if r := read(); r.MemoryBytes != 7000 {
			t.Fatalf("quiet read %d (of the first %d, full): memory %d, want 7000", i, quietFull, r.MemoryBytes)
		}
	}
	write("memory.current", "9000\n")
	write("pids.current", "1\n")
	write("memory.max", "1048576\n")
	for i := quietFull + 1; i < quietEvery; i++ {
		r := read()
		if r.MemoryBytes != 7000 || r.Pids != 2 || r.CPUNanos != 100_000 {
			t.Fatalf("quiet read %d: memory %d, pids %d, cpu %d; want those of the last full read (7000, 2, 100000)", i, r.MemoryBytes, r.Pids, r.CPUNanos)
		}
		if r.MemoryLimitBytes != 1048576 {
			t.Fatalf("quiet read %d: limit %d, want the new limit read at once", i, r.MemoryLimitBytes)
		}
	}
	if r := read(); r.MemoryBytes != 9000 || r.Pids != 1 {
		t.Fatalf("quiet read %d: memory %d, pids %d; want a full read (9000, 1)", quietEvery, r.MemoryBytes, r.Pids)
	}
	write("memory.current", "11000\n")
	if r := read(); r.MemoryBytes != 9000 {
		t.Fatalf("the read after the %dth: memory %d, want the kept 9000", quietEvery, r.MemoryBytes)
	}
	write("cpu.stat", "usage_usec 200\nthrottled_usec 0\n")
	if r := read(); r.MemoryBytes != 11000 || r.CPUNanos != 200_000 {
		t.Fatalf("after the CPU time moved: memory %d, cpu %d; want a full read (11000, 200000)", r.MemoryBytes, r.CPUNanos)
	}
}
