package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// fileMaxPath is the host's cap on open files, all processes together.
const fileMaxPath = "/proc/sys/fs/file-max"

// noFileMax is what systemd (since v240) sets fs.file-max to: no cap.
const noFileMax = "9223372036854775807"

// liftFileMax removes the host-wide cap on open files (fs.file-max), as
// systemd does on most hosts. Without it, one sandbox could open the
// host's whole file table within its own limits (a few hundred processes
// at the default descriptor limit), after which every unprivileged
// process on the host, other sandboxes' guests first, gets ENFILE. Open
// files are charged to the memory cgroup of the process that opens them
// (struct file is accounted kernel memory, on cgroup v1 and v2), so with
// the global cap gone a sandbox's files are bounded by its memory limit,
// and filling them costs only that sandbox. It never lowers the cap.
func liftFileMax(log *slog.Logger) error {
	b, err := os.ReadFile(fileMaxPath)
	if err != nil {
		return fmt.Errorf("reading %s: %w", fileMaxPath, err)
	}
	was := strings.TrimSpace(string(b))
	if n, err := strconv.ParseUint(was, 10, 64); err == nil && n >= 1<<62 {
		return nil
	}
	if err := os.WriteFile(fileMaxPath, []byte(noFileMax), 0); err != nil {
		return fmt.Errorf("lifting fs.file-max (%s): %w", was, err)
	}
	log.Info("lifted the host's cap on open files: sandboxes' files are bounded by their memory limits", "fs.file-max", noFileMax, "was", was)
	return nil
}
