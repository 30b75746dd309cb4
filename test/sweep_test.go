package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A test daemon or upstream records its owner (the test process) in a
// file, so that what a test binary leaves behind when it dies without its
// cleanups (a -timeout panic, a kill) is found and removed by the next
// test binary, and never mistaken for a live one's.
type owner struct {
	PID   int    `json:"pid"`
	Start string `json:"start"` // the owner's start time in clock ticks (/proc/PID/stat)
	// Daemon: the serve arguments, for `serve --uninstall`.
	Args []string `json:"args,omitempty"`
	// Upstream: the network namespace and host link.
	NetNS string `json:"netns,omitempty"`
	Link  string `json:"link,omitempty"`
}

// ownerFile is the file an upstream records itself in (a daemon's is in
// its root).
func ownerFile(ns string) string {
	return filepath.Join(os.TempDir(), "paddock-e2e-up-"+ns+".json")
}

// procStat gives the fields of /proc/PID/stat after the command's name
// (the first is the state, field 3), nil when the process is gone.
func procStat(pid string) []string {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// startTime is pid's start time in clock ticks, "" when it is gone.
func startTime(pid int) string {
	if f := procStat(strconv.Itoa(pid)); len(f) > 19 {
		return f[19] // field 22 of stat
	}
	return ""
}

// recordOwner writes this process as the owner of what o describes.
func recordOwner(path string, o owner) error {
	o.PID = os.Getpid()
	o.Start = startTime(o.PID)
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// alive reports whether the process that recorded o still runs.
func (o owner) alive() bool { return o.Start != "" && startTime(o.PID) == o.Start }

// sweepDead removes what test processes that are gone left behind:
// daemons (through the product's own `serve --uninstall`, then whatever
// is still mounted under their roots) and upstream namespaces.
func sweepDead() {
	tmp := os.TempDir()
	roots, _ := filepath.Glob(filepath.Join(tmp, "paddock-e2e-*", "owner.json"))
	for _, f := range roots {
		var o owner
		b, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(b, &o) != nil || o.alive() || len(o.Args) == 0 {
			continue
		}
		root := filepath.Dir(f)
		fmt.Printf("sweeping test daemon %s left by pid %d\n", root, o.PID)
		args := append(append([]string{}, o.Args...), "--uninstall")
		if out, err := exec.Command(paddockBin, args...).CombinedOutput(); err != nil {
			fmt.Printf("  uninstall: %v\n%s", err, out)
		}
		unmountUnder(root)
		os.RemoveAll(root)
	}
	ups, _ := filepath.Glob(filepath.Join(tmp, "paddock-e2e-up-*.json"))
	for _, f := range ups {
		var o owner
		b, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(b, &o) != nil || o.alive() {
			continue
		}
		fmt.Printf("sweeping upstream %s left by pid %d\n", o.NetNS, o.PID)
		if o.NetNS != "" {
			exec.Command("ip", "netns", "del", o.NetNS).Run()
		}
		if o.Link != "" {
			exec.Command("ip", "link", "del", o.Link).Run()
		}
		os.Remove(f)
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mps = append(mps, f[4])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		syscall.Unmount(mps[i], syscall.MNT_DETACH)
	}
}
