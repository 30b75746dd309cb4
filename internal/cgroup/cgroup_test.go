package cgroup

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"sbx-0123456789abcdef", true},
		{strings.Repeat("a", 64), true},
		{"", false},
		{strings.Repeat("a", 65), false},
		{"A", false},
		{"a_b", false},
		{"a.b", false},
		{"a/b", false},
		{"..", false},
		{"cgroup.procs", false},
		{"a b", false},
	}
	for _, tt := range tests {
		err := validateName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("validateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validateName(%q) = %v, want ErrInvalid", tt.name, err)
		}
	}
}

func TestValidateParent(t *testing.T) {
	tests := []struct {
		parent string
		ok     bool
	}{
		{"paddock", true},
		{"paddock-test-abc", true},
		{"machine.slice/paddock_1", true},
		{"", false},
		{"/paddock", false},
		{"paddock/", false},
		{"a//b", false},
		{".", false},
		{"..", false},
		{"a/../b", false},
		{"a/./b", false},
		{"a b", false},
		{"a\nb", false},
		{strings.Repeat("a", 256), false},
	}
	for _, tt := range tests {
		err := validateParent(tt.parent)
		if (err == nil) != tt.ok {
			t.Errorf("validateParent(%q) = %v, want ok=%v", tt.parent, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("validateParent(%q) = %v, want ErrInvalid", tt.parent, err)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name  string
		l     Limits
		field string // "" if valid
	}{
		{"zero is unlimited", Limits{}, ""},
		{"all set", Limits{CPUs: 1.5, MemoryBytes: 64 << 20, Pids: 20}, ""},
		{"smallest cpu", Limits{CPUs: 0.01}, ""},
		{"cpu below kernel minimum", Limits{CPUs: 0.005}, "cpus"},
		{"negative cpu", Limits{CPUs: -1}, "cpus"},
		{"NaN cpu", Limits{CPUs: math.NaN()}, "cpus"},
		{"infinite cpu", Limits{CPUs: math.Inf(1)}, "cpus"},
		{"negative memory", Limits{MemoryBytes: -1}, "memory_bytes"},
		{"memory in MB by mistake", Limits{MemoryBytes: 512}, "memory_bytes"},
		{"negative pids", Limits{Pids: -1}, "pids"},
		{"pids above PID_MAX_LIMIT", Limits{Pids: 1<<22 + 1}, "pids"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate() = %v, want ErrInvalid naming %s", err, tt.field)
			}
		})
	}
}

func TestCPUFormats(t *testing.T) {
	tests := []struct {
		cpus  float64
		quota int64
		v1    string
		v2    string
	}{
		{0, 0, "-1", "max 100000"},
		{0.5, 50000, "50000", "50000 100000"},
		{1, 100000, "100000", "100000 100000"},
		{2.25, 225000, "225000", "225000 100000"},
		{0.01, 1000, "1000", "1000 100000"},
		{0.333333, 33333, "33333", "33333 100000"},
	}
	for _, tt := range tests {
		l := Limits{CPUs: tt.cpus}
		if got := l.cpuQuotaUS(); got != tt.quota {
			t.Errorf("cpuQuotaUS(%v) = %d, want %d", tt.cpus, got, tt.quota)
		}
		if got := formatV1(l.cpuQuotaUS()); got != tt.v1 {
			t.Errorf("v1 cpu.cfs_quota_us for %v = %q, want %q", tt.cpus, got, tt.v1)
		}
		if got := formatCPUMax(l); got != tt.v2 {
			t.Errorf("v2 cpu.max for %v = %q, want %q", tt.cpus, got, tt.v2)
		}
	}
}

func TestLimitFormats(t *testing.T) {
	tests := []struct {
		n      int64
		v1     string
		v1Pids string
		v2     string
	}{
		{0, "-1", "max", "max"},
		{64 << 20, "67108864", "67108864", "67108864"},
		{20, "20", "20", "20"},
	}
	for _, tt := range tests {
		if got := formatV1(tt.n); got != tt.v1 {
			t.Errorf("formatV1(%d) = %q, want %q", tt.n, got, tt.v1)
		}
		if got := formatV1PidsMax(tt.n); got != tt.v1Pids {
			t.Errorf("formatV1PidsMax(%d) = %q, want %q", tt.n, got, tt.v1Pids)
		}
		if got := formatV2(tt.n); got != tt.v2 {
			t.Errorf("formatV2(%d) = %q, want %q", tt.n, got, tt.v2)
		}
	}
}

