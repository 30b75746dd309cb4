package guest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/sysmon"
	"github.com/paddock-dev/paddock/wire"
)

// Helper serves, in a child of the fast guest (internal/guestc), the ops
// the fast guest passes on instead of handing the sandbox over: file ops
// and port connections (helperOps). The fast guest forks it from PID 1's
// own thread, so it has PID 1's credentials, namespaces, root and seccomp
// filter; its socket to PID 1 is fd sockFD. Each op comes as one byte
// with two descriptors: the op's connection, whose request frame the
// fast guest has read, and a memfd holding that frame's payload.
//
// Once it has had no op for guestapi.HelperIdle it shuts its side of the
// socket; the fast guest then closes its own and passes the next op to a
// new helper. It serves what it was given meanwhile, and returns when
// its last op is done.
func Helper(sockFD int, workdir string) error {
	_ = sysmon.Settle()
	// The sandbox's processes (root too, without CAP_SYS_PTRACE) must not
	// read our memory or take our descriptors.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("setting non-dumpable: %w", err)
	}
	f := os.NewFile(uintptr(sockFD), "fast guest")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("the fast guest's socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return errors.New("the fast guest's socket is not a unix socket")
	}
	s := newServer(guestapi.ServeConfig{Workdir: workdir}, nil, nil, serveLog())
	s.serveHelper(uc, guestapi.HelperIdle)
	return nil
}

// serveHelper takes ops from uc until the fast guest closes it, shutting
// uc's write side once no op was in flight for idle, and returns when
// the ops it took are done.
func (s *server) serveHelper(uc *net.UnixConn, idle time.Duration) {
	defer uc.Close()
	var (
		mu       sync.Mutex
		inFlight int
		lastDone = time.Now()
		wg       sync.WaitGroup
		leaving  bool
	)
	defer wg.Wait()
	one := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		if !leaving {
			// Idle counts from the last op's end, while none is in
			// flight.
			mu.Lock()
			at := lastDone.Add(idle)
			if inFlight > 0 {
				at = time.Now().Add(idle)
			}
			mu.Unlock()
			uc.SetReadDeadline(at)
		}
		n, oobn, flags, _, err := uc.ReadMsgUnix(one, oob)
		if err != nil && !leaving && errors.Is(err, os.ErrDeadlineExceeded) {
			mu.Lock()
			quiet := inFlight == 0 && time.Since(lastDone) >= idle
			mu.Unlock()
			if quiet {
				// What the fast guest sent before it sees this is
				// still read, up to its close.
				leaving = true
				uc.SetReadDeadline(time.Time{})
				uc.CloseWrite()
			}
			continue
		}
		fds := rights(oob[:oobn])
		if err != nil || n == 0 {
			closeAll(fds)
			return
		}
		if len(fds) != 2 || flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
			s.log.Warn("helper: a message without a connection and a request", "descriptors", len(fds))
			closeAll(fds)
			continue
		}
		conn, payload, err := takeOp(fds[0], fds[1])
		if err != nil {
			s.log.Warn("helper: taking an op", "err", err)
			continue
		}
		mu.Lock()
		inFlight++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			wire.SetSendBuffer(conn)
			// No op of the helper's leaves the connection for reuse.
			s.serveConn(newOpConn(conn), payload)
			conn.Close()
			mu.Lock()
			inFlight--
			lastDone = time.Now()
			mu.Unlock()
		}()
	}
}

// rights returns the descriptors an SCM_RIGHTS message carried.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// takeOp takes an op's connection and reads its request's payload from
// the memfd; it closes both descriptors on error.
func takeOp(connFD, reqFD int) (net.Conn, []byte, error) {
	req := os.NewFile(uintptr(reqFD), "request")
	defer req.Close()
	cf := os.NewFile(uintptr(connFD), "conn")
	conn, err := net.FileConn(cf)
	cf.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("the op's connection: %w", err)
	}
	st, err := req.Stat()
	if err == nil && (!st.Mode().IsRegular() || st.Size() > wire.MaxPayload) {
		err = fmt.Errorf("a request of %d bytes (%v)", st.Size(), st.Mode())
	}
	var payload []byte
	if err == nil {
		payload = make([]byte, st.Size())
		_, err = req.ReadAt(payload, 0)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("the op's request: %w", err)
	}
	return conn, payload, nil
}
