package guestapi

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// The sync socket (SOCK_SEQPACKET) carries one message per packet: Config
// from the daemon, with the descriptors it indexes (SCM_RIGHTS), and
// Ready (JSON) from the guest after each. A Config packet is the length
// of its JSON (4 bytes, little-endian), the JSON, then Prepare.Seccomp's
// raw bytes (the rest of the packet).

// Phases a Ready reports.
const (
	PhasePrepared = "prepared"
	PhaseReady    = "ready"
)

// readyBufs hold a packet that ReadReady reads: a packet must be read
// whole, and a fresh 64 KiB per read was a third of what the daemon
// allocated under churn (issue 21).
var readyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// SendConfig sends cfg and the descriptors its Mount.FD fields index.
func SendConfig(sock *os.File, cfg *Config, fds []int) error {
	b, err := encodeConfig(cfg)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(int(sock.Fd()), b, oob, nil, 0); err != nil {
		return fmt.Errorf("sending guest config: %w", err)
	}
	return nil
}

// ReceiveConfig reads the next Config and its descriptors (close-on-exec).
func ReceiveConfig(sock *os.File) (*Config, []int, error) {
	buf := make([]byte, 1<<20)
	// SCM_MAX_FD (253): an image may have many layers, each its own fd.
	oob := make([]byte, unix.CmsgSpace(253*4))
	n, oobn, flags, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("receiving config: %w", err)
	}
	if n == 0 {
		return nil, nil, errors.New("daemon closed the sync socket")
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, fmt.Errorf("parsing config fds: %w", err)
	}
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, nil, fmt.Errorf("parsing config fds: %w", err)
		}
		fds = append(fds, f...)
	}
	cfg, err := decodeConfig(buf[:n])
	if err == nil && flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		// The filter is the packet's tail: a cut one must not load.
		cfg, err = nil, errors.New("receiving config: packet or descriptors truncated")
	}
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	return cfg, fds, nil
}

// encodeConfig frames cfg as a Config packet.
func encodeConfig(cfg *Config) ([]byte, error) {
	var filter []byte
	if cfg.Prepare != nil {
		filter = cfg.Prepare.Seccomp
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if uint64(len(js)) > math.MaxUint32 {
		return nil, errors.New("guest config too large")
	}
	b := make([]byte, 4, 4+len(js)+len(filter))
	binary.LittleEndian.PutUint32(b, uint32(len(js)))
	return append(append(b, js...), filter...), nil
}

// decodeConfig reads a Config packet.
func decodeConfig(b []byte) (*Config, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("decoding config: %d-byte packet", len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, fmt.Errorf("decoding config: JSON of %d bytes in a %d-byte packet", n, len(b))
	}
	var cfg Config
	if err := json.Unmarshal(b[4:4+n], &cfg); err != nil {
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	if filter := b[4+n:]; len(filter) > 0 {
		if cfg.Prepare == nil {
			return nil, errors.New("decoding config: a seccomp filter without Prepare")
		}
		// Its own copy: the packet's buffer is large and goes.
		cfg.Prepare.Seccomp = append([]byte(nil), filter...)
	}
	return &cfg, nil
}

// SendReady answers a Config.
func SendReady(sock *os.File, rd Ready) error {
	b, _ := json.Marshal(rd)
	_, err := sock.Write(b)
	return err
}

// ReadReady reads the guest's answer to a Config; a Ready that carries
// an error is returned as that error.
func ReadReady(sock *os.File) (Ready, error) {
	var rd Ready
	bp := readyBufs.Get().(*[]byte)
	defer readyBufs.Put(bp)
	buf := *bp
	n, err := sock.Read(buf)
	if err != nil || n == 0 {
		return rd, errors.New("guest exited before it was ready")
	}
	if err := json.Unmarshal(buf[:n], &rd); err != nil {
		return rd, fmt.Errorf("decoding guest ready: %w", err)
	}
	if rd.Error != "" {
		if cat := errdefs.FromCode(rd.Code); cat != nil {
			return rd, errdefs.New(cat, "%s", rd.Error)
		}
		return rd, errors.New(rd.Error)
	}
	return rd, nil
}

// FailReady is the Ready that reports err, with its category when it
// has one.
func FailReady(err error) Ready {
	rd := Ready{Error: err.Error()}
	if code := errdefs.Code(err); code != "internal" {
		rd.Code = code
	}
	return rd
}

// WaitReady waits for the guest's answer to a Config: a Ready, its
// error, or the guest's end (done closed), the context's or 30 s,
// whichever comes first.
func WaitReady(ctx context.Context, sock *os.File, done <-chan struct{}) (*Ready, error) {
	type result struct {
		r   Ready
		err error
	}
	ch := make(chan result, 1)
	go func() {
		rd, err := ReadReady(sock)
		ch <- result{r: rd, err: err}
	}()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case res := <-ch:
		return &res.r, res.err
	case <-done:
		// What the guest said before it ended, if it said anything.
		select {
		case res := <-ch:
			return &res.r, res.err
		case <-time.After(100 * time.Millisecond):
		}
		return nil, errors.New("guest exited before it was ready")
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, errors.New("guest not ready after 30s")
	}
}

// LogTail is the end of a guest's log, for an error that says why it
// did not come up: " (guest log: ...)", or "" if it wrote nothing.
func LogTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return " (guest log: " + strings.TrimSpace(string(b)) + ")"
}
