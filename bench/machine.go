package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// machine describes where the numbers were taken.
func (r *rig) machine(ctx context.Context) [][2]string {
	kv := [][2]string{
		{"nproc", fmt.Sprint(goruntime.NumCPU())},
		{"CPU", firstMatch("/proc/cpuinfo", "model name")},
		{"kernel", kernelRelease()},
		{"OS", osRelease()},
		{"memory", memTotal()},
		{"cgroups", cgroupMode()},
		{"load average at start", loadAvg()},
		{"paddock version", r.paddockVersion(ctx)},
		{"paddock binary", r.opts.bin},
		{"bubblewrap", r.bwrapVersion(ctx)},
		{"runc", r.runcVersion(ctx)},
		{"harness", "bench/ built with " + goruntime.Version()},
	}
	return append(kv, hostCosts(ctx)...)
}

func (r *rig) paddockVersion(ctx context.Context) string {
	out, err := output(ctx, r.opts.bin, "--host", r.daemon.host, "version")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.Join(lines, "; ")
}

func (r *rig) bwrapVersion(ctx context.Context) string {
	if r.bwrap == "" {
		return "not installed"
	}
	out, err := output(ctx, r.bwrap, "--version")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(out)
}

func (r *rig) runcVersion(ctx context.Context) string {
	if r.runc == nil {
		return "not installed"
	}
	return r.runc.version(ctx)
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
}

func osRelease() string {
	return strings.Trim(firstMatch("/etc/os-release", "PRETTY_NAME"), `"`)
}

func memTotal() string {
	b, err := kbField("/proc/meminfo", "MemTotal")
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

func cgroupMode() string {
	if cgroupV2Only() {
		return "v2 (unified)"
	}
	if isDir("/sys/fs/cgroup/unified") {
		return "v1 + v2 (hybrid)"
	}
	return "v1"
}

// hostBusy is the share of all CPUs' time spent on anything but idle over
// interval (from /proc/stat), -1 if unknown: other work on the machine
// before or after the run.
func hostBusy(interval time.Duration) float64 {
	busy0, total0, err := cpuTicks()
	if err != nil {
		return -1
	}
	time.Sleep(interval)
	busy1, total1, err := cpuTicks()
	if err != nil || total1 <= total0 {
		return -1
	}
	return float64(busy1-busy0) / float64(total1-total0)
}

// cpuTicks returns the busy and total ticks of all CPUs.
func cpuTicks() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("parsing /proc/stat")
	}
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing /proc/stat: %w", err)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

func percent(f float64) string {
	if f < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.0f%%", f*100)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// firstMatch returns what follows key on the first line of path that
// starts with it, with the separator (":" or "=") trimmed.
func firstMatch(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, key); ok {
			return strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(rest), ":="))
		}
	}
	return "unknown"
}
