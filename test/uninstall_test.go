package test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/paddock-dev/paddock/api"
)

// TestUninstallRemovesEveryTrace: a stopped daemon leaves its storage
// mount, network rules and running sandboxes (so that a restart finds
// them); `paddock serve --uninstall` with the daemon's flags takes all of
// it away: the daemon, its sandboxes and warm guests, their cgroups, every
// mount and loop device, the nftables table and links, and its state and
// run directories.
func TestUninstallRemovesEveryTrace(t *testing.T) {
	d := StartDaemon(t)
	id := d.Create(api.CreateRequest{})
	if out := d.run(id, "", "sh", "-c", "echo kept > /workspace/f"); out.ExitCode != 0 {
		t.Fatalf("writing in the sandbox: %s", out)
	}
	d.MustCLI("volume", "create", "data")
	guest := d.hostPID(id)

	// A stop keeps them all, for the next start.
	d.Stop()
	before := strings.Join(d.hostTraces(), "\n")
	for _, want := range []string{"mount " + d.StateDir + "/storage\n", "nftables table " + d.NetName, "link " + d.NetName + "-", "directory " + d.StateDir} {
		if !strings.Contains(before+"\n", want) {
			t.Errorf("after a stop, no %q among the daemon's traces:\n%s", want, before)
		}
	}
	if !alive(guest) {
		t.Fatal("a stop ended the sandbox")
	}

	out, err := exec.Command(paddockBin, append(d.args, "--uninstall")...).CombinedOutput()
	if err != nil {
		t.Fatalf("serve --uninstall: %v\n%s", err, out)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool { return !alive(d.cmd.Process.Pid) && !alive(guest) }) {
		t.Fatalf("the daemon (%v) or its sandbox's guest (%v) still runs", alive(d.cmd.Process.Pid), alive(guest))
	}
	if left := d.hostTraces(); len(left) > 0 {
		t.Errorf("left after --uninstall: %s\n%s", strings.Join(left, "\n"), out)
	}
}

// hostTraces lists what of the daemon is on the host, whatever owns it:
// mounts under its root, cgroups, its directories, processes of its uid
// ranges, its nftables table and links.
func (d *Daemon) hostTraces() []string {
	var left []string
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], d.Root+"/") {
			left = append(left, "mount "+f[4])
		}
	}
	for _, dir := range append(cgroupDirs(d.Cgroup), d.StateDir, d.RunDir) {
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "directory "+dir)
		}
	}
	for i := range uint32(16) {
		for _, pid := range pidsInUIDRange(d.UIDStart + i*65536) {
			left = append(left, describe(pid))
		}
	}
	if c, err := nftables.New(); err == nil {
		tables, _ := c.ListTablesOfFamily(nftables.TableFamilyINet)
		for _, tb := range tables {
			if tb.Name == d.NetName {
				left = append(left, "nftables table "+d.NetName)
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, d.NetName+"-") {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	return left
}
