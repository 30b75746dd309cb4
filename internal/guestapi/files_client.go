package guestapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
)

// The daemon's side of the file ops: each helper makes one call and
// turns its stream into an io.Reader, an io.Writer's source, or a
// sequence of values. Nothing is buffered beyond one frame.

// FileChunkSize is the payload of the data frames a file op sends: big
// enough that framing costs nothing, far below wire.MaxPayload.
const FileChunkSize = 1 << 20

// fileChunks recycles the data buffers of the uploads.
var fileChunks = sync.Pool{New: func() any { b := make([]byte, FileChunkSize); return &b }}

// ErrStreamCut is the error of a file stream whose guest connection broke
// before the End frame (the sandbox ended, most likely).
var ErrStreamCut = errors.New("lost the connection to the sandbox")

// fileEndError turns the error of an End frame back into a category.
func fileEndError(e *api.Error) error {
	if e == nil {
		return nil
	}
	cat := errdefs.FromCode(e.Code)
	if cat == nil {
		return fmt.Errorf("guest: %s", e.Message)
	}
	return fmt.Errorf("%w: %s", cat, stripCategory(e.Message, cat))
}

func readFileEnd(payload []byte) (FileEnd, error) {
	var e FileEnd
	if err := json.Unmarshal(payload, &e); err != nil {
		return e, fmt.Errorf("decoding end frame: %w", err)
	}
	return e, fileEndError(e.Error)
}

// fileDo makes a file op that has no stream.
func (c *Client) fileDo(ctx context.Context, op string, fr *FileRequest) (*FileResponse, error) {
	resp, err := c.do(ctx, Request{Op: op, File: fr})
	if err != nil {
		return nil, err
	}
	if resp.File == nil {
		resp.File = &FileResponse{}
	}
	return resp.File, nil
}

// fileInfo makes a file op that answers with a file's description.
func (c *Client) fileInfo(ctx context.Context, op string, fr *FileRequest) (*api.FileInfo, error) {
	resp, err := c.fileDo(ctx, op, fr)
	if err != nil {
		return nil, err
	}
	return resp.Info, nil
}

// Stat describes fr.Path (not following a symbolic link there).
func (c *Client) Stat(ctx context.Context, fr FileRequest) (*api.FileInfo, error) {
	return c.fileInfo(ctx, OpFileStat, &fr)
}

// Mkdir makes directory fr.Path (fr.Mode, fr.Owner; with fr.Parents its
// missing parents too, and an existing directory is fine) and describes
// it.
func (c *Client) Mkdir(ctx context.Context, fr FileRequest) (*api.FileInfo, error) {
	return c.fileInfo(ctx, OpFileMkdir, &fr)
}

// Move renames fr.Path to fr.To (replacing it with fr.Overwrite) and
// describes the result.
func (c *Client) Move(ctx context.Context, fr FileRequest) (*api.FileInfo, error) {
	return c.fileInfo(ctx, OpFileMove, &fr)
}

// Remove removes fr.Path; a directory with its contents when
// fr.Recursive.
func (c *Client) Remove(ctx context.Context, fr FileRequest) error {
	_, err := c.fileDo(ctx, OpFileRemove, &fr)
	return err
}

// DataStream is the data of a read or a tar download: Read returns
// io.EOF after a clean End frame and the guest's error after a failed
// one; WriteTo writes the data to w frame by frame.
type DataStream struct {
	DataFrames
	conn *Conn
	stop func() bool
	end  *FileEnd
	once sync.Once
}

// ReadFile starts reading fr.Path (fr.Length bytes from fr.Offset, or to
// its end) and returns the guest's answer (the file's description, how
// many bytes come) and the data.
func (c *Client) ReadFile(ctx context.Context, fr FileRequest) (*FileResponse, *DataStream, error) {
	return c.fileRead(ctx, OpFileRead, &fr)
}

