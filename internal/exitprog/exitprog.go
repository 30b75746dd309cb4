// Package exitprog makes the smallest Linux program there is: one that
// calls exit(0), with no loader and no C library. Spawning it costs the
// kernel a fork, an exec and an exit and nothing else, which is what a
// guest's warm-up needs (it warms the guest's exec path, not a command)
// and what the benchmarks compare a round trip against.
//
// The ELF headers are packed by hand rather than with debug/elf: the
// guest links this package, and debug/elf would bring it debug/dwarf,
// compress/zlib and internal/zstd, whose package inits every guest ran at
// its start for a 129-byte file (TestMatchesDebugELF checks the result
// against debug/elf).
package exitprog

import (
	"encoding/binary"
	"runtime"
)

// The ELF constants used here (from <elf.h>).
const (
	etExec      = 2    // e_type: an executable
	emX86_64    = 62   // e_machine
	emAArch64   = 183  // e_machine
	evCurrent   = 1    // e_version, e_ident[EI_VERSION]
	elfClass64  = 2    // e_ident[EI_CLASS]
	elfData2LSB = 1    // e_ident[EI_DATA]: little-endian
	ptLoad      = 1    // p_type
	pfX, pfR    = 1, 4 // p_flags
	ehdrSize    = 64   // sizeof(Elf64_Ehdr)
	phdrSize    = 56   // sizeof(Elf64_Phdr)
)

// ELF returns the program for this machine's architecture (x86-64 or
// arm64), or nil on another.
func ELF() []byte {
	var code []byte
	var machine uint16
	switch runtime.GOARCH {
	case "amd64":
		machine = emX86_64
		code = []byte{0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05} // mov $60,%eax; xor %edi,%edi; syscall
	case "arm64":
		machine = emAArch64
		code = []byte{
			0x00, 0x00, 0x80, 0xd2, // mov x0, #0
			0xa8, 0x0b, 0x80, 0xd2, // mov x8, #93 (exit)
			0x01, 0x00, 0x00, 0xd4, // svc #0
		}
	default:
		return nil
	}
	// One PT_LOAD segment maps the whole file, headers included, at base
	// (a multiple of any page size); the code follows the headers.
	const base = 0x400000
	size := uint64(ehdrSize + phdrSize + len(code))
	b := make([]byte, ehdrSize+phdrSize, size)
	le := binary.LittleEndian
	// Elf64_Ehdr.
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = elfClass64, elfData2LSB, evCurrent
	le.PutUint16(b[16:], etExec)                 // e_type
	le.PutUint16(b[18:], machine)                // e_machine
	le.PutUint32(b[20:], evCurrent)              // e_version
	le.PutUint64(b[24:], base+ehdrSize+phdrSize) // e_entry
	le.PutUint64(b[32:], ehdrSize)               // e_phoff
	le.PutUint16(b[52:], ehdrSize)               // e_ehsize
	le.PutUint16(b[54:], phdrSize)               // e_phentsize
	le.PutUint16(b[56:], 1)                      // e_phnum
	// Elf64_Phdr.
	p := b[ehdrSize:]
	le.PutUint32(p[0:], ptLoad)  // p_type
	le.PutUint32(p[4:], pfR|pfX) // p_flags
	le.PutUint64(p[16:], base)   // p_vaddr
	le.PutUint64(p[24:], base)   // p_paddr
	le.PutUint64(p[32:], size)   // p_filesz
	le.PutUint64(p[40:], size)   // p_memsz
	le.PutUint64(p[48:], 0x1000) // p_align
	return append(b, code...)
}
