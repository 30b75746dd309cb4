// Package exitprog makes the smallest Linux program there is: one that
// calls exit(0), with no loader and no C library. Spawning it costs the
// kernel a fork, an exec and an exit and nothing else, which is what a
// guest's warm-up needs (it warms the guest's exec path, not a command)
// and what the benchmarks compare a round trip against.
package exitprog

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"runtime"
)

// ELF returns the program for this machine's architecture (x86-64 or
// arm64), or nil on another.
func ELF() []byte {
	var code []byte
	var machine elf.Machine
	switch runtime.GOARCH {
	case "amd64":
		machine = elf.EM_X86_64
		code = []byte{0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05} // mov $60,%eax; xor %edi,%edi; syscall
	case "arm64":
		machine = elf.EM_AARCH64
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
	hdr := binary.Size(elf.Header64{})
	ph := binary.Size(elf.Prog64{})
	size := uint64(hdr + ph + len(code))
	var b bytes.Buffer
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Entry: base + uint64(hdr+ph), Phoff: uint64(hdr), Ehsize: uint16(hdr), Phentsize: uint16(ph), Phnum: 1,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	binary.Write(&b, binary.LittleEndian, h)
	binary.Write(&b, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
		Vaddr: base, Paddr: base, Filesz: size, Memsz: size, Align: 0x1000})
	b.Write(code)
	return b.Bytes()
}
