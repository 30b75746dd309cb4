package guestapi

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// maxHandoverJSON bounds the handover's JSON (the processes, connections
// and lanes without their output; a lane's unsent reports are within
// its 1 MiB backlog cap each).
const maxHandoverJSON = 1 << 30

// ReadHandover reads the fast guest's handover from f, a memfd: the
// JSON's length (8 bytes, little endian), the JSON (Handover), then every
// process's retained output raw, in the order of Procs and of their
// Output. The output is not base64 in the JSON, and each chunk's pages
// of the memfd are let go once read: a sandbox retaining 64 MiB of output
// hands over in about that much more memory, not four times it.
func ReadHandover(f *os.File) (*Handover, error) {
	var n [8]byte
	if _, err := f.ReadAt(n[:], 0); err != nil {
		return nil, fmt.Errorf("reading the handover's length: %w", err)
	}
	jl := binary.LittleEndian.Uint64(n[:])
	if jl > maxHandoverJSON {
		return nil, fmt.Errorf("a handover of %d bytes", jl)
	}
	b := make([]byte, jl)
	if _, err := f.ReadAt(b, 8); err != nil {
		return nil, fmt.Errorf("reading the handover: %w", err)
	}
	var h Handover
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("decoding the handover: %w", err)
	}
	off := 8 + int64(jl)
	for i := range h.Procs {
		for j := range h.Procs[i].Output {
			c := &h.Procs[i].Output[j]
			if c.Len < 0 || c.Len > 1<<30 {
				return nil, fmt.Errorf("an output chunk of %d bytes", c.Len)
			}
			c.Data = make([]byte, c.Len)
			if _, err := f.ReadAt(c.Data, off); err != nil {
				return nil, fmt.Errorf("reading the handover's output at %d: %w", off, err)
			}
			// Best effort: the memfd's pages go as their bytes move.
			_ = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, c.Len)
			off += c.Len
		}
	}
	return &h, nil
}
