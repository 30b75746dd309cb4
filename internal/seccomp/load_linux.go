package seccomp

import "github.com/paddock-dev/paddock/internal/seccomp/load"

// sockFilterSize is sizeof(struct sock_filter): u16 code, u8 jt, u8 jf, u32 k.
const sockFilterSize = load.InsnSize

// Load installs prog on the calling thread (load.Thread).
func Load(prog []byte) error { return load.Thread(prog) }

// LoadAllThreads installs prog on every thread of the process
// (load.AllThreads).
func LoadAllThreads(prog []byte) error { return load.AllThreads(prog) }
