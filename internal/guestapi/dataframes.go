package guestapi

import "io"

// DataFrames is the data of a file stream's Data frames as an io.Reader,
// and an io.WriterTo that hands each payload on without a copy. The
// guest's side and the daemon's side each read their own end of the
// stream.
type DataFrames struct {
	next    func() ([]byte, error)
	pending []byte
	err     error
}

// NewDataFrames reads data with next, which reads the stream's next frame
// and returns its data, or the error that ends the stream (io.EOF for a
// clean End).
func NewDataFrames(next func() ([]byte, error)) DataFrames {
	return DataFrames{next: next}
}

func (d *DataFrames) fill() error {
	for len(d.pending) == 0 {
		if d.err != nil {
			return d.err
		}
		d.pending, d.err = d.next()
	}
	return nil
}

// Read reads the data; it returns io.EOF after a clean End frame and the
// stream's error after a failed one.
func (d *DataFrames) Read(p []byte) (int, error) {
	if err := d.fill(); err != nil {
		return 0, err
	}
	n := copy(p, d.pending)
	d.pending = d.pending[n:]
	return n, nil
}

// WriteTo writes the data to w frame by frame.
func (d *DataFrames) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if err := d.fill(); err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
		n, err := w.Write(d.pending)
		total += int64(n)
		d.pending = d.pending[n:]
		if err != nil {
			return total, err
		}
	}
}
