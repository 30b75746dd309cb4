// Package jsonl owns the telemetry stores' append-only files of JSON
// lines: one write per line, and a torn last line (a crash mid-write) cut
// off when the file is read back.
package jsonl

import (
	"bytes"
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Append writes line, which ends in a newline, to the end of path in one
// write(2), making the file if it is missing. The file is not kept open:
// a daemon with thousands of sandboxes would otherwise hold as many fds.
func Append(path string, line []byte) error {
	fd, err := Open(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return Write(fd, path, line)
}

// Open opens path for appending, making it if it is missing.
func Open(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// Write writes line to fd, opened by Open on path, in one write(2).
func Write(fd int, path string, line []byte) error {
	for len(line) > 0 {
		n, err := unix.Write(fd, line)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "write", Path: path, Err: err}
		}
		line = line[n:]
	}
	return nil
}

// ReadWhole returns the whole lines of the file at path. A torn last line
// is left out and, if repair, cut off the file, so that the next Append
// starts a line of its own. A missing file is empty.
func ReadWhole(path string, repair bool) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	whole := bytes.LastIndexByte(data, '\n') + 1
	if repair && whole < len(data) {
		if err := os.Truncate(path, int64(whole)); err != nil {
			return nil, err
		}
	}
	return data[:whole], nil
}
