package exitprog

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// TestMatchesDebugELF: the hand-packed headers are the ones debug/elf's
// types make of the same fields, and debug/elf reads the program back
// as one loadable segment holding the code at the entry point.
func TestMatchesDebugELF(t *testing.T) {
	prog := ELF()
	if prog == nil {
		t.Skip("no program for this architecture")
	}
	f, err := elf.NewFile(bytes.NewReader(prog))
	if err != nil {
		t.Fatalf("debug/elf cannot read it: %v", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Type != elf.ET_EXEC {
		t.Fatalf("class %v, data %v, type %v", f.Class, f.Data, f.Type)
	}
	if len(f.Progs) != 1 || f.Progs[0].Type != elf.PT_LOAD || f.Progs[0].Flags != elf.PF_R|elf.PF_X {
		t.Fatalf("segments: %+v", f.Progs)
	}
	hdr := binary.Size(elf.Header64{})
	ph := binary.Size(elf.Prog64{})
	code := prog[hdr+ph:]
	size := uint64(len(prog))
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(f.Machine), Version: uint32(elf.EV_CURRENT),
		Entry: 0x400000 + uint64(hdr+ph), Phoff: uint64(hdr), Ehsize: uint16(hdr), Phentsize: uint16(ph), Phnum: 1,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var want bytes.Buffer
	binary.Write(&want, binary.LittleEndian, h)
	binary.Write(&want, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
		Vaddr: 0x400000, Paddr: 0x400000, Filesz: size, Memsz: size, Align: 0x1000})
	want.Write(code)
	if !bytes.Equal(prog, want.Bytes()) {
		t.Fatalf("headers differ from debug/elf's:\ngot  %x\nwant %x", prog, want.Bytes())
	}
}
