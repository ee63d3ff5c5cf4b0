package coproc

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test them with errors.Is; each maps to one stable code at
// the API edge (tableserver maps them to API error codes).
var (
	// ErrInvalidModule: the bytes are not a valid ABI v1 module (not wasm,
	// missing exports, bad signatures, a command instead of a reactor...).
	ErrInvalidModule = errors.New("coproc: invalid module")
	// ErrImportNotAllowed: the module imports a function the host does not
	// grant (anything outside the tabula module and the allowed WASI calls).
	ErrImportNotAllowed = errors.New("coproc: import not allowed")
	// ErrModuleTooLarge: the module is over Options.MaxModuleBytes.
	ErrModuleTooLarge = errors.New("coproc: module too large")
	// ErrModuleNotFound: no module is compiled under the key.
	ErrModuleNotFound = errors.New("coproc: module not found")
	// ErrDigestMismatch: Compile was given other bytes for a key already
	// compiled (a version's content never changes).
	ErrDigestMismatch = errors.New("coproc: module version already compiled with other content")
	// ErrUnknownMethod: the module exports no such method (or merge).
	ErrUnknownMethod = errors.New("coproc: unknown method")
	// ErrInputTooLarge: the call's input is over Options.MaxInputBytes.
	ErrInputTooLarge = errors.New("coproc: input too large")
	// ErrReservedKey: a call's target key starts with abi.ReservedPrefix,
	// the platform's own key space.
	ErrReservedKey = errors.New("coproc: reserved key")
	// ErrOutputTooLarge: the guest emitted more than Options.MaxOutputBytes.
	ErrOutputTooLarge = errors.New("coproc: output too large")
	// ErrWritesTooLarge: the guest staged more than Options.MaxWriteBytes or
	// Options.MaxWrites.
	ErrWritesTooLarge = errors.New("coproc: staged writes too large")
	// ErrBusy: every instance of the module is in use and the wait queue is
	// full; retry later (maps to ServerBusy).
	ErrBusy = errors.New("coproc: module busy")
	// ErrDeadline: the call ran past its deadline and was stopped.
	ErrDeadline = errors.New("coproc: call deadline exceeded")
	// ErrMemoryLimit: the guest ran out of its memory cap.
	ErrMemoryLimit = errors.New("coproc: guest memory limit exceeded")
	// ErrTrap: the guest trapped (unreachable, out-of-bounds access, a Go
	// panic that exited the module...).
	ErrTrap = errors.New("coproc: guest trapped")
	// ErrGuestFault: the guest passed a host function an invalid pointer,
	// length or encoding.
	ErrGuestFault = errors.New("coproc: guest passed invalid arguments to the host")
	// ErrGuestFailed: the handler returned a non-zero status. The error is a
	// *GuestError with the status and the guest's set_error message.
	ErrGuestFailed = errors.New("coproc: guest returned an error")
	// ErrReadOnly: the partition may not be written here (not the primary).
	ErrReadOnly = errors.New("coproc: partition is read-only here")
	// ErrConflict: a key the call read changed before its writes committed
	// (returned by Partition.Commit; Call retries, then returns it).
	ErrConflict = errors.New("coproc: write conflict")
	// ErrTokenReused: an idempotency token was reused for another module,
	// method, or input (keys and range included).
	ErrTokenReused = errors.New("coproc: idempotency token reused for another call")
	// ErrTokenTooLong: an idempotency token or request id is longer than
	// MaxTokenBytes.
	ErrTokenTooLong = errors.New("coproc: idempotency token too long")
	// ErrClosed: the runtime is closed.
	ErrClosed = errors.New("coproc: runtime closed")
)

// GuestError is a handler's non-zero return. Is(ErrGuestFailed) holds.
type GuestError struct {
	Status  int32
	Message string
}

func (e *GuestError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("coproc: guest returned status %d", e.Status)
	}
	return fmt.Sprintf("coproc: guest returned status %d: %s", e.Status, e.Message)
}

// Is makes errors.Is(err, ErrGuestFailed) hold.
func (e *GuestError) Is(target error) bool { return target == ErrGuestFailed }
