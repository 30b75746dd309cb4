package guestfork

import (
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
)

// TestDecodeReply: a pid is a success; a failure's message is the error's
// text and its errno is what it wraps (so a lack of memory reads as
// ENOMEM to the pool's refill); a reply too short to hold both is an
// error of its own.
func TestDecodeReply(t *testing.T) {
	reply := func(pid, errno int32, msg string) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(pid))
		b = binary.NativeEndian.AppendUint32(b, uint32(errno))
		return append(b, msg...)
	}
	if pid, err := DecodeReply(reply(4242, 0, "")); pid != 4242 || err != nil {
		t.Fatalf("success: %d, %v", pid, err)
	}
	pid, err := DecodeReply(reply(-1, int32(syscall.ENOMEM), "starting guest: clone3: Cannot allocate memory"))
	if pid != 0 || err == nil || err.Error() != "starting guest: clone3: Cannot allocate memory" || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("failure: %d, %v (wraps ENOMEM: %v)", pid, err, errors.Is(err, syscall.ENOMEM))
	}
	if _, err := DecodeReply(reply(-1, 0, "no errno")); err == nil || err.Error() != "no errno" {
		t.Fatalf("failure without errno: %v", err)
	}
	if _, err := DecodeReply([]byte{1, 2, 3}); err == nil {
		t.Fatal("a 3-byte reply decoded")
	}
}

// TestEncode: the request is three 32-bit words; each flag sets its own
// bit of the third.
func TestEncode(t *testing.T) {
	b := Request{UIDBase: 100000, IDs: 65536, UseCgroup: true, NetNS: true}.Encode()
	if len(b) != 12 || binary.NativeEndian.Uint32(b) != 100000 || binary.NativeEndian.Uint32(b[4:]) != 65536 {
		t.Fatalf("encoded % x", b)
	}
	if got := binary.NativeEndian.Uint32(b[8:]); got != reqCgroup|reqNetNS {
		t.Fatalf("flags %#x, want %#x", got, reqCgroup|reqNetNS)
	}
	if got := binary.NativeEndian.Uint32(Request{Urgent: true}.Encode()[8:]); got != reqUrgent {
		t.Fatalf("urgent: flags %#x, want %#x", got, reqUrgent)
	}
}
