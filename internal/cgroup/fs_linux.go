package cgroup

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The control-file helpers below use raw syscalls rather than os.File: a
// cgroup write is open+write+close and nothing more, which matters on the
// Create path. Errors are *os.PathError, so errors.Is(err, unix.EBUSY) works.

// writeFile writes value to the control file at path in one write(2), which
// is how cgroupfs expects it.
func writeFile(path, value string) error {
	fd, err := openFile(path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	for {
		_, err = unix.Write(fd, []byte(value))
		if err != unix.EINTR {
			break
		}
	}
	unix.Close(fd)
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// readFile reads a small control file.
func readFile(path string) ([]byte, error) {
	fd, err := openFile(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

func openFile(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

func readInt(path string) (int64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	return parseInt(b)
}

func readLimit(path string) (int64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	return parseLimit(b)
}

// readKeyed reads "key N" from a flat keyed file; a missing key reads as 0.
func readKeyed(path, key string) (uint64, error) {
	b, err := readFile(path)
	if err != nil {
		return 0, err
	}
	n, _, err := keyedUint(b, key)
	return n, err
}

func exists(path string) bool {
	return unix.Access(path, unix.F_OK) == nil
}

// readProcs appends the pids in dir's cgroup.procs and in those of every
// group below dir. A dir that has gone away reads as empty.
func readProcs(dir string, pids []int) ([]int, error) {
	b, err := readFile(dir + "/cgroup.procs")
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return pids, nil
		}
		return pids, err
	}
	for len(b) > 0 {
		var line []byte
		line, b = cutLine(b)
		if len(line) == 0 {
			continue
		}
		pid, err := strconv.Atoi(string(line))
		if err != nil {
			return pids, &os.PathError{Op: "parse", Path: dir + "/cgroup.procs", Err: err}
		}
		pids = append(pids, pid)
	}
	if !hasSubdirs(dir) {
		return pids, nil
	}
	subs, err := subdirs(dir)
	if err != nil {
		return pids, err
	}
	for _, s := range subs {
		if pids, err = readProcs(dir+"/"+s, pids); err != nil {
			return pids, err
		}
	}
	return pids, nil
}

func cutLine(b []byte) (line, rest []byte) {
	for i, c := range b {
		if c == '\n' {
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

// hasSubdirs reports whether dir may have child groups: a cgroupfs
// directory's link count is 2 and one per child (kernfs), so a stat
// answers what a listing of its thirty-odd files would, without the
// listing's allocations (most of a removed sandbox's Kill under churn).
// When the count cannot be read it says yes, and the caller lists.
func hasSubdirs(dir string) bool {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return !errors.Is(err, unix.ENOENT)
	}
	return st.Nlink != 2
}

// subdirs lists the child groups of dir; a dir that has gone away has none.
func subdirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// removeTree removes the group at dir and any groups below it. cgroupfs
// refuses rmdir of a group with children (EBUSY), so the children go first,
// but only when the cheap single rmdir fails. A missing dir is not an error.
func removeTree(dir string) error {
	err := unix.Rmdir(dir)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EBUSY {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	subs, serr := subdirs(dir)
	if serr != nil || len(subs) == 0 {
		// Busy with processes, not children.
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	for _, s := range subs {
		if err := removeTree(dir + "/" + s); err != nil {
			return err
		}
	}
	if err := unix.Rmdir(dir); err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "rmdir", Path: dir, Err: err}
	}
	return nil
}

// poll calls try until it reports done or fails, sleeping with exponential
// backoff from 100µs up to 10ms in between, and gives up when ctx ends,
// returning ctx's error.
func poll(ctx context.Context, try func() (done bool, err error)) error {
	const (
		first = 100 * time.Microsecond
		most  = 10 * time.Millisecond
	)
	var t *time.Timer
	for wait := first; ; wait = min(2*wait, most) {
		done, err := try()
		if done || err != nil {
			return err
		}
		if t == nil {
			t = time.NewTimer(wait)
			defer t.Stop()
		} else {
			t.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
