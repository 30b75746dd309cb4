package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// hostCaps are host-wide caps on kernel objects that every process shares
// and that a sandbox could use up within its own limits, leaving the
// other sandboxes' processes (their guests first) with ENFILE or EAGAIN:
// open files (a few hundred processes at the default descriptor limit
// reach fs.file-max) and AIO contexts (fs.aio-max-nr, 65536 events by
// default, one io_setup away). Both are charged to the memory cgroup of
// the process that makes them (struct file is accounted kernel memory, an
// AIO ring is page cache of the context's file), so a sandbox's memory
// limit already bounds them; the global caps only let one sandbox deny
// them to the rest.
var hostCaps = []string{"fs/file-max", "fs/aio-max-nr"}

// noCap is what systemd (since v240) sets fs.file-max to: no cap.
const noCap = "9223372036854775807"

// liftHostCaps lifts hostCaps, as systemd does for fs.file-max on most
// hosts. It never lowers one.
func liftHostCaps(log *slog.Logger) error {
	for _, name := range hostCaps {
		path := "/proc/sys/" + name
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		was := strings.TrimSpace(string(b))
		if n, err := strconv.ParseUint(was, 10, 64); err == nil && n >= 1<<62 {
			continue
		}
		if err := os.WriteFile(path, []byte(noCap), 0); err != nil {
			return fmt.Errorf("lifting %s (%s): %w", name, was, err)
		}
		log.Info("lifted a host-wide cap: sandboxes' use is bounded by their memory limits", "sysctl", strings.ReplaceAll(name, "/", "."), "to", noCap, "was", was)
	}
	return nil
}
