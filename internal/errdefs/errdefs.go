// Package errdefs owns paddock's error categories. Every layer wraps one of
// these sentinels with context (fmt.Errorf("starting guest: %w", err)); the
// HTTP status of a category is chosen in exactly one place (HTTPStatus).
package errdefs

import (
	"errors"
	"fmt"
	"syscall"
)

var (
	// ErrNotFound: the named thing does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid: the request is malformed or names a bad value.
	ErrInvalid = errors.New("invalid argument")
	// ErrConflict: the thing exists but is in the wrong state for the call.
	ErrConflict = errors.New("conflict")
	// ErrDenied: the caller is not allowed to do this.
	ErrDenied = errors.New("permission denied")
	// ErrUnavailable: the host lacks the capacity or feature right now.
	ErrUnavailable = errors.New("unavailable")
	// ErrTooLarge: a request body or value exceeds a limit.
	ErrTooLarge = errors.New("too large")
	// ErrTooMany: the caller holds as many of a thing as it may (pending
	// egress requests of a sandbox).
	ErrTooMany = errors.New("too many")
	// ErrNoSpace: the disk that was to hold the result is full. A wrapped
	// ENOSPC counts as this category too.
	ErrNoSpace = errors.New("no space left")
)

// Invalid returns an ErrInvalid naming the offending field.
func Invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// NotFound returns an ErrNotFound for a kind of thing and its id.
func NotFound(kind, id string) error {
	return fmt.Errorf("%w: %s %q", ErrNotFound, kind, id)
}

// Conflict returns an ErrConflict with a message.
func Conflict(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConflict, fmt.Sprintf(format, args...))
}

// Code names the category of err for the wire ("not_found", ...), or
// "internal" when err carries none.
func Code(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrInvalid):
		return "invalid_argument"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrDenied):
		return "permission_denied"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrTooMany):
		return "too_many"
	case IsNoSpace(err):
		return "no_space"
	}
	return "internal"
}

// FromCode is the inverse of Code, used by clients to rebuild a category
// from an error body.
func FromCode(code string) error {
	switch code {
	case "not_found":
		return ErrNotFound
	case "invalid_argument":
		return ErrInvalid
	case "conflict":
		return ErrConflict
	case "permission_denied", "unauthenticated":
		return ErrDenied
	case "unavailable":
		return ErrUnavailable
	case "too_large":
		return ErrTooLarge
	case "too_many":
		return ErrTooMany
	case "no_space":
		return ErrNoSpace
	}
	return nil
}

// IsNoSpace reports whether err is ErrNoSpace or wraps ENOSPC.
func IsNoSpace(err error) bool {
	return errors.Is(err, ErrNoSpace) || errors.Is(err, syscall.ENOSPC)
}

// categorized is an error in a category whose message does not repeat the
// category's name.
type categorized struct {
	cat error
	msg string
}

func (e *categorized) Error() string        { return e.msg }
func (e *categorized) Is(target error) bool { return target == e.cat }

// New returns an error in category cat (errors.Is(err, cat)) with exactly
// the given message.
func New(cat error, format string, args ...any) error {
	return &categorized{cat: cat, msg: fmt.Sprintf(format, args...)}
}

// HTTPStatus maps an error's category to an HTTP status. It is the only
// place where that mapping is made: the daemon's answers and the error
// frames of lanes a guest serves both take it. The codes are written out,
// not net/http's constants: the guest links this package, and net/http
// would double its binary.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return 404 // Not Found
	case errors.Is(err, ErrInvalid):
		return 400 // Bad Request
	case errors.Is(err, ErrConflict):
		return 409 // Conflict
	case errors.Is(err, ErrDenied):
		return 403 // Forbidden
	case errors.Is(err, ErrTooLarge):
		return 413 // Content Too Large
	case errors.Is(err, ErrTooMany):
		return 429 // Too Many Requests
	case errors.Is(err, ErrUnavailable):
		return 503 // Service Unavailable
	case IsNoSpace(err):
		return 507 // Insufficient Storage
	}
	return 500 // Internal Server Error
}

// MovedError is the error of a call for a sandbox that another node of
// the cluster took in from the archive: ErrNotFound here, with the node
// that holds it now, which the daemon's answer names in MovedHeader for
// a gateway to follow.
type MovedError struct {
	ID, Node string
}

// MovedHeader carries MovedError.Node on the answer.
const MovedHeader = "Paddock-Moved-To"

func (e *MovedError) Error() string {
	return fmt.Sprintf("sandbox %s was resumed on node %s and is served there", e.ID, e.Node)
}

func (e *MovedError) Is(target error) bool { return target == ErrNotFound }
