package netpipe

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestSplice checks that Splice ends when both sides are done and that an
// abrupt close of one side ends it too.
func TestSplice(t *testing.T) {
	pair := func() (net.Conn, net.Conn) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		a, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		b, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
	// client <-> (x | splice | y) <-> server
	client, x := pair()
	y, srv := pair()
	done := make(chan [2]int64, 1)
	go func() {
		a, b := Splice(x, y)
		done <- [2]int64{a, b}
	}()
	client.Write([]byte("hello"))
	client.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(srv)
	if string(got) != "hello" {
		t.Fatalf("server read %q", got)
	}
	srv.Write([]byte("world!"))
	srv.Close()
	got, _ = io.ReadAll(client)
	if string(got) != "world!" {
		t.Fatalf("client read %q", got)
	}
	select {
	case n := <-done:
		if n != [2]int64{5, 6} {
			t.Errorf("Splice copied %v, want [5 6]", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Splice did not return after both sides closed")
	}
	client.Close()

	// An abrupt close of one end unblocks the other direction.
	client, x = pair()
	y, srv = pair()
	defer srv.Close()
	go func() {
		a, b := Splice(x, y)
		done <- [2]int64{a, b}
	}()
	client.(*net.TCPConn).SetLinger(0)
	client.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Splice did not return after a reset")
	}
}