// TarGet starts a tar download of fr.Path, a file or a directory tree.
func (c *Client) TarGet(ctx context.Context, fr FileRequest) (*DataStream, error) {
	_, ds, err := c.fileRead(ctx, OpFileTarGet, &fr)
	return ds, err
}

// fileRead starts an op whose answer is followed by a data stream.
func (c *Client) fileRead(ctx context.Context, op string, fr *FileRequest) (*FileResponse, *DataStream, error) {
	resp, conn, err := c.request(ctx, Request{Op: op, File: fr})
	if err != nil {
		return nil, nil, err
	}
	if resp.File == nil {
		resp.File = &FileResponse{}
	}
	d := &DataStream{conn: conn}
	d.DataFrames = NewDataFrames(d.nextData)
	d.stop = context.AfterFunc(ctx, func() { conn.Conn.Close() })
	return resp.File, d, nil
}

func (d *DataStream) nextData() ([]byte, error) {
	f, err := d.conn.Frames.Read()
	if err != nil {
		return nil, ErrStreamCut
	}
	switch f.Type {
	case wire.Data:
		return f.Payload, nil
	case wire.End:
		e, err := readFileEnd(f.Payload)
		d.end = &e
		if err == nil {
			err = io.EOF
		}
		return nil, err
	}
	return nil, fmt.Errorf("guest sent frame type %d in a data stream", f.Type)
}

// End returns the End frame once Read has returned io.EOF or the guest's
// error.
func (d *DataStream) End() *FileEnd { return d.end }

// Close ends the stream (the guest stops at its next write) and recycles
// its buffer. It must not run while a Read is in progress; Abort may.
func (d *DataStream) Close() error {
	d.once.Do(func() {
		d.stop()
		d.conn.Close()
	})
	return nil
}

// Abort cuts the stream's connection, from any goroutine: a Read in
// progress returns. Close must still be called.
func (d *DataStream) Abort() { d.conn.Conn.Close() }

// SourceError is the error of a write whose source failed: the client's
// upload broke, not the guest.
type SourceError struct{ Err error }

func (e *SourceError) Error() string { return "reading the data to write: " + e.Err.Error() }
func (e *SourceError) Unwrap() error { return e.Err }

// WriteFile replaces fr.Path (fr.Mode, fr.Owner) with src's bytes and
// returns the guest's End frame (Info describes the file written). An
// error before any data is sent (the target is a directory, the owner is
// unknown) comes back without src having been read. A failure to read
// src is a *SourceError; the guest then drops what it received and the
// file is as it was.
func (c *Client) WriteFile(ctx context.Context, fr FileRequest, src io.Reader) (*FileEnd, error) {
	return c.fileWrite(ctx, OpFileWrite, &fr, src)
}

// TarPut extracts src, a tar stream, into directory fr.Path (made with
// its parents if missing; entries owned by fr.Owner if set) and returns
// the guest's End frame (Entries, Bytes). Errors come as WriteFile's do.
func (c *Client) TarPut(ctx context.Context, fr FileRequest, src io.Reader) (*FileEnd, error) {
	return c.fileWrite(ctx, OpFileTarPut, &fr, src)
}

// fileWrite makes an op that streams src's bytes to the guest.
func (c *Client) fileWrite(ctx context.Context, op string, fr *FileRequest, src io.Reader) (*FileEnd, error) {
	_, conn, err := c.request(ctx, Request{Op: op, File: fr})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Conn.Close() })
	defer stop()
	bp := fileChunks.Get().(*[]byte)
	defer fileChunks.Put(bp)
	buf := *bp
	var sent int64
	for {
		n, rerr := fill(src, buf)
		if n > 0 {
			if err := conn.Send(wire.Data, buf[:n]); err != nil {
				// The guest gave up (and said why) or went away.
				return readGuestEnd(ctx, conn)
			}
			sent += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// No End frame: the guest drops what it has.
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &SourceError{Err: rerr}
		}
	}
	b, _ := json.Marshal(FileEnd{Bytes: sent})
	if err := conn.Send(wire.End, b); err != nil {
		return readGuestEnd(ctx, conn)
	}
	return readGuestEnd(ctx, conn)
}

