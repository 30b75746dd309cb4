package guest

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

var capNames = map[string]int{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "CAP_FOWNER": unix.CAP_FOWNER,
	"CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL,
	"CAP_SETGID": unix.CAP_SETGID, "CAP_SETUID": unix.CAP_SETUID,
	"CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_NET_RAW": unix.CAP_NET_RAW,
	"CAP_IPC_LOCK": unix.CAP_IPC_LOCK, "CAP_IPC_OWNER": unix.CAP_IPC_OWNER,
	"CAP_SYS_MODULE": unix.CAP_SYS_MODULE, "CAP_SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE,
	"CAP_SYS_PACCT": unix.CAP_SYS_PACCT, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
	"CAP_SYS_BOOT": unix.CAP_SYS_BOOT, "CAP_SYS_NICE": unix.CAP_SYS_NICE,
	"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SYS_TIME": unix.CAP_SYS_TIME,
	"CAP_SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "CAP_MKNOD": unix.CAP_MKNOD,
	"CAP_LEASE": unix.CAP_LEASE, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"CAP_AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "CAP_SETFCAP": unix.CAP_SETFCAP,
	"CAP_MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE, "CAP_MAC_ADMIN": unix.CAP_MAC_ADMIN,
	"CAP_SYSLOG": unix.CAP_SYSLOG, "CAP_WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"CAP_BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "CAP_AUDIT_READ": unix.CAP_AUDIT_READ,
	"CAP_PERFMON": unix.CAP_PERFMON, "CAP_BPF": unix.CAP_BPF,
	"CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// lastCap is the highest capability the running kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// limitCaps bounds the calling thread to keep: the bounding set loses every
// other capability, the effective, permitted and inheritable sets become
// keep, and the ambient set is cleared. Capabilities are per thread: the
// caller must be locked to its OS thread and exec from it.
func limitCaps(keep []string) error {
	var mask [2]uint32
	for _, name := range keep {
		c, ok := capNames[strings.ToUpper(name)]
		if !ok {
			return fmt.Errorf("unknown capability %q", name)
		}
		mask[c/32] |= 1 << (uint(c) % 32)
	}
	last := lastCap()
	for c := 0; c <= last; c++ {
		if mask[c/32]&(1<<(uint(c)%32)) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: mask[0], Permitted: mask[0], Inheritable: mask[0]},
		{Effective: mask[1], Permitted: mask[1], Inheritable: mask[1]},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("setting capabilities: %w", err)
	}
	return nil
}
