// Package egresswire is what the egress benchmark's client (run in a
// sandbox and in a plain network namespace) reports to the harness: one
// JSON object on its stdout.
package egresswire

// Result is one run of the client. Durations are in nanoseconds.
type Result struct {
	// Samples: latency mode, one per GET; rate mode, one per successful
	// request, from its due time (so that falling behind shows).
	Samples []int64 `json:"samples,omitempty"`
	// Latency mode, per GET: TCP connect (from the start), TLS handshake
	// (from connected) and first response byte (from the request written).
	ConnectNS   []int64 `json:"connect_ns,omitempty"`
	HandshakeNS []int64 `json:"handshake_ns,omitempty"`
	FirstByteNS []int64 `json:"first_byte_ns,omitempty"`
	// Bytes and Nanos: download mode, one per download.
	Bytes []int64 `json:"bytes,omitempty"`
	Nanos []int64 `json:"nanos,omitempty"`
	// Rate mode: requests that succeeded and failed, the time from the
	// first due time to the last answer, and the first few errors.
	Done      int64    `json:"done,omitempty"`
	Errors    int64    `json:"errors,omitempty"`
	ElapsedNS int64    `json:"elapsed_ns,omitempty"`
	FirstErrs []string `json:"first_errors,omitempty"`
	// Issuer is the common name of the issuer of the server certificate
	// the client saw (the upstream's CA when spliced, the sandbox's when
	// intercepted).
	Issuer string `json:"issuer,omitempty"`
	// CPUNS is the client's own CPU time (user and system) over the run.
	CPUNS int64 `json:"cpu_ns,omitempty"`
}

// Achieved is a rate run's successful requests per second.
func (r *Result) Achieved() float64 {
	if r.ElapsedNS <= 0 {
		return 0
	}
	return float64(r.Done) / (float64(r.ElapsedNS) / 1e9)
}