// fill reads into buf until it is full or src fails; only a clean io.EOF
// ends the data (io.ReadFull would turn a source's own
// io.ErrUnexpectedEOF, a cut request body, into a normal end).
func fill(src io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := src.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// readGuestEnd reads the guest's End frame, skipping nothing else.
func readGuestEnd(ctx context.Context, conn *Conn) (*FileEnd, error) {
	f, err := conn.Frames.Read()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, ErrStreamCut
	}
	if f.Type != wire.End {
		return nil, fmt.Errorf("guest sent frame type %d instead of the end of a write", f.Type)
	}
	e, err := readFileEnd(f.Payload)
	return &e, err
}

// ListStream is the entries of a list, in batches.
type ListStream struct{ ds *DataStream }

// ListDir starts listing directory fr.Path (fr.Depth levels); its
// entries come in batches from Next.
func (c *Client) ListDir(ctx context.Context, fr FileRequest) (*ListStream, error) {
	_, ds, err := c.fileRead(ctx, OpFileList, &fr)
	if err != nil {
		return nil, err
	}
	return &ListStream{ds: ds}, nil
}

// Next returns the next batch of entries, or io.EOF after the last.
func (l *ListStream) Next() ([]api.FileInfo, error) {
	f, err := l.ds.conn.Frames.Read()
	if err != nil {
		return nil, ErrStreamCut
	}
	switch f.Type {
	case wire.Event:
		var batch []api.FileInfo
		if err := json.Unmarshal(f.Payload, &batch); err != nil {
			return nil, fmt.Errorf("decoding list entries: %w", err)
		}
		return batch, nil
	case wire.End:
		if _, err := readFileEnd(f.Payload); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
	return nil, fmt.Errorf("guest sent frame type %d in a list", f.Type)
}

// Close ends the list; not while Next runs (see DataStream.Close).
func (l *ListStream) Close() error { return l.ds.Close() }

// Abort cuts the list's connection, from any goroutine.
func (l *ListStream) Abort() { l.ds.Abort() }

// EventStream is the events of a watch.
type EventStream struct{ ds *DataStream }

// Watch starts watching directory fr.Path (its subdirectories too with
// fr.Recursive); the watch is in place when Watch returns.
func (c *Client) Watch(ctx context.Context, fr FileRequest) (*EventStream, error) {
	_, ds, err := c.fileRead(ctx, OpFileWatch, &fr)
	if err != nil {
		return nil, err
	}
	return &EventStream{ds: ds}, nil
}

// WatchEnded is returned by EventStream.Next when the guest ended the
// watch (the directory was removed).
type WatchEnded struct{ Reason string }

func (e *WatchEnded) Error() string { return "watch ended: " + e.Reason }

// Next returns the next event. It returns a *WatchEnded when the guest
// ends the watch and ErrStreamCut when the connection breaks.
func (e *EventStream) Next() (api.FileEvent, error) {
	f, err := e.ds.conn.Frames.Read()
	if err != nil {
		return api.FileEvent{}, ErrStreamCut
	}
	switch f.Type {
	case wire.Event:
		var ev api.FileEvent
		if err := json.Unmarshal(f.Payload, &ev); err != nil {
			return ev, fmt.Errorf("decoding watch event: %w", err)
		}
		return ev, nil
	case wire.End:
		end, err := readFileEnd(f.Payload)
		if err != nil {
			return api.FileEvent{}, err
		}
		return api.FileEvent{}, &WatchEnded{Reason: end.Reason}
	}
	return api.FileEvent{}, fmt.Errorf("guest sent frame type %d in a watch", f.Type)
}

// Close ends the watch; not while Next runs (see DataStream.Close).
func (e *EventStream) Close() error { return e.ds.Close() }

// Abort ends the watch from any goroutine: Next returns ErrStreamCut.
func (e *EventStream) Abort() { e.ds.Abort() }
