package api

import "time"

// EgressRequest is a sandbox's request for a host its policy refuses:
// made from inside (POST http://paddock.internal/v1/requests), or by
// the daemon on a refusal when the policy's mode is "ask". A person
// approves or denies it; an approval adds Host to the sandbox's policy
// as a grant (Policy.Grants), for a time, once, or for the sandbox's
// life.
type EgressRequest struct {
	// ID is SANDBOX.N, N counting the sandbox's requests from 1.
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	// Host is what an approval allows: a name or an address, with an
	// optional :PORT (as an allow rule: a name alone allows every port).
	Host string `json:"host"`
	// Reason is the sandbox's own words (untrusted).
	Reason string `json:"reason,omitempty"`
	// Auto: made by the daemon on a refusal (policy mode "ask").
	Auto    bool      `json:"auto,omitempty"`
	State   string    `json:"state"`
	Created time.Time `json:"created"`
	// Decided, DecidedBy and Note are set by the decision. DecidedBy
	// names the client (as it called itself) and the credential it
	// used: "cli (unix socket)", "console (token 3f2a91c0)".
	Decided   *time.Time `json:"decided,omitempty"`
	DecidedBy string     `json:"decided_by,omitempty"`
	Note      string     `json:"note,omitempty"`
	// Until ends an approval (none: the sandbox's life). Once: the
	// approval allows one connection or request (and what follows it
	// within seconds: a proxied client's CONNECT is decided twice);
	// Used is when that happened.
	Until *time.Time `json:"until,omitempty"`
	Once  bool       `json:"once,omitempty"`
	Used  *time.Time `json:"used,omitempty"`
}

// The states of an EgressRequest.
const (
	RequestPending  = "pending"
	RequestApproved = "approved"
	RequestDenied   = "denied"
	// RequestExpired is an approval whose time is up (or whose one use
	// is spent).
	RequestExpired = "expired"
)

// RequestAsk is what a sandbox sends to ask for a host.
type RequestAsk struct {
	Host   string `json:"host"`
	Reason string `json:"reason,omitempty"`
}

// RequestDecision is the body of an approval or a denial. An approval
// with neither DurationSeconds nor Once lasts the sandbox's life.
type RequestDecision struct {
	DurationSeconds int64  `json:"duration_seconds,omitempty"`
	Once            bool   `json:"once,omitempty"`
	Note            string `json:"note,omitempty"`
}

// PolicyGrant is an approved EgressRequest as the policy carries it:
// an allow rule with an end. The daemon sets grants; a policy given to
// the API may not hold any.
type PolicyGrant struct {
	Request string     `json:"request"`
	Match   string     `json:"match"`
	Until   *time.Time `json:"until,omitempty"`
	Once    bool       `json:"once,omitempty"`
}
