package native

import (
	"io"
	"net"
	"testing"
)

// TestActivatingConnHalfCloses: a connection dialled while its guest
// activated is kept and may carry a port pipe later; its half-close must
// reach the peer (EOF there) while the peer can still answer.
func TestActivatingConnHalfCloses(t *testing.T) {
	conns := unixPair(t)
	var c net.Conn = &activatingConn{Conn: conns[0], sb: &Sandbox{}}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("activatingConn cannot half-close")
	}
	if _, err := io.WriteString(c, "last words"); err != nil {
		t.Fatal(err)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conns[1])
	if err != nil || string(got) != "last words" {
		t.Fatalf("peer read %q, %v; want the words and EOF", got, err)
	}
	if _, err := io.WriteString(conns[1], "answer"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(conns[0], buf); err != nil || string(buf) != "answer" {
		t.Fatalf("after the half-close read %q, %v", buf, err)
	}
}
