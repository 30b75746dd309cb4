package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// ParseOOMKills returns the "oom_kill N" count from the contents of the file
// Group.OpenOOMEvents opens: v2 memory.events or v1 memory.oom_control (the
// field is there since kernel 4.13).
func ParseOOMKills(b []byte) (uint64, error) {
	n, ok, err := keyedUint(b, "oom_kill")
	if err == nil && !ok {
		err = errors.New("no oom_kill field")
	}
	if err != nil {
		return 0, fmt.Errorf("parsing oom events: %w", err)
	}
	return n, nil
}

// The parse errors below carry no errdefs category: a control file the
// kernel wrote is never the caller's invalid argument.

// keyedUint finds "key N" in a flat keyed file (cpu.stat, memory.events,
// memory.oom_control, cgroup.events) and parses N. ok is false when the key
// is absent.
func keyedUint(b []byte, key string) (n uint64, ok bool, err error) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, found := bytes.Cut(line, []byte{' '})
		if !found || string(k) != key {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %q is not a count", key, v)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// parseInt parses a single-number control file (memory.current, pids.current,
// cpuacct.usage).
func parseInt(b []byte) (int64, error) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", bytes.TrimSpace(b))
	}
	return n, nil
}

// v1Unlimited is where v1 limits start to mean "none": the memory
// controller reports its unlimited value rounded down to a page
// (9223372036854771712), never -1.
const v1Unlimited = 1 << 62

// parseLimit parses a limit file in either mode: "max" (v2 and v1 pids.max)
// and v1's huge page-rounded values mean unlimited and become 0.
func parseLimit(b []byte) (int64, error) {
	b = bytes.TrimSpace(b)
	if string(b) == "max" {
		return 0, nil
	}
	n, err := parseInt(b)
	if err != nil {
		return 0, err
	}
	if n < 0 || n >= v1Unlimited {
		return 0, nil
	}
	return n, nil
}

// formatV1 is a v1 limit value: the number, or -1 for unlimited.
func formatV1(n int64) string {
	if n == 0 {
		return "-1"
	}
	return strconv.FormatInt(n, 10)
}

// formatV2 is a v2 limit value: the number, or "max" for unlimited.
func formatV2(n int64) string {
	if n == 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}

// formatV1PidsMax is a v1 pids.max value, which takes "max", not -1.
func formatV1PidsMax(n int64) string { return formatV2(n) }

// cpuPeriod is cpuPeriodUS as written to the control files.
var cpuPeriod = strconv.Itoa(cpuPeriodUS)

// formatCPUMax is the v2 cpu.max value for l: "QUOTA PERIOD" or "max PERIOD".
func formatCPUMax(l Limits) string {
	return formatV2(l.cpuQuotaUS()) + " " + cpuPeriod
}
