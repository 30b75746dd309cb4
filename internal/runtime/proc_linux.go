package runtime

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ProcStartTime reads a process's start time (clock ticks since boot),
// which with the pid identifies it across pid reuse: a sandbox's
// recorded guest (or gVisor sandbox process) is found again by both.
func ProcStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}