func TestParseLimit(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"max\n", 0, true},                 // v2 files, v1 pids.max
		{"9223372036854771712\n", 0, true}, // v1 memory, unlimited (page-rounded)
		{"9223372036854775807\n", 0, true},
		{"-1\n", 0, true},
		{"67108864\n", 64 << 20, true},
		{"20", 20, true},
		{"", 0, false},
		{"lots\n", 0, false},
	}
	for _, tt := range tests {
		got, err := parseLimit([]byte(tt.in))
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseLimit(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestParseOOMKills(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
		ok   bool
	}{
		{
			name: "v1 memory.oom_control",
			in:   "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
			want: 3,
			ok:   true,
		},
		{
			name: "v1 memory.oom_control before any kill",
			in:   "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
			want: 0,
			ok:   true,
		},
		{
			name: "v2 memory.events",
			in:   "low 0\nhigh 0\nmax 112\noom 2\noom_kill 2\noom_group_kill 0\n",
			want: 2,
			ok:   true,
		},
		{
			name: "no trailing newline",
			in:   "oom 1\noom_kill 18446744073709551615",
			want: math.MaxUint64,
			ok:   true,
		},
		{
			// oom_kill_disable must not be mistaken for oom_kill.
			name: "v1 before kernel 4.13",
			in:   "oom_kill_disable 1\nunder_oom 0\n",
			ok:   false,
		},
		{name: "empty", in: "", ok: false},
		{name: "garbage count", in: "oom_kill many\n", ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseOOMKills([]byte(tt.in))
			if !tt.ok {
				if err == nil {
					t.Fatalf("ParseOOMKills() = %d, nil; want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseOOMKills() = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestKeyedUint(t *testing.T) {
	v1CPUStat := "nr_periods 15\nnr_throttled 14\nthrottled_time 705381291\nnr_bursts 0\nburst_time 0\n"
	v2CPUStat := "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 3\nnr_throttled 2\nthrottled_usec 77\n"
	events := "populated 1\nfrozen 1\n"
	tests := []struct {
		in, key string
		want    uint64
		found   bool
	}{
		{v1CPUStat, "throttled_time", 705381291, true},
		{v2CPUStat, "usage_usec", 1500, true},
		{v2CPUStat, "throttled_usec", 77, true},
		{v2CPUStat, "throttled_time", 0, false},
		{events, "frozen", 1, true},
		{events, "populated", 1, true},
	}
	for _, tt := range tests {
		got, found, err := keyedUint([]byte(tt.in), tt.key)
		if err != nil || found != tt.found || got != tt.want {
			t.Errorf("keyedUint(%q) = %d, %v, %v; want %d, %v", tt.key, got, found, err, tt.want, tt.found)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		v1   map[string]string
		v2   string
	}{
		{
			name: "hybrid, each controller apart",
			in: `22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 30 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
39 30 0:36 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`,
			v1: map[string]string{
				"cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct",
				"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
				"freezer": "/sys/fs/cgroup/freezer",
			},
			v2: "/sys/fs/cgroup/unified",
		},
		{
			name: "legacy systemd layout, cpu and cpuacct co-mounted",
			in: `25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,cpu,cpuacct
29 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
30 25 0:27 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,pids
31 25 0:28 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,freezer
32 25 0:29 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,net_cls,net_prio
`,
			v1: map[string]string{
				"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
				"memory": "/sys/fs/cgroup/memory", "pids": "/sys/fs/cgroup/pids",
				"freezer": "/sys/fs/cgroup/freezer",
			},
		},
		{
			name: "unified, a subtree bind first",
			in: `35 24 0:30 /sandbox /mnt/cg rw - cgroup2 cgroup2 rw,nsdelegate
36 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`,
			v1: map[string]string{},
			v2: "/sys/fs/cgroup",
		},
		{
			name: "escaped mount point",
			in:   `40 30 0:37 / /run/my\040cgroup rw,relatime - cgroup2 cgroup2 rw` + "\n",
			v1:   map[string]string{},
			v2:   "/run/my cgroup",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseMountinfo([]byte(tt.in))
			if got.v2 != tt.v2 {
				t.Errorf("v2 = %q, want %q", got.v2, tt.v2)
			}
			if len(got.v1) != len(tt.v1) {
				t.Errorf("v1 = %v, want %v", got.v1, tt.v1)
			}
			for c, want := range tt.v1 {
				if got.v1[c] != want {
					t.Errorf("v1[%s] = %q, want %q", c, got.v1[c], want)
				}
			}
		})
	}
}

// TestValidateNested: a container's group is one level inside a
// sandbox's, each part a sandbox id; nothing else reaches a path.
func TestValidateNested(t *testing.T) {
	for name, ok := range map[string]bool{
		"abc": true, "abc/web": true, "a-b/c-d": true,
		"": false, "/abc": false, "abc/": false, "abc/web/x": false, "abc/..": false, "../abc": false, "abc//web": false, "ABC/web": false,
	} {
		if err := validateNested(name); (err == nil) != ok {
			t.Errorf("validateNested(%q) = %v, want ok %v", name, err, ok)
		}
	}
}
